"""Each rank's stack, written beside its dumps, and the ``env`` a command or verl run's golden records.

A built-in run fingerprints itself in its worker (:func:`precision_harness.runs.numerics.devices.fingerprint`).
A command or verl run's processes are not the gate's, so each rank writes its own
``env/rank<r>.json`` (:func:`write`: :func:`precision_harness.runs.host.stack.software_stack` of its
interpreter and host) when it starts: verl's rank processes through
:mod:`precision_harness.runs.verl.rank_stack` (verl's ``VERL_USE_EXTERNAL_MODULES`` hook, on every
device), a loop of one's own at its first dumped stage (:func:`precision_harness.stage`). After the run
:func:`merged` lays rank 0's record over what the gate read itself; a key on which another rank
disagrees is kept as ``<key>@rank<r>`` (a multi-node run with two stacks says so).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the folder of a run holding ``rank<r>.json``
ENV_DIR = "env"
#: the device a command or verl run was started for (the gate sets it; a rank reads it)
ENV_DEVICE = "PRECISION_DEVICE"
#: the key of a rank's record naming the Ray node it ran on: where, not what it ran with (no environment difference)
RAY_NODE = "ray_node"


def write(root: Path, rank: int, device: str, extra: Mapping[str, str] | None = None) -> Path | None:
    """Write ``root/env/rank<rank>.json``: this process's interpreter and host stack, and ``extra`` (what the caller
    knows of the process: a verl rank's FSDP2 fill). Never raises (None)."""
    from precision_harness.runs.host.stack import software_stack

    try:
        record = {"python": platform.python_version(), **software_stack(device), **(extra or {})}
        path = Path(root) / ENV_DIR / f"rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path
    except (OSError, ValueError):
        return None


def write_from_environment(extra: Mapping[str, str] | None = None) -> Path | None:
    """In a rank process of a gate run (``RANK`` and ``PRECISION_DUMP_DIR`` set): :func:`write`; else nothing."""
    root, rank = os.environ.get("PRECISION_DUMP_DIR"), os.environ.get("RANK")
    if not root or rank is None or not rank.isdigit():
        return None
    return write(Path(root), int(rank), os.environ.get(ENV_DEVICE, "cpu"), extra)


def read(run_dir: Path) -> dict[int, dict[str, Any]]:
    """``{rank: record}`` of every readable ``env/rank<r>.json`` in ``run_dir``."""
    out = {}
    for path in sorted((Path(run_dir) / ENV_DIR).glob("rank*.json")):
        rank = path.stem[4:]
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if rank.isdigit() and isinstance(record, dict):
            out[int(rank)] = record
    return out


def merged(gate: Mapping[str, Any], ranks: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """``gate`` (what the gate read) with rank 0's record laid over it, and ``<key>@rank<r>`` where rank r differs.

    Without records (the run wrote none) ``gate`` is the answer.
    """
    if not ranks:
        return dict(gate)
    first = min(ranks)
    out = {**gate, **ranks[first]}
    for rank, record in sorted(ranks.items()):
        for key, value in record.items():
            if rank != first and ranks[first].get(key) != value:
                out[f"{key}@rank{rank}"] = value
    return out
