"""Scenario: one short PPO/GRPO run described by a YAML file under ``scenarios/``.

Keys reuse verl's ``ppo_trainer.yaml`` names so settings move between a scenario and a verl run.
The file is validated with ``schemas/scenario.schema.json`` (unknown keys are errors) and merged
over :data:`DEFAULTS`. This module imports neither torch nor pytest.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from precision_harness.errors import ScenarioError, SchemaError
from precision_harness.paths import display_path
from precision_harness.scenarios import command_scenario, invariant_declarations
from precision_harness.scenarios.identity import flat_command
from precision_harness.schemas import validate

#: verl's PrecisionDebugger stages (verl/utils/profiler/precision_debugger), in the order a PPO step runs them.
STAGES: tuple[str, ...] = (
    "rollout_generate",
    "compute_rm_score",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
)
#: the rollout engine's stage: opt-in (listed in ``precision_debugger.stages``), built-in scenarios only,
#: because verl's PrecisionDebugger skips it ("rollout_generate is ignored"): docs/consistency.md
ROLLOUT_GENERATE = "rollout_generate"

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "device": "cpu",
    "model": {
        "path": None,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "attn_implementation": "eager",
        "attention_dropout": 0.0,
    },
    "data": {"source": "arithmetic", "train_batch_size": 4, "max_prompt_length": 16, "max_response_length": 8},
    # world_size is structural (in the hash when > 1); ray.* only says where the ranks run
    "trainer": {
        "total_training_steps": 2,
        "num_threads": 1,
        "world_size": 1,
        "cpu_kernels": "portable",
        "ray": {"num_cpus": 1, "resources": {}},
    },
    "actor_rollout_ref": {
        "actor": {
            "ppo_mini_batch_size": 2,
            "ppo_micro_batch_size_per_gpu": 2,
            "ppo_epochs": 1,
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0,
            "use_kl_loss": False,
            "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl",
            "grad_clip": 1.0,
            "dtype": "float32",
            "optim": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 0.01, "eps": 1e-8},
        },
        "rollout": {"n": 1, "temperature": 1.0, "dtype": "float32", "log_prob_micro_batch_size_per_gpu": 4},
        "ref": {"log_prob_micro_batch_size_per_gpu": 4},
    },
    "critic": {
        "enable": None,
        "ppo_mini_batch_size": 2,
        "ppo_micro_batch_size_per_gpu": 2,
        "ppo_epochs": 1,
        "cliprange_value": 0.5,
        "loss_agg_mode": "token-mean",
        "grad_clip": 1.0,
        "optim": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 0.01, "eps": 1e-8},
    },
    "reward_model": {"enable": False, "micro_batch_size_per_gpu": 4},
    "algorithm": {
        "adv_estimator": "gae",
        "gamma": 1.0,
        "lam": 1.0,
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
        "kl_penalty": "kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "target_kl": 0.1, "horizon": 10000},
        "rollout_is": False,
        "rollout_is_threshold": None,
        "rollout_is_threshold_lower": None,
        "rollout_is_level": "token",
        "rollout_is_mode": "truncate",
        # verl PR #3694's default (its AlgoConfig): a token with ratio < 1e-4 vetoes its sequence
        "rollout_is_veto_threshold": 1e-4,
    },
    "global_profiler": {
        "tool": "precision_debugger",
        "steps": None,
        "global_tool_config": {
            "precision_debugger": {
                "stages": [s for s in STAGES if s != ROLLOUT_GENERATE],
                "strict": False,
                "config_path": None,
                "task": "statistics",
                "level": "L1",
                "scope": [],
                "list": [],
                "data_mode": ["all"],
                "summary_mode": "statistics",
            }
        },
    },
    "tolerance": {
        "mode": "tolerance",
        "dtypes": {},
        "stages": {},
        "statistics": {},
        "apis": {},
        "metrics": {},
        "cross_device": {},
    },
}

#: ``level: auto``: gate on an L0 dump plus the runner's stage inputs/outputs, localise a failing
#: stage by rerunning it at :data:`LOCALIZE_LEVEL` (docs/scenarios.md#level-auto).
AUTO = "auto"
#: the msprobe level an ``auto`` scenario dumps for the gate
AUTO_DUMP_LEVEL = "L0"
#: the msprobe level a failing ``auto`` stage is localised at (and the golden's second record)
LOCALIZE_LEVEL = "L1"
LEVEL_KEY = "global_profiler.global_tool_config.precision_debugger.level"

#: Keys of the msprobe config.json that a scenario may set inline or through ``config_path``.
MSPROBE_KEYS = ("task", "level", "scope", "list", "data_mode", "summary_mode")


def _validate(instance: Any, *, source: str | Path) -> None:
    """Validate against ``scenario.schema.json``; raise :class:`ScenarioError` naming the field."""
    try:
        validate(instance, "scenario", source=source)
    except SchemaError as exc:
        raise ScenarioError(str(exc)) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    """A scenario file's top-level mapping (``{}`` for an empty file).

    Raises:
        ScenarioError: unreadable file, malformed YAML (line and column), or not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario file: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{path}: malformed YAML: {where}{problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ScenarioError(
            f"{path}: expected a mapping of verl config keys at the top level, got {type(raw).__name__}"
        )
    return raw


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the bytes that scenario hashes are taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class Scenario:
    """A loaded, validated scenario with defaults resolved: one of three kinds, each its own class.

    :class:`BuiltinScenario` (our PPO loop), :class:`CommandScenario` (any process that writes
    verl's dump layout) and :class:`VerlScenario` (verl's own trainer) each own their identity and
    what they allow. A scenario describes a run; how each kind runs is
    :mod:`precision_harness.runs.kind_runners`, keyed by :attr:`kind`.

    Attributes:
        name: scenario name (``name:`` key, else the file stem); names the golden folder.
        path: the YAML file.
        config: resolved config (the kind's defaults merged with the file), verl key names.
        hash: sha256 of the scenario's identity (see :data:`NUMERIC_SETTINGS`); a golden recorded
            under another hash is stale. Numeric settings are compared by value.
    """

    #: the kind's name (docs/scenarios.md): recorded in run.json and in a command's identity
    kind: ClassVar[str]
    #: whether ``level: auto`` is allowed: it needs the built-in runner's stage inputs and outputs
    allows_auto: ClassVar[bool]
    #: what a stale golden's message says when the golden cannot name the change
    unnamed_change: ClassVar[str]
    #: whether its runs write per-token rollout log-probs and per-parameter weight digests (the
    #: built-in loop's own rollout): ``rollout_generate``, ``weight_sync`` and ``exact`` parity need them
    records_rollout: ClassVar[bool]
    #: cross-field rules the schema cannot express, run by :meth:`load`
    consistency_checks: ClassVar[tuple[Callable[[Scenario], None], ...]]

    name: str
    path: Path
    config: dict[str, Any] = field(repr=False)
    hash: str
    #: what :attr:`hash` is made of, as flat components (:mod:`precision_harness.scenarios.identity`); a golden
    #: records it, so a stale golden names what changed
    identity: dict[str, Any] = field(default_factory=dict, repr=False)

    # ----------------------------------------------------------------------------------- loading
    @staticmethod
    def load(path: str | Path) -> Scenario:
        """Load and validate ``path`` as the kind its keys declare.

        Raises:
            ScenarioError: unreadable file, malformed YAML, schema violation (file and field path),
                a key the kind does not allow, an unknown stage with ``strict: true``, or
                inconsistent batch sizes.
        """
        path = Path(path)
        raw = _read_yaml(path)
        check_name(raw.get("name", path.stem), source=path, field_name="name" if "name" in raw else "name (file stem)")
        kind = next(k for k in _KINDS if k.claims(raw))
        kind.check_raw(path, raw)
        _validate(raw, source=path)
        config = _merge(kind.defaults(), raw)
        pd = config["global_profiler"]["global_tool_config"]["precision_debugger"]
        if pd.get("config_path"):
            pd.update(_load_msprobe_config(path, pd["config_path"], raw))
        name = config.get("name") or path.stem
        config["name"] = name
        digest, components = kind.identity_of(path, config)
        scenario = kind(name=name, path=path, config=config, hash=digest, identity=components)
        for check in kind.consistency_checks:
            check(scenario)
        return scenario

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
        """Flattened :data:`NUMERIC_SETTINGS` values; a golden keeps them to name what changed."""
        raise NotImplementedError

    @property
    def pins_rollouts(self) -> bool:
        """Whether a check run loads the golden's recorded rollouts (verl's ``skip.rollout_tq``)."""
        return False

    # ------------------------------------------------------------------------------- properties
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
        """Overrides that rerun this scenario up to ``step`` and dump only ``stage`` of it, at :data:`LOCALIZE_LEVEL`.

        Steps before ``step`` run the same ops without a debugger, so ``stage``'s dump equals the
        one a full run at that level writes (msprobe's API counters restart at every stage).
        """
        return {
            LEVEL_KEY: LOCALIZE_LEVEL,
            "global_profiler.steps": [step],
            _STAGES_KEY: [stage],
            "trainer.total_training_steps": step,
        }

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
            "rank": [],
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

    # ------------------------------------------------------------------------------ variants
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
        name = name or f"{self.name}.{tag}"
        raw = yaml.safe_load(self.path.read_text(encoding="utf-8")) or {}
        for dotted, value in overrides.items():
            _set_dotted(raw, dotted, value, source=self.path)
        raw["name"] = name
        pd = raw.get("global_profiler", {}).get("global_tool_config", {}).get("precision_debugger", {})
        if pd.get("config_path"):  # keep it relative to the original scenario file
            pd["config_path"] = str((self.path.parent / pd["config_path"]).resolve())
        path = Path(directory) / f"{self.name}.{tag}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = f"# variant of {display_path(self.path)}: {canonical_json(dict(overrides))}\n"
        text = header + yaml.safe_dump(raw, sort_keys=False)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        return Scenario.load(path)

    @property
    def invariants(self) -> invariant_declarations.Invariants:
        """The scenario's ``invariants:`` checks (docs/consistency.md); none when the key is absent.

        Raises:
            ScenarioError: an unknown check or bound, or a bound that is not a number (names the key).
        """
        raw = self.config.get("invariants")
        return invariant_declarations.parse(raw, source=self.path, kind=self.kind, records_rollout=self.records_rollout)

    @property
    def invariant_items(self) -> tuple[tuple[int, str], ...]:
        """``(step, check)`` of every invariant item: each check at each of :attr:`invariant_steps`."""
        return tuple((step, name) for step in self.invariant_steps for name in self.invariants.names)

    @property
    def invariant_steps(self) -> tuple[int, ...]:
        """The steps an invariant is checked at."""
        raise NotImplementedError


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any, *, source: Path) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ScenarioError(f"{display_path(source)}: {dotted}: {key} is not a mapping; cannot override")
    node[leaf] = value


