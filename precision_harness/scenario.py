"""Scenario: one short PPO/GRPO run described by a YAML file under ``scenarios/``.

Keys reuse verl's ``ppo_trainer.yaml`` names so settings move between a scenario and a verl run.
The file is validated with ``schemas/scenario.schema.json`` (unknown keys are errors) and merged
over :data:`DEFAULTS`. This module imports neither torch nor pytest.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from precision_harness.errors import ScenarioError

#: verl's PrecisionDebugger stages (verl/utils/profiler/precision_debugger), in the order a PPO step runs them.
STAGES: tuple[str, ...] = (
    "compute_rm_score",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
)

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
    "trainer": {"total_training_steps": 2, "num_threads": 1, "world_size": 1, "ray": {"num_cpus": 1, "resources": {}}},
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
        # the seed PR's default (verl AlgoConfig of that PR): a token with ratio < 1e-4 vetoes its sequence
        "rollout_is_veto_threshold": 1e-4,
    },
    "global_profiler": {
        "tool": "precision_debugger",
        "steps": None,
        "global_tool_config": {
            "precision_debugger": {
                "stages": list(STAGES),
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

#: Keys of the msprobe config.json that a scenario may set inline or through ``config_path``.
MSPROBE_KEYS = ("task", "level", "scope", "list", "data_mode", "summary_mode")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Return the JSON Schema ``schemas/<name>.schema.json`` shipped with the package."""
    text = resources.files("precision_harness.schemas").joinpath(f"{name}.schema.json").read_text("utf-8")
    return json.loads(text)


