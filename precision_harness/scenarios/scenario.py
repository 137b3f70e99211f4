"""Scenario: one short PPO/GRPO run described by a YAML file under ``scenarios/``, and its three kinds.

Keys reuse verl's ``ppo_trainer.yaml`` names so settings move between a scenario and a verl run.
The file is validated with ``schemas/scenario.schema.json`` (unknown keys are errors) and merged
over its kind's defaults (:mod:`.defaults`, :mod:`.command_scenario`); loading is
:mod:`.loading`, the cross-field checks :mod:`.validation`, what every kind says once loaded
:class:`~precision_harness.scenarios.base.ScenarioBase`. A scenario describes a run: how each kind
runs is :mod:`precision_harness.runs.kind_runners`. This module imports neither torch nor pytest.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from precision_harness.errors import ScenarioError
from precision_harness.scenarios import command_scenario, fresh_steps, loading, validation
from precision_harness.scenarios.base import ScenarioBase
from precision_harness.scenarios.defaults import DEFAULTS, uses_critic
from precision_harness.scenarios.identity import flat_command
from precision_harness.scenarios.profiling import ROLLOUT_COMPUTE_LOG_PROB, ROLLOUT_GENERATE, STAGES
from precision_harness.scenarios.settings import (
    NUMERIC_SETTINGS,
    canonical_json,
    numeric_settings,
    scenario_hash,
    structural_settings,
)


class Scenario(ScenarioBase):
    """A loaded, validated scenario with defaults resolved: one of three kinds, each its own class.

    :class:`BuiltinScenario` (our PPO loop), :class:`CommandScenario` (any process that writes
    verl's dump layout) and :class:`VerlScenario` (verl's own trainer) each own their identity and
    what they allow. A scenario describes a run; how each kind runs is
    :mod:`precision_harness.runs.kind_runners`, keyed by :attr:`kind`.
    """

    @staticmethod
    def load(path: str | Path, *, home: Path | None = None) -> Scenario:
        """Load and validate ``path`` as the kind its keys declare.

        ``home``: the folder its relative paths are read from, for a variant written away from its original
        (:meth:`with_overrides`); default the file's own.

        Raises:
            ScenarioError: unreadable file, malformed YAML, schema violation (file and field path),
                a key the kind does not allow, an unknown stage with ``strict: true``, or
                inconsistent batch sizes.
        """
        path = Path(path)
        raw = loading.read_yaml(path)
        loading.check_name(
            raw.get("name", path.stem), source=path, field_name="name" if "name" in raw else "name (file stem)"
        )
        kind = next(k for k in _KINDS if k.claims(raw))
        kind.check_raw(path, raw)
        loading.validate_schema(raw, source=path)
        config = loading.merge(kind.defaults(), raw)
        pd = config["global_profiler"]["global_tool_config"]["precision_debugger"]
        if pd.get("config_path"):
            pd.update(loading.load_msprobe_config(path, pd["config_path"], raw))
        name = config.get("name") or path.stem
        config["name"] = name
        digest, components = kind.identity_of(Path(home) / path.name if home is not None else path, config)
        scenario = kind(name=name, path=path, config=config, hash=digest, identity=components, home=home)
        for check in kind.consistency_checks:
            check(scenario)
        return scenario

    def with_overrides(
        self, overrides: Mapping[str, Any], *, directory: Path, name: str | None = None, tag: str | None = None
    ) -> Scenario:
        """This scenario with ``overrides`` (``{"dotted.key": value}``, verl key names) applied, as a new scenario.

        The variant is written to ``<directory>/<self.name>.<tag>.yaml`` and loaded from there, so it
        is validated like any scenario file. ``tag`` defaults to a digest of the overrides, ``name``
        to ``<self.name>.<tag>``; a variant has its own golden folder unless it keeps this name.

        Raises:
            ScenarioError: an override names an unknown key or a bad value (the message names the
                variant file and the field), or crosses a key that is not a mapping.
        """
        tag = tag or hashlib.sha256(canonical_json(dict(overrides)).encode()).hexdigest()[:10]
        path = Path(directory) / f"{self.name}.{tag}.yaml"
        variant = loading.write_variant(self.path, overrides, path=path, name=name or f"{self.name}.{tag}")
        return Scenario.load(variant, home=self.folder)


class BuiltinScenario(Scenario):
    """Our own PPO/GRPO loop (:mod:`precision_harness.runs.runner`), run in a fresh worker process."""

    kind = "builtin"
    allows_auto = True
    ends_runs = True
    records_rollout = True
    records_weight_sync = True
    dumps_rollout = True
    unnamed_change = "model, data, batch or algorithm settings changed"
    consistency_checks = (
        validation.check_rollout_compute_log_prob,
        validation.check_stages,
        validation.check_task,
        validation.check_steps,
        validation.check_batches,
        validation.check_rollout_is,
        validation.check_world_size,
        validation.check_algorithm,
        validation.check_model,
        validation.check_invariants,
    )

    @classmethod
    def claims(cls, raw: dict[str, Any]) -> bool:
        return True  # the last kind tried: a file without ``command`` or ``engine: verl``

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return copy.deepcopy(DEFAULTS)

    @classmethod
    def identity_of(cls, path: Path, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        components = structural_settings(config)
        return scenario_hash(components), components

    @property
    def use_critic(self) -> bool:
        """``critic.enable``, or (null) whether the advantage estimator is GAE, as verl decides it."""
        return uses_critic(self.config)

    @property
    def use_reference(self) -> bool:
        """Whether a KL term needs the reference policy (``use_kl_in_reward`` or ``actor.use_kl_loss``)."""
        algo, actor = self.config["algorithm"], self.config["actor_rollout_ref"]["actor"]
        return bool(algo["use_kl_in_reward"] or actor["use_kl_loss"])

    @property
    def use_reward_model(self) -> bool:
        """``reward_model.enable``."""
        return bool(self.config["reward_model"]["enable"])

    @property
    def executed_stages(self) -> tuple[str, ...]:
        present = {
            ROLLOUT_GENERATE: True,
            ROLLOUT_COMPUTE_LOG_PROB: False,  # no engine of its own to score with: refused in one line
            "compute_rm_score": self.use_reward_model,
            "actor_compute_log_prob": True,
            "ref_compute_log_prob": self.use_reference,
            "compute_values": self.use_critic,
            "critic_update": self.use_critic,
            "actor_update": True,
        }
        return tuple(s for s in STAGES if present[s])

    @property
    def total_steps(self) -> int:
        """``trainer.total_training_steps``."""
        return self.config["trainer"]["total_training_steps"]

    def stop_after(self, step: int) -> dict[str, Any]:
        return {"trainer.total_training_steps": step}

    @property
    def gates_metrics(self) -> bool:
        return True

    @property
    def invariant_steps(self) -> tuple[int, ...]:
        """Every training step: the loop syncs and samples at each, profiled or not."""
        return tuple(range(1, self.total_steps + 1))

    @property
    def numeric_settings(self) -> dict[str, Any]:
        return numeric_settings(self.config)


class CommandScenario(Scenario):
    """Any process that writes verl's dump layout under ``$PRECISION_DUMP_DIR``.

    Its allowed keys, defaults and identity: :mod:`precision_harness.scenarios.command_scenario`.
    """

    kind = "command"
    allows_auto = False
    records_rollout = False
    records_weight_sync = False
    dumps_rollout = False
    unnamed_change = "argv, env, settings, msprobe config, num_threads or an input file changed"
    consistency_checks = (
        validation.check_rollout_generate,
        validation.check_rollout_compute_log_prob,
        validation.check_stages,
        validation.check_task,
        validation.check_level,
        validation.check_invariants,
    )
    #: where a built-in-only key's setting belongs instead, for the one-line error
    settings_hint: ClassVar[str] = "declare it under settings"

    @classmethod
    def claims(cls, raw: dict[str, Any]) -> bool:
        return "command" in raw

    @classmethod
    def check_raw(cls, path: Path, raw: dict[str, Any]) -> None:
        command_scenario.check_raw(path, raw, cls.kind, cls.settings_hint)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return command_scenario.defaults(DEFAULTS)

    @classmethod
    def identity_of(cls, path: Path, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        nested = command_scenario.identity(path, config, NUMERIC_SETTINGS, kind=cls.kind)
        return hashlib.sha256(canonical_json(nested).encode()).hexdigest(), flat_command(nested)

    @property
    def executed_stages(self) -> tuple[str, ...]:
        """The verl stages the scenario declares (``precision_debugger.stages``), in verl's order."""
        return tuple(s for s in STAGES if s in self.profiler["stages"])

    @property
    def total_steps(self) -> int:
        """The last profiled step (``global_profiler.steps``): the run is not stopped by the gate."""
        return max(self.config["global_profiler"]["steps"])

    @property
    def gates_metrics(self) -> bool:
        """``metrics:`` (the command must write ``$PRECISION_METRICS_FILE``)."""
        return bool(self.config["metrics"])

    @property
    def invariant_steps(self) -> tuple[int, ...]:
        """The profiled steps (``global_profiler.steps``): the ones the gate knows the run reached."""
        return self.steps

    @property
    def numeric_settings(self) -> dict[str, Any]:
        return command_scenario.numeric_settings(self.config, NUMERIC_SETTINGS)