_STAGES_KEY = "global_profiler.global_tool_config.precision_debugger.stages"


def _check_stages(s: Scenario) -> None:
    """With ``strict: true`` every listed stage is one of verl's and runs in this scenario."""
    pd = s.profiler
    if not pd["strict"]:
        return
    unknown = [x for x in pd["stages"] if x not in STAGES]
    if unknown:
        raise ScenarioError(
            f"{s.path}: {_STAGES_KEY}: unknown stage {unknown[0]!r} (strict: true); expected one of {', '.join(STAGES)}"
        )
    not_run = [x for x in pd["stages"] if x not in s.executed_stages]
    if not_run:
        raise ScenarioError(
            f"{s.path}: {_STAGES_KEY}: stage {not_run[0]!r} never runs in this scenario (strict: true); "
            "enable its role or remove it from stages"
        )


def _check_rollout_generate(s: Scenario) -> None:
    """``rollout_generate`` is dumped by the built-in loop only: verl's debugger skips the rollout."""
    if ROLLOUT_GENERATE in s.profiler["stages"]:
        raise ScenarioError(
            f"{s.path}: {_STAGES_KEY}: {ROLLOUT_GENERATE} is not dumped by verl (its PrecisionDebugger skips the "
            f'rollout: "rollout_generate is ignored"), so a {s.kind} scenario cannot gate it; remove it from stages'
        )