def validate(instance: Any, schema_name: str, *, source: str | Path) -> None:
    """Validate ``instance`` against a packaged schema; raise :class:`ScenarioError` naming the field.

    Only the first (best-match) error is reported, as ``<source>: <field.path>: <message>``.
    """
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(load_schema(schema_name))
    errors = sorted(validator_cls(load_schema(schema_name)).iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        where = ".".join(str(p) for p in err.absolute_path) or "<top level>"
        message = err.message
        if err.validator == "additionalProperties":
            message = f"{message}; remove it or check its spelling against {schema_name}.schema.json"
        raise ScenarioError(f"{source}: {where}: {message}")


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
    """A loaded, validated scenario with defaults resolved.

    Attributes:
        name: scenario name (``name:`` key, else the file stem); names the golden folder.
        path: the YAML file.
        config: resolved config (DEFAULTS merged with the file), verl key names.
        hash: sha256 of the canonical JSON of the structural settings (see :data:`NUMERIC_SETTINGS`);
            a golden recorded under another hash is stale. Numeric settings are compared by value.
    """

    name: str
    path: Path
    config: dict[str, Any] = field(repr=False)
    hash: str

    # ----------------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """Load and validate ``path``.

        Raises:
            ScenarioError: unreadable file, malformed YAML, schema violation (file and field path),
                an unknown stage with ``strict: true``, or inconsistent batch sizes.
        """
        path = Path(path)
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
            raw = {}
        if not isinstance(raw, dict):
            raise ScenarioError(
                f"{path}: expected a mapping of verl config keys at the top level, got {type(raw).__name__}"
            )
        validate(raw, "scenario", source=path)
        config = _merge(DEFAULTS, raw)
        pd = config["global_profiler"]["global_tool_config"]["precision_debugger"]
        if pd.get("config_path"):
            pd.update(_load_msprobe_config(path, pd["config_path"], raw))
        name = config.get("name") or path.stem
        config["name"] = name
        scenario = cls(name=name, path=path, config=config, hash=_scenario_hash(config))
        scenario._check_consistency()
        return scenario

    # ------------------------------------------------------------------------------- properties
    @property
    def profiler(self) -> dict[str, Any]:
        """``global_profiler.global_tool_config.precision_debugger`` (resolved)."""
        return self.config["global_profiler"]["global_tool_config"]["precision_debugger"]

    @property
    def level(self) -> str:
        """msprobe dump level: ``L0``, ``L1`` or ``mix``."""
        return self.profiler["level"]

    @property
    def use_critic(self) -> bool:
        enable = self.config["critic"]["enable"]
        return self.config["algorithm"]["adv_estimator"] == "gae" if enable is None else bool(enable)

    @property
    def use_reference(self) -> bool:
        algo, actor = self.config["algorithm"], self.config["actor_rollout_ref"]["actor"]
        return bool(algo["use_kl_in_reward"] or actor["use_kl_loss"])

    @property
    def use_reward_model(self) -> bool:
        return bool(self.config["reward_model"]["enable"])

    @property
    def executed_stages(self) -> tuple[str, ...]:
        """Stages this scenario's PPO step runs, in execution order."""
        present = {
            "compute_rm_score": self.use_reward_model,
            "actor_compute_log_prob": True,
            "ref_compute_log_prob": self.use_reference,
            "compute_values": self.use_critic,
            "critic_update": self.use_critic,
            "actor_update": True,
        }
        return tuple(s for s in STAGES if present[s])

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
        total = self.config["trainer"]["total_training_steps"]
        wanted = self.config["global_profiler"]["steps"]
        return tuple(range(1, total + 1)) if wanted is None else tuple(sorted(wanted))

    @property
    def world_size(self) -> int:
        """Data-parallel ranks (``trainer.world_size``); each dumps to its own ``rank<r>`` folder."""
        return int(self.config["trainer"]["world_size"])

    def ray_resources(self, device: str) -> dict[str, Any]:
        """``ray.remote`` options for one rank's actor: ``num_cpus``, ``num_gpus`` on cuda, ``resources`` (``{"NPU": 1}`` on npu by default)."""
        ray_cfg = self.config["trainer"]["ray"]
        resources = dict(ray_cfg["resources"])
        if device == "npu":
            resources.setdefault("NPU", 1)
        options: dict[str, Any] = {"num_cpus": ray_cfg["num_cpus"], "resources": resources}
        if device == "cuda":
            options["num_gpus"] = 1
        return options

    @property
    def numeric_settings(self) -> dict[str, Any]:
        """Flattened :data:`NUMERIC_SETTINGS` values; a golden keeps them to name what changed."""
        return numeric_settings(self.config)

    def msprobe_config(self) -> dict[str, Any]:
        """The msprobe ``config.json`` for this run (``dump_path`` is set per stage by the probe)."""
        pd = self.profiler
        return {
            "task": pd["task"],
            "rank": [],
            "step": [],
            "level": pd["level"],
            "async_dump": False,
            pd["task"]: {
                "scope": list(pd["scope"]),
                "list": list(pd["list"]),
                "data_mode": list(pd["data_mode"]),
                "summary_mode": pd["summary_mode"],
            },
        }

    # ------------------------------------------------------------------------------ validation
    def _check_consistency(self) -> None:
        cfg, where = self.config, self.path
        pd = self.profiler
        unknown = [s for s in pd["stages"] if s not in STAGES]
        if unknown and pd["strict"]:
            raise ScenarioError(
                f"{where}: global_profiler.global_tool_config.precision_debugger.stages: unknown stage "
                f"{unknown[0]!r} (strict: true); expected one of {', '.join(STAGES)}"
            )
        not_run = [s for s in pd["stages"] if s in STAGES and s not in self.executed_stages]
        if not_run and pd["strict"]:
            raise ScenarioError(
                f"{where}: global_profiler.global_tool_config.precision_debugger.stages: stage {not_run[0]!r} "
                f"never runs in this scenario (strict: true); enable its role or remove it from stages"
            )
        total = cfg["trainer"]["total_training_steps"]
        bad_steps = [s for s in self.steps if s > total]
        if bad_steps:
            raise ScenarioError(
                f"{where}: global_profiler.steps: step {bad_steps[0]} is past trainer.total_training_steps={total}"
            )
        n_seq = cfg["data"]["train_batch_size"] * cfg["actor_rollout_ref"]["rollout"]["n"]
        for role_key, role in (
            ("actor_rollout_ref.actor", cfg["actor_rollout_ref"]["actor"]),
            ("critic", cfg["critic"]),
        ):
            if role_key == "critic" and not self.use_critic:
                continue
            mini = role["ppo_mini_batch_size"]
            if cfg["data"]["train_batch_size"] % mini:
                raise ScenarioError(
                    f"{where}: {role_key}.ppo_mini_batch_size: {mini} must divide data.train_batch_size="
                    f"{cfg['data']['train_batch_size']} (verl counts mini-batches in prompts)"
                )
            mini_seqs = mini * cfg["actor_rollout_ref"]["rollout"]["n"]
            if mini_seqs % role["ppo_micro_batch_size_per_gpu"]:
                raise ScenarioError(
                    f"{where}: {role_key}.ppo_micro_batch_size_per_gpu: {role['ppo_micro_batch_size_per_gpu']} must "
                    f"divide the mini-batch of {mini_seqs} sequences (ppo_mini_batch_size x rollout.n)"
                )
        algo = cfg["algorithm"]
        if algo["rollout_is"] and algo["rollout_is_threshold"] is None:
            raise ScenarioError(
                f"{where}: algorithm.rollout_is: true applies IS weights but algorithm.rollout_is_threshold is null "
                f"(rollout IS off); set a threshold such as 2.0, or rollout_is: false"
            )
        lower, upper = algo["rollout_is_threshold_lower"], algo["rollout_is_threshold"]
        if lower is not None and upper is not None and lower > upper:
            raise ScenarioError(
                f"{where}: algorithm.rollout_is_threshold_lower: {lower} is above rollout_is_threshold={upper}; "
                f"expected lower <= upper (null defaults to 1/upper)"
            )
        self._check_world_size()
        if cfg["algorithm"]["adv_estimator"] == "grpo" and cfg["actor_rollout_ref"]["rollout"]["n"] < 2:
            raise ScenarioError(f"{where}: actor_rollout_ref.rollout.n: GRPO needs n >= 2 responses per prompt, got 1")
        m = cfg["model"]
        if m["path"] is None and m["num_attention_heads"] % m["num_key_value_heads"]:
            raise ScenarioError(f"{where}: model.num_key_value_heads: must divide num_attention_heads")
        if n_seq <= 0:  # pragma: no cover - schema forbids it
            raise ScenarioError(f"{where}: data.train_batch_size: must be positive")

    def _check_world_size(self) -> None:
        """Every data-parallel split must be whole: the batch, each role's mini-batch, and micro-batches per rank."""
        cfg, where, w = self.config, self.path, self.world_size
        if w == 1:
            return
        n = cfg["actor_rollout_ref"]["rollout"]["n"]
        n_seq = cfg["data"]["train_batch_size"] * n
        if n_seq % w:
            raise ScenarioError(
                f"{where}: trainer.world_size: {w} must divide the batch of {n_seq} sequences (data.train_batch_size x rollout.n)"
            )
        for role_key, role in (
            ("actor_rollout_ref.actor", cfg["actor_rollout_ref"]["actor"]),
            ("critic", cfg["critic"]),
        ):
            if role_key == "critic" and not self.use_critic:
                continue
            mini_seqs = role["ppo_mini_batch_size"] * n
            if mini_seqs % w or (mini_seqs // w) % role["ppo_micro_batch_size_per_gpu"]:
                raise ScenarioError(
                    f"{where}: {role_key}.ppo_micro_batch_size_per_gpu: {role['ppo_micro_batch_size_per_gpu']} must divide the "
                    f"per-rank mini-batch of {mini_seqs}/{w} sequences (ppo_mini_batch_size x rollout.n / trainer.world_size)"
                )


def display_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (for messages)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


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
    validate({"global_profiler": {"global_tool_config": {"precision_debugger": merged}}}, "scenario", source=p)
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


def _scenario_hash(config: dict[str, Any]) -> str:
    """sha256 over the structural settings: model, data, shapes, algorithm choices, seed, msprobe level."""
    structural, _ = _split_settings(config)
    if structural.get("trainer.world_size") == 1:
        del structural[
            "trainer.world_size"
        ]  # the single-rank default keeps the hashes recorded before world_size existed
    return hashlib.sha256(canonical_json(structural).encode()).hexdigest()