#: verl optimizer keys that make the learning rate depend on the total steps (verl's ``_build_lr_scheduler``)
LR_SCHEDULE_KEYS = frozenset(
    {"lr_scheduler_type", "warmup_style", "lr_warmup_steps_ratio", "min_lr_ratio", "num_cycles", "total_training_steps"}
)


class VerlScenario(CommandScenario):
    """verl's own trainer (``engine: verl``) on ``verl.overrides`` (:mod:`precision_harness.runs.verl.engine`)."""

    kind = "verl"
    #: the gate sets ``trainer.total_training_steps`` to the last profiled step (runs/verl/engine.py)
    ends_runs = True
    #: the gate's extension writes each stage's inputs and outputs from verl's batch, on every device
    #: (precision_harness/runs/verl/stages/stage_window.py)
    allows_auto = True
    #: on cpu the gate's rollout server records both (precision_harness/runs/verl/cpu/policy_server.py); on
    #: another device verl's own rollout does neither, which the run refuses in one line (runs/verl/engine.py)
    records_weight_sync = True
    dumps_rollout = True
    unnamed_change = (
        "overrides, env, settings, msprobe config, num_threads, pin_rollouts, fresh_steps or an input file changed"
    )
    consistency_checks = (
        validation.check_rollout_generate,
        validation.check_rollout_compute_log_prob,
        validation.check_stages,
        validation.check_task,
        validation.check_level,
        validation.check_invariants,
        validation.check_fresh_steps,
    )
    settings_hint = "put verl settings under verl.overrides"

    @classmethod
    def claims(cls, raw: dict[str, Any]) -> bool:
        return raw.get("engine") == "verl"

    @classmethod
    def check_raw(cls, path: Path, raw: dict[str, Any]) -> None:
        if "command" in raw:
            raise ScenarioError(f"{path}: command: an engine: verl scenario runs verl's trainer; drop one of the two")
        super().check_raw(path, raw)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {**super().defaults(), **command_scenario.verl_defaults()}

    @property
    def pins_rollouts(self) -> bool:
        """``verl.pin_rollouts``."""
        return bool(self.config["verl"]["pin_rollouts"])

    @property
    def fresh_steps(self) -> tuple[int, ...]:
        """The ``verl.fresh_steps`` steps after the last profiled one, which sample outside the rollout cache
        (:mod:`precision_harness.scenarios.fresh_steps`)."""
        last = max(self.config["global_profiler"]["steps"])
        return tuple(range(last + 1, last + 1 + fresh_steps.count(self.config)))

    @property
    def total_steps(self) -> int:
        """The last profiled step, then the fresh steps (``trainer.total_training_steps``, runs/verl/engine.py)."""
        return super().total_steps + fresh_steps.count(self.config)

    def stop_after(self, step: int) -> dict[str, Any]:
        """A run that ends at a profiled step runs no fresh step (the profiled steps end it: runs/verl/engine.py)."""
        return {fresh_steps.KEY: 0} if self.fresh_steps else {}

    def run_to(self, step: int | None) -> dict[str, Any] | None:
        """As for every kind, except that a selection reaching a fresh step runs them all (their bounds were recorded
        after the same number of steps)."""
        if step is not None and step in self.fresh_steps:
            return None
        return super().run_to(step)

    @property
    def lr_may_follow_total_steps(self) -> bool:
        """A scenario of its own ``entrypoint``, or an override of verl's lr schedule or optimizer group: verl's own
        config schedules none (constant, no warmup)."""
        verl = self.config["verl"]
        scheduled = [k for k in verl["overrides"] if k.rsplit(".", 1)[-1] in LR_SCHEDULE_KEYS or k.endswith("optim")]
        return bool(verl["entrypoint"] or scheduled)

    def localizes_stage(self, stage: str) -> bool:
        """Not the gate's own stages (``rollout_generate``, ``rollout_compute_log_prob``): the gate's rollout server
        and trainer hook record them whatever the level, and no msprobe dump of them exists to localise in."""
        return self.localizes and stage not in (ROLLOUT_GENERATE, ROLLOUT_COMPUTE_LOG_PROB)


#: tried in order: the first whose :meth:`Scenario.claims` accepts a file's keys loads it
_KINDS: tuple[type[Scenario], ...] = (VerlScenario, CommandScenario, BuiltinScenario)