def _check_invariants(s: Scenario) -> None:
    """The ``invariants:`` key parses for this kind (one line naming the file and the key)."""
    s.invariants  # noqa: B018 -- parsing is the check


def _check_level(s: Scenario) -> None:
    """``level: auto`` needs the built-in runner: it writes the stage inputs and outputs the L0 dump lacks."""
    if s.localizes and not s.allows_auto:
        raise ScenarioError(
            f"{s.path}: {LEVEL_KEY}: auto needs the built-in runner (it writes each stage's inputs and outputs "
            f"beside the L0 dump); a {s.kind} scenario sets L0, L1 or mix"
        )


def _check_steps(s: Scenario) -> None:
    total = s.config["trainer"]["total_training_steps"]
    bad_steps = [x for x in s.steps if x > total]
    if bad_steps:
        raise ScenarioError(
            f"{s.path}: global_profiler.steps: step {bad_steps[0]} is past trainer.total_training_steps={total}"
        )


def _training_roles(s: Scenario) -> list[tuple[str, dict[str, Any]]]:
    """``(config key, section)`` of every role that runs PPO updates: the actor, and the critic when it runs."""
    roles = [("actor_rollout_ref.actor", s.config["actor_rollout_ref"]["actor"])]
    return roles + ([("critic", s.config["critic"])] if s.use_critic else [])


