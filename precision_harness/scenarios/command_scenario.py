"""Command and verl scenarios: what their YAML may hold, their defaults and their identity.

A scenario with a top-level ``command`` (an argv list) is a *command* scenario: any process that
writes verl's dump layout under ``$PRECISION_DUMP_DIR`` (:mod:`precision_harness.runs.command.run`). A
scenario with ``engine: verl`` runs verl's own trainer with ``verl.overrides``
(:mod:`precision_harness.runs.verl.engine`). Both declare what is profiled in verl's own keys
(``global_profiler.steps``, ``...precision_debugger.stages``, ``strict``, the msprobe level) and
neither has the built-in loop's model, data or algorithm sections.

**Staleness.** A golden is stale (re-record, not drift) when the scenario's identity changed: the
argv (or verl's entrypoint), the declared ``settings`` and ``env``, the verl overrides, the msprobe
config and the sha256 of every file listed under ``inputs``: what defines the experiment (data
files, model configs, checkpoints), never the training code, whose edit must show as drift at the
stage it reaches. Numeric settings (the same globs as the built-in loop's,
:data:`precision_harness.scenarios.settings.NUMERIC_SETTINGS`, applied to ``settings`` and ``verl.overrides``
keys) are compared by value instead: the verdict names the one that changed.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from precision_harness.errors import ScenarioError

#: keys only the built-in PPO loop understands
BUILTIN_ONLY = ("seed", "model", "data", "actor_rollout_ref", "critic", "reward_model", "algorithm")
#: ``trainer`` keys a command scenario may set (how its process is pinned and where Ray runs it)
COMMAND_TRAINER_KEYS = ("num_threads", "ray")
#: metrics verl logs that move from run to run whatever the numerics (time, throughput): never gated
#: (a verl scenario's default ``verl.metrics_exclude``)
METRICS_EXCLUDE = ("timing_s/*", "timing_per_token_ms/*", "perf/*", "*/perf/*", "*/time*", "training/epoch")


def defaults(builtin_defaults: dict[str, Any]) -> dict[str, Any]:
    """The defaults a command scenario's file is merged over (a verl scenario's adds :func:`verl_defaults`)."""
    return {
        "device": builtin_defaults["device"],
        "trainer": {"num_threads": 1, "world_size": 1, "ray": copy.deepcopy(builtin_defaults["trainer"]["ray"])},
        "global_profiler": copy.deepcopy(builtin_defaults["global_profiler"]),
        "tolerance": copy.deepcopy(builtin_defaults["tolerance"]),
        "inputs": [],
        "settings": {},
        "env": {},
        "metrics": False,
    }


def verl_defaults() -> dict[str, Any]:
    """What an ``engine: verl`` scenario's defaults add: its metrics are gated, its rollouts pinned."""
    return {
        "metrics": True,
        "engine": "verl",
        "verl": {"overrides": {}, "entrypoint": None, "pin_rollouts": True, "metrics_exclude": list(METRICS_EXCLUDE)},
    }


def check_raw(path: Path, raw: dict[str, Any], kind: str, settings_hint: str) -> None:
    """One-line errors for what a command or verl scenario (``kind``) may not say.

    ``settings_hint`` says where a built-in-only key's setting belongs in this kind.

    Raises:
        ScenarioError: ``command`` not a list of strings, a built-in-only key, ``trainer`` keys other
            than num_threads/ray, or no ``global_profiler.steps``.
    """
    command = raw.get("command")
    if "command" in raw and (
        not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command)
    ):
        raise ScenarioError(
            f"{path}: command: expected a list of strings (the argv, e.g. [python, train.py]), got {command!r}"
        )
    for key in BUILTIN_ONLY:
        if key in raw:
            raise ScenarioError(
                f"{path}: {key}: a built-in scenario key; a {kind} scenario's own run decides it ({settings_hint})"
            )
    for key in raw.get("trainer") or {}:
        if key not in COMMAND_TRAINER_KEYS:
            raise ScenarioError(
                f"{path}: trainer.{key}: a {kind} scenario sets only trainer.num_threads and trainer.ray "
                "(its steps are global_profiler.steps)"
            )
    steps = (raw.get("global_profiler") or {}).get("steps")
    if not steps:
        raise ScenarioError(
            f"{path}: global_profiler.steps: a {kind} scenario must list the steps it profiles, e.g. [1, 2]"
        )


