"""A scenario's identity as flat components, and the names of what changed between two of them.

The structural hash (:attr:`precision_harness.scenarios.scenario.Scenario.hash`) says *that* a golden belongs
to another experiment; the identity says *what* it is made of, one component per entry, so a stale
golden can name the difference instead of showing two hashes. A golden records it in its manifest
(``identity``). Components, by kind of scenario:

- built-in: every structural setting by its dotted key (``model.hidden_size: 32``);
- command and verl: ``argv[<i>]``, ``env.<KEY>``, ``settings.<dotted key>`` (the declared settings and
  verl overrides that are not numeric), ``msprobe.<key>``, ``num_threads``, ``kind``, ``entrypoint``,
  ``pin_rollouts``, ``fresh_steps`` (where set), and ``inputs[<path>]``: the sha256 of each input file.

This module reads no file and imports neither torch nor pytest.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: the prefix and suffix of an input file's component: ``inputs[data/prompts.parquet]``
INPUT_PREFIX, INPUT_SUFFIX = "inputs[", "]"
#: changes a stale message names before "and N more"
MAX_CHANGES = 5


def input_key(rel: str) -> str:
    """The component name of input file ``rel`` (as listed under ``inputs``)."""
    return f"{INPUT_PREFIX}{rel}{INPUT_SUFFIX}"


def flat_command(nested: dict[str, Any]) -> dict[str, Any]:
    """A command or verl scenario's identity (:func:`.command_scenario.identity`) as components.

    The argv is split by position, so an edited element is named by its index; mappings (``env``,
    ``settings``, ``msprobe``) by key; each input by its path.
    """
    out: dict[str, Any] = {}
    for key, value in nested.items():
        if key == "command":
            out.update({f"argv[{i}]": arg for i, arg in enumerate(value or [])})
        elif key == "inputs":
            out.update({input_key(rel): digest for rel, digest in value.items()})
        elif isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


#: a component one side does not have
_ABSENT = object()


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(unset)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _natural(key: str) -> list[Any]:
    """Sort key that puts ``argv[2]`` before ``argv[10]``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def _change(key: str, old: Any, new: Any) -> str:
    if key.startswith(INPUT_PREFIX) and key.endswith(INPUT_SUFFIX):
        rel = key[len(INPUT_PREFIX) : -len(INPUT_SUFFIX)]
        if old is _ABSENT:
            return f"input {rel} added"
        if new is _ABSENT:
            return f"input {rel} no longer listed"
        return f"input {rel} changed (sha256 {str(old)[:8]} -> {str(new)[:8]})"
    return f"{key}: {_shown(old)} -> {_shown(new)}"


def changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per component that differs, sorted by name: ``model.hidden_size: 32 -> 64``,
    ``argv[3]: --lr=1 -> --lr=2``, ``input data/p.parquet changed (sha256 1a2b3c4d -> 5e6f7a8b)``.

    A component on one side only shows ``(unset)`` on the other (an input: ``added`` or ``no longer listed``).
    """
    keys = sorted(set(recorded) | set(current), key=_natural)
    pairs = [(k, recorded.get(k, _ABSENT), current.get(k, _ABSENT)) for k in keys]
    return [_change(k, old, new) for k, old, new in pairs if old != new]


def summary(lines: list[str]) -> str:
    """``lines`` joined with ``; ``, the first :data:`MAX_CHANGES` of them and how many more."""
    more = len(lines) - MAX_CHANGES
    return "; ".join(lines[:MAX_CHANGES]) + (f"; and {more} more" if more > 0 else "")