def _check_batches(s: Scenario) -> None:
    """Mini-batches divide the batch (in prompts, as verl counts them); micro-batches divide mini-batches."""
    batch, n = s.config["data"]["train_batch_size"], s.config["actor_rollout_ref"]["rollout"]["n"]
    for role_key, role in _training_roles(s):
        mini = role["ppo_mini_batch_size"]
        if batch % mini:
            raise ScenarioError(
                f"{s.path}: {role_key}.ppo_mini_batch_size: {mini} must divide data.train_batch_size={batch} "
                "(verl counts mini-batches in prompts)"
            )
        micro = role["ppo_micro_batch_size_per_gpu"]
        if (mini * n) % micro:
            raise ScenarioError(
                f"{s.path}: {role_key}.ppo_micro_batch_size_per_gpu: {micro} must divide the mini-batch of "
                f"{mini * n} sequences (ppo_mini_batch_size x rollout.n)"
            )


def _check_world_size(s: Scenario) -> None:
    """Every data-parallel split must be whole: the batch, each role's mini-batch, and micro-batches per rank."""
    w = s.world_size
    if w == 1:
        return
    n = s.config["actor_rollout_ref"]["rollout"]["n"]
    n_seq = s.config["data"]["train_batch_size"] * n
    if n_seq % w:
        raise ScenarioError(
            f"{s.path}: trainer.world_size: {w} must divide the batch of {n_seq} sequences "
            "(data.train_batch_size x rollout.n)"
        )
    for role_key, role in _training_roles(s):
        mini_seqs, micro = role["ppo_mini_batch_size"] * n, role["ppo_micro_batch_size_per_gpu"]
        if mini_seqs % w or (mini_seqs // w) % micro:
            raise ScenarioError(
                f"{s.path}: {role_key}.ppo_micro_batch_size_per_gpu: {micro} must divide the per-rank mini-batch "
                f"of {mini_seqs}/{w} sequences (ppo_mini_batch_size x rollout.n / trainer.world_size)"
            )


def _check_rollout_is(s: Scenario) -> None:
    algo = s.config["algorithm"]
    if algo["rollout_is"] and algo["rollout_is_threshold"] is None:
        raise ScenarioError(
            f"{s.path}: algorithm.rollout_is: true applies IS weights but algorithm.rollout_is_threshold is null "
            "(rollout IS off); set a threshold such as 2.0, or rollout_is: false"
        )
    lower, upper = algo["rollout_is_threshold_lower"], algo["rollout_is_threshold"]
    if lower is not None and upper is not None and lower > upper:
        raise ScenarioError(
            f"{s.path}: algorithm.rollout_is_threshold_lower: {lower} is above rollout_is_threshold={upper}; "
            "expected lower <= upper (null defaults to 1/upper)"
        )


def _check_algorithm(s: Scenario) -> None:
    if s.config["algorithm"]["adv_estimator"] == "grpo" and s.config["actor_rollout_ref"]["rollout"]["n"] < 2:
        raise ScenarioError(f"{s.path}: actor_rollout_ref.rollout.n: GRPO needs n >= 2 responses per prompt, got 1")


def _check_model(s: Scenario) -> None:
    m = s.config["model"]
    if m["path"] is None and m["num_attention_heads"] % m["num_key_value_heads"]:
        raise ScenarioError(f"{s.path}: model.num_key_value_heads: must divide num_attention_heads")


class BuiltinScenario(Scenario):
    """Our own PPO/GRPO loop (:mod:`precision_harness.runs.runner`), run in a fresh worker process."""

    kind = "builtin"
    allows_auto = True
    records_rollout = True
    unnamed_change = "model, data, batch or algorithm settings changed"
    consistency_checks = (
        _check_stages,
        _check_steps,
        _check_batches,
        _check_rollout_is,
        _check_world_size,
        _check_algorithm,
        _check_model,
        _check_invariants,
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
        return _scenario_hash(components), components

    @property
    def use_critic(self) -> bool:
        """``critic.enable``, or (null) whether the advantage estimator is GAE, as verl decides it."""
        enable = self.config["critic"]["enable"]
        return self.config["algorithm"]["adv_estimator"] == "gae" if enable is None else bool(enable)

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
    unnamed_change = "argv, env, settings, msprobe config, num_threads or an input file changed"
    consistency_checks = (_check_rollout_generate, _check_stages, _check_level, _check_invariants)
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


class VerlScenario(CommandScenario):
    """verl's own trainer (``engine: verl``) on ``verl.overrides`` (:mod:`precision_harness.runs.verl_engine`)."""

    kind = "verl"
    unnamed_change = "overrides, env, settings, msprobe config, num_threads, pin_rollouts or an input file changed"
    consistency_checks = (_check_rollout_generate, _check_stages, _check_level, _check_invariants)
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


#: tried in order: the first whose :meth:`Scenario.claims` accepts a file's keys loads it
_KINDS: tuple[type[Scenario], ...] = (VerlScenario, CommandScenario, BuiltinScenario)

#: a scenario name is one folder under golden/ and the artifacts folder: no separators, no leading dot
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_name(name: Any, *, source: str | Path, field_name: str = "name") -> str:
    """Return ``name`` if it is a safe folder name, else raise ScenarioError naming ``source`` and the field.

    ``.``, ``..``, a path separator or a leading dot would place the golden or the run outside
    ``golden/`` and the artifacts folder (or hide it).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ScenarioError(
            f"{source}: {field_name}: {name!r} is not a valid scenario name; expected letters, digits, '_', '-' "
            "and '.', not starting with '.' (it names the folders golden/<name>/ and <artifacts>/<name>/)"
        )
    return name


def _load_msprobe_config(scenario_path: Path, config_path: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Read an msprobe ``config.json``; inline keys in the scenario win over the file."""
    p = (scenario_path.parent / config_path).resolve()
    field_name = "global_profiler.global_tool_config.precision_debugger.config_path"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{scenario_path}: {field_name}: cannot read {p}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"{scenario_path}: {field_name}: {p} is not valid JSON: {exc.msg} (line {exc.lineno})"
        ) from None
    if data.get("dump_path"):
        raise ScenarioError(f"{p}: dump_path: must not be set; the harness controls the dump path (as verl does)")
    task = data.get("task", "statistics")
    section = data.get(task, {}) if isinstance(data.get(task), dict) else {}
    merged = {"task": task, "level": data.get("level", "L1")}
    for key in ("scope", "list", "data_mode", "summary_mode"):
        if key in section:
            merged[key] = section[key]
    inline = raw.get("global_profiler", {}).get("global_tool_config", {}).get("precision_debugger", {})
    merged = {k: v for k, v in merged.items() if k not in inline}
    # re-validate the combined profiler section so a bad config.json value is reported too
    _validate({"global_profiler": {"global_tool_config": {"precision_debugger": merged}}}, source=p)
    return merged


#: Settings whose change moves numbers but not the dump's structure: a golden recorded with other
#: values is compared (the drift shows where it matters) and the verdict names the changed setting.
#: Every other numerics-relevant key is structural: a change makes the golden stale.
NUMERIC_SETTINGS: tuple[str, ...] = (
    "actor_rollout_ref.actor.clip_ratio",
    "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c",
    "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.grad_clip",
    "actor_rollout_ref.actor.optim.*",
    "actor_rollout_ref.rollout.temperature",
    "critic.cliprange_value",
    "critic.grad_clip",
    "critic.optim.*",
    "algorithm.gamma",
    "algorithm.lam",
    "algorithm.kl_ctrl.*",
    # rollout IS acts between stages (on the driver, as verl's trainer): every setting moves the
    # numbers of actor_update and metrics.jsonl but no dump's structure, so a golden is compared
    # (the verdict names the setting) rather than reported stale
    "algorithm.rollout_is",
    "algorithm.rollout_is_threshold",
    "algorithm.rollout_is_threshold_lower",
    "algorithm.rollout_is_level",
    "algorithm.rollout_is_mode",
    "algorithm.rollout_is_veto_threshold",
)

#: Keys that do not change what a run computes.
_NOT_NUMERICS = (
    "name",
    "description",
    "device",
    "tolerance",
    # checks over the run's files: what the run computes is the same with or without them
    "invariants",
    "trainer.ray",
    "global_profiler.steps",
    "global_profiler.global_tool_config.precision_debugger.stages",
    "global_profiler.global_tool_config.precision_debugger.strict",
    "global_profiler.global_tool_config.precision_debugger.config_path",
    # checked on its own (GoldenStore.load names it); not part of the structural hash
    "global_profiler.global_tool_config.precision_debugger.level",
)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _split_settings(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the flattened config into (structural, numeric) settings."""
    import fnmatch

    structural, numeric = {}, {}
    for key, value in flatten(config).items():
        if any(key == k or key.startswith(k + ".") for k in _NOT_NUMERICS):
            continue
        if any(fnmatch.fnmatchcase(key, pat) for pat in NUMERIC_SETTINGS):
            numeric[key] = value
        else:
            structural[key] = value
    return structural, numeric


def numeric_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The :data:`NUMERIC_SETTINGS` values of a resolved config, flattened (recorded in goldens)."""
    return _split_settings(config)[1]


def structural_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The structural settings of a resolved config, flattened: a built-in scenario's identity components.

    Model, data, shapes, algorithm choices, seed, msprobe config; not the numeric settings (compared
    by value), and not the msprobe ``level`` (:meth:`GoldenStore.load` compares it on its own, so a
    stale golden's message can say "recorded at L0, now L1").
    """
    return _split_settings(config)[0]


def _scenario_hash(structural: dict[str, Any]) -> str:
    """sha256 over the structural settings (:func:`structural_settings`)."""
    hashed = dict(structural)
    if hashed.get("trainer.world_size") == 1:
        del hashed["trainer.world_size"]  # the single-rank default keeps the hashes recorded before world_size existed
    return hashlib.sha256(canonical_json(hashed).encode()).hexdigest()
