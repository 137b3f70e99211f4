"""A scenario's settings by what a change to them means: structural (the golden is stale) or numeric (drift).

:data:`NUMERIC_SETTINGS` are compared by value against the golden's, so a changed learning rate
shows as drift where it matters and the verdict names it; every other numerics-relevant key is
structural and goes into the scenario's hash (:func:`scenario_hash`). This module imports neither
torch nor pytest.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the bytes that scenario hashes are taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


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


#: msprobe's rank filter (``rank``): which ranks dump
RANK_FILTER = "global_profiler.global_tool_config.precision_debugger.rank"


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


def scenario_hash(structural: dict[str, Any]) -> str:
    """sha256 over the structural settings (:func:`structural_settings`)."""
    hashed = dict(structural)
    if hashed.get("trainer.world_size") == 1:
        del hashed["trainer.world_size"]  # the single-rank default keeps the hashes recorded before world_size existed
    if hashed.get(RANK_FILTER) == []:
        del hashed[RANK_FILTER]  # every rank (the default) keeps the hashes recorded before the filter existed
    return hashlib.sha256(canonical_json(hashed).encode()).hexdigest()