#: ``${oc.env:NAME}`` in an ``inputs`` path: the syntax the verl overrides use for the same folders
_ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}")


def input_path(path: Path, rel: str) -> Path:
    """The file an ``inputs`` entry names: ``${oc.env:NAME}`` replaced by ``$NAME``, relative to the scenario's folder.

    Raises:
        ScenarioError: the entry uses a variable that is not set (names the entry and the variable).
    """

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ScenarioError(
                f"{path}: inputs: {rel!r} reads ${{oc.env:{name}}} but {name} is not set; set it to the folder the "
                "run reads its data from, or list the file relative to the scenario's folder"
            )
        return os.environ[name]

    return path.parent / _ENV_REF.sub(value, rel)


def _require_variables(path: Path, inputs: list[str]) -> None:
    """Raise one ScenarioError naming every entry and every ``${oc.env:NAME}`` they read that is not set.

    A scenario whose inputs read several variables (the verl example's ``DATA_DIR`` and ``MODEL_PATH``)
    says all of them at once, rather than one per attempt.
    """
    rels = [rel for rel in inputs if any(n not in os.environ for n in _ENV_REF.findall(rel))]
    names = list(dict.fromkeys(n for rel in rels for n in _ENV_REF.findall(rel) if n not in os.environ))
    if not names:
        return
    reads = ", ".join(f"${{oc.env:{n}}}" for n in names)
    verb, be, them = ("reads", "is", "it") if len(rels) == 1 else ("read", "are", "them")
    be = be if len(names) == 1 else "are"
    them = them if len(names) == 1 else "them"
    raise ScenarioError(
        f"{path}: inputs: {', '.join(map(repr, rels))} {verb} {reads} but {', '.join(names)} {be} not set; "
        f"set {them} to {'the folder' if len(names) == 1 else 'the folders'} the run reads, or list the file "
        "relative to the scenario's folder"
    )


def input_digests(path: Path, inputs: list[str]) -> dict[str, str]:
    """``{entry as listed: sha256}`` of each file under ``inputs`` (:func:`input_path`).

    An entry is named as listed, so the same data under another ``$DATA_DIR`` is the same identity.

    Raises:
        ScenarioError: an input is missing or not a file, or uses a variable that is not set (names it).
    """
    _require_variables(path, inputs)
    out = {}
    for rel in inputs:
        target = input_path(path, rel)
        if not target.is_file():
            raise ScenarioError(f"{path}: inputs: {rel!r} not found ({target}); write it first or fix the path")
        out[rel] = hashlib.sha256(target.read_bytes()).hexdigest()
    return out


def _dotted(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _declared(config: dict[str, Any]) -> dict[str, Any]:
    """Every declared setting as a dotted verl key: ``settings`` and, for verl scenarios, the overrides."""
    declared = _dotted(config["settings"])
    if config.get("verl"):
        declared.update(_dotted(config["verl"]["overrides"]))
    return declared


def numeric_settings(config: dict[str, Any], patterns: tuple[str, ...]) -> dict[str, Any]:
    """Declared settings matching ``patterns`` (the built-in loop's numeric settings), by dotted key."""
    return {k: v for k, v in _declared(config).items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def identity(path: Path, config: dict[str, Any], patterns: tuple[str, ...], *, kind: str) -> dict[str, Any]:
    """What the structural hash of a command or verl scenario (``kind``) covers (see the module docstring)."""
    pd = config["global_profiler"]["global_tool_config"]["precision_debugger"]
    numeric = numeric_settings(config, patterns)
    verl = config.get("verl") or {}
    # only when set: a scenario without fresh steps keeps the identity recorded before the key existed
    fresh = {"fresh_steps": verl["fresh_steps"]} if verl.get("fresh_steps") else {}
    return {
        "kind": kind,
        "command": config.get("command"),
        "entrypoint": verl.get("entrypoint"),
        "pin_rollouts": verl.get("pin_rollouts"),
        "settings": {k: v for k, v in _declared(config).items() if k not in numeric},
        "env": {str(k): str(v) for k, v in config["env"].items()},
        "inputs": input_digests(path, config["inputs"]),
        # msprobe's rank filter only when set: every rank (the default) keeps the identities recorded before it
        "msprobe": {k: pd[k] for k in ("task", "scope", "list", "data_mode", "summary_mode")}
        | ({"rank": pd["rank"]} if pd.get("rank") else {}),
        "num_threads": config["trainer"]["num_threads"],
    } | fresh
