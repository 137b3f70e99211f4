"""ScenarioBase: what every kind of scenario is and says once loaded (the scenario model).

The kinds and their loading are :mod:`precision_harness.scenarios.scenario`; this module imports
neither torch nor pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from precision_harness.scenarios import invariant_declarations
from precision_harness.scenarios.profiling import (
    AUTO,
    AUTO_DUMP_LEVEL,
    LEVEL_KEY,
    LIST_KEY,
    LOCALIZE_LEVEL,
    STAGES_KEY,
    TASK_KEY,
    TENSOR_TASK,
)


@dataclass(frozen=True)
class ScenarioBase:
    """What a loaded scenario is and says, whatever its kind: its file, resolved config and identity,
    the steps and stages it profiles, its msprobe config and its ``invariants:``.

    The kinds (:mod:`precision_harness.scenarios.scenario`) fill in what this leaves to them; the
    cross-field checks (:mod:`precision_harness.scenarios.validation`) read a scenario through it.

    Attributes:
        name: scenario name (``name:`` key, else the file stem); names the golden folder.
        path: the YAML file.
        config: resolved config (the kind's defaults merged with the file), verl key names.
        hash: sha256 of the scenario's identity (see
            :data:`~precision_harness.scenarios.settings.NUMERIC_SETTINGS`); a golden recorded under
            another hash is stale. Numeric settings are compared by value.
    """

    #: the kind's name (docs/scenarios.md): recorded in run.json and in a command's identity
    kind: ClassVar[str]
    #: whether ``level: auto`` is allowed: it needs the built-in runner's stage inputs and outputs
    allows_auto: ClassVar[bool]
    #: what a stale golden's message says when the golden cannot name the change
    unnamed_change: ClassVar[str]
    #: whether its runs write per-token rollout log-probs beside the training log-probs (the built-in
    #: loop's ``log_probs.json``): ``exact`` parity and the log-prob bounds need them
    records_rollout: ClassVar[bool]
    #: whether its runs write per-parameter digests of each weight sync (``weight_sync.json``): the
    #: ``weight_sync`` invariant needs them (verl: on cpu, where the gate's rollout server records them)
    records_weight_sync: ClassVar[bool]
    #: whether its runs can dump ``rollout_generate`` (verl: on cpu, the gate's rollout server)
    dumps_rollout: ClassVar[bool]
    #: whether the gate decides where its runs end (:meth:`run_to`): the built-in loop's
    #: ``trainer.total_training_steps``, verl's last profiled step; a command runs as it runs
    ends_runs: ClassVar[bool] = False
    #: cross-field rules the schema cannot express (:mod:`.validation`), run when the file is loaded
    consistency_checks: ClassVar[tuple[Callable[[ScenarioBase], None], ...]]

    name: str
    path: Path
    config: dict[str, Any] = field(repr=False)
    hash: str
    #: what :attr:`hash` is made of, as flat components (:mod:`precision_harness.scenarios.identity`); a golden
    #: records it, so a stale golden names what changed
    identity: dict[str, Any] = field(default_factory=dict, repr=False)
    #: a variant's original folder (None: the file's own), see :attr:`folder`
    home: Path | None = field(default=None, repr=False)

    # ------------------------------------------------------------------------- owned by the kind
    @classmethod
    def claims(cls, raw: dict[str, Any]) -> bool:
        """Whether a scenario file's top-level keys (``raw``) declare this kind."""
        raise NotImplementedError

    @classmethod
    def check_raw(cls, path: Path, raw: dict[str, Any]) -> None:
        """One-line errors for keys this kind does not allow, before schema validation."""

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The defaults this kind's file is merged over."""
        raise NotImplementedError

    @classmethod
    def identity_of(cls, path: Path, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``(hash, flat identity components)`` of a resolved config."""
        raise NotImplementedError

    @property
    def executed_stages(self) -> tuple[str, ...]:
        """Stages this scenario's PPO step runs, in execution order."""
        raise NotImplementedError

    @property
    def total_steps(self) -> int:
        """Training steps a run takes."""
        raise NotImplementedError

    @property
    def gates_metrics(self) -> bool:
        """Whether the run's ``metrics.jsonl`` is an item."""
        raise NotImplementedError

    @property
    def numeric_settings(self) -> dict[str, Any]:
        """Flattened :data:`~precision_harness.scenarios.settings.NUMERIC_SETTINGS` values; a golden keeps them
        to name what changed."""
        raise NotImplementedError

    @property
    def pins_rollouts(self) -> bool:
        """Whether a check run loads the golden's recorded rollouts (verl's ``skip.rollout_tq``)."""
        return False

    # ------------------------------------------------------------------------------- properties
    @property
    def folder(self) -> Path:
        """The folder the scenario's relative paths are read from (``inputs``, a command's working directory,
        ``PRECISION_SCENARIO_DIR``): the file's own, or for a variant written elsewhere its original's."""
        return self.home if self.home is not None else Path(self.path).parent

    @property
    def profiler(self) -> dict[str, Any]:
        """``global_profiler.global_tool_config.precision_debugger`` (resolved)."""
        return self.config["global_profiler"]["global_tool_config"]["precision_debugger"]

    @property
    def level(self) -> str:
        """The scenario's level: msprobe's ``L0``, ``L1`` or ``mix``, or ``auto`` (:data:`AUTO`)."""
        return self.profiler["level"]

    @property
    def localizes(self) -> bool:
        """``level: auto``: the gate dumps at L0 beside the stage inputs and outputs, the golden keeps an
        L1 record too, and a failing stage is rerun at :data:`LOCALIZE_LEVEL` (docs/scenarios.md#level-auto)."""
        return self.level == AUTO

    @property
    def dump_level(self) -> str:
        """The msprobe level the run dumps at: :attr:`level`, or ``L0`` for ``auto``."""
        return AUTO_DUMP_LEVEL if self.localizes else self.level

    def localize_overrides(self, step: int, stage: str) -> dict[str, Any]:
        """Overrides that rerun this scenario up to ``step`` (:meth:`stop_after`) and dump only ``stage`` of it, at
        :data:`LOCALIZE_LEVEL`.

        Steps before ``step`` run the same ops without a debugger, so ``stage``'s dump equals the
        one a full run at that level writes (msprobe's API counters restart at every stage).
        """
        return {
            LEVEL_KEY: LOCALIZE_LEVEL,
            "global_profiler.steps": self.rerun_steps(step),
            STAGES_KEY: [stage],
            **self.stop_after(step),
        }

    def capture_overrides(self, step: int, stage: str, apis: list[str]) -> dict[str, Any]:
        """Overrides that rerun this scenario to ``step``, saving the tensors of ``apis`` in ``stage`` only.

        msprobe's ``task: tensor`` scoped by ``list`` (dump.json keys, ``Functional.linear.0.forward``):
        only those calls are collected, numbered as in a full dump (msprobe counts every call and
        collects the listed ones). The level is the gate's (``auto``: its localisation level, L1), so
        the calls are the ones the checked dump names.
        """
        overrides = {**self.stop_after(step), "global_profiler.steps": self.rerun_steps(step), STAGES_KEY: [stage]}
        if self.localizes:
            overrides[LEVEL_KEY] = LOCALIZE_LEVEL
        return {**overrides, TASK_KEY: TENSOR_TASK, LIST_KEY: list(apis)}

    def stop_after(self, step: int) -> dict[str, Any]:
        """Overrides that end a run after ``step`` (none where the run ends at its last profiled step)."""
        return {}

    @property
    def lr_may_follow_total_steps(self) -> bool:
        """Whether the learning rate may be scheduled over the run's total steps, which the gate sets to the last
        profiled step (verl's ``_build_lr_scheduler``: a warmup ratio, a cosine decay): then no run the gate
        makes may end early, or it trains its first steps at another rate. Never for the built-in loop."""
        return False

    def rerun_steps(self, step: int) -> list[int]:
        """The profiled steps of a rerun to ``step`` (level auto's localisation, the judgement's capture): ``[step]``,
        and the last profiled step too where :attr:`lr_may_follow_total_steps`, so the rerun keeps the check's
        total and trains ``step`` at its rate (it runs on past ``step``; only ``step``'s dump is read)."""
        return sorted({step, self.total_steps}) if self.lr_may_follow_total_steps else [step]

    def run_to(self, step: int | None) -> dict[str, Any] | None:
        """Overrides that end a run after ``step`` and profile only the steps up to it (what a check whose
        selected items end at ``step`` runs), or None: the run ends there anyway, or the gate cannot end it
        (a command scenario's own process runs as it runs), may not (:attr:`lr_may_follow_total_steps`), or no
        step is given."""
        if step is None or not self.ends_runs or self.lr_may_follow_total_steps or step >= self.total_steps:
            return None
        return {**self.stop_after(step), "global_profiler.steps": [s for s in self.steps if s <= step]}

    def localizes_stage(self, stage: str) -> bool:
        """Whether a failing ``stage`` item is rerun at :data:`LOCALIZE_LEVEL` (``level: auto``)."""
        return self.localizes

    @property
    def stages(self) -> tuple[str, ...]:
        """Profiled stages: listed in ``precision_debugger.stages`` and run by this scenario."""
        listed = set(self.profiler["stages"])
        return tuple(s for s in self.executed_stages if s in listed)

    @property
    def ignored_stages(self) -> tuple[str, ...]:
        """Listed stages that are unknown to verl or not run by this scenario (``strict: false``)."""
        return tuple(s for s in self.profiler["stages"] if s not in self.executed_stages)

    @property
    def steps(self) -> tuple[int, ...]:
        """Profiled steps (``global_profiler.steps``; null profiles every step), 1-based."""
        wanted = self.config["global_profiler"]["steps"]
        return tuple(range(1, self.total_steps + 1)) if wanted is None else tuple(sorted(wanted))

    @property
    def world_size(self) -> int:
        """Data-parallel ranks (``trainer.world_size``); each dumps to its own ``rank<r>`` folder."""
        return int(self.config["trainer"]["world_size"])

    def ray_resources(self, device: str) -> dict[str, Any]:
        """``ray.remote`` options for one rank's actor.

        ``num_cpus``, ``num_gpus`` on cuda, and ``resources`` (``{"NPU": 1}`` on npu by default).
        """
        ray_cfg = self.config["trainer"]["ray"]
        resources = dict(ray_cfg["resources"])
        if device == "npu":
            resources.setdefault("NPU", 1)
        options: dict[str, Any] = {"num_cpus": ray_cfg["num_cpus"], "resources": resources}
        if device == "cuda":
            options["num_gpus"] = 1
        return options

    def msprobe_config(self) -> dict[str, Any]:
        """The msprobe ``config.json`` for this run (``dump_path`` is set per stage by the probe)."""
        pd = self.profiler
        return {
            "task": pd["task"],
            "rank": list(pd["rank"]),
            "step": [],
            "level": self.dump_level,
            "async_dump": False,
            pd["task"]: {
                "scope": list(pd["scope"]),
                "list": list(pd["list"]),
                "data_mode": list(pd["data_mode"]),
                "summary_mode": pd["summary_mode"],
            },
        }

    @property
    def invariants(self) -> invariant_declarations.Invariants:
        """The scenario's ``invariants:`` checks (docs/consistency.md); none when the key is absent.

        Raises:
            ScenarioError: an unknown check or bound, or a bound that is not a number (names the key).
        """
        raw = self.config.get("invariants")
        return invariant_declarations.parse(
            raw,
            source=self.path,
            kind=self.kind,
            records_rollout=self.records_rollout,
            records_weight_sync=self.records_weight_sync,
        )

    @property
    def invariant_items(self) -> tuple[tuple[int, str], ...]:
        """``(step, check)`` of every invariant item: each check at each of :attr:`invariant_steps`."""
        return tuple((step, name) for step in self.invariant_steps for name in self.invariants.names)

    @property
    def fresh_steps(self) -> tuple[int, ...]:
        """Steps run after the profiled ones with rollouts sampled afresh, one item each (``verl.fresh_steps``,
        :mod:`precision_harness.scenarios.fresh_steps`); none but for a verl scenario that declares them."""
        return ()

    @property
    def invariant_steps(self) -> tuple[int, ...]:
        """The steps an invariant is checked at."""
        raise NotImplementedError
