"""The files of a verl-layout dump: ``dump.json``, ``stage_outputs.json``, ``metrics.jsonl``, and rank digests.

A run (and a golden, and verl's ``global_profiler.save_path``) holds
``step_<n>/<stage>/step0/rank<r>/dump.json`` (msprobe's statistics, one entry per API call) and
``metrics.jsonl`` (one JSON object per training step). Parsing errors raise
:class:`~precision_harness.errors.GoldenCorruptError` naming the file, whichever side it came from.

``stage_outputs.json`` (``level: auto``): a stage's own inputs and outputs beside its L0
``dump.json``. An L0 dump sees module boundaries only; what a PPO stage computes outside every
module (log-probs and entropy after the LM head, values, per-micro-batch losses, gradient norms,
the advantages and returns an update consumes) is invisible to it. The built-in runner
(:mod:`precision_harness.runs.runner.stage_outputs`) writes their statistics in msprobe's ``dump.json`` format:

.. code-block:: json

    {"task": "statistics", "level": "auto", "framework": "pytorch",
     "inputs": ["Stage.advantages.0.forward"],
     "data": {"Stage.advantages.0.forward": {"input_args": [{"type": "torch.Tensor", "dtype": ..., "Max": ...}]},
              "Stage.pg_loss.0.forward": {"output": [{"type": "torch.Tensor", "shape": [], "Max": ...}]}}}

Rows are named the way msprobe's compare names them (``Stage.pg_loss.1.forward.output.0``: the
loss of micro-batch 1), so the compare, the tolerance and the verdicts treat them as any API row.
This module imports neither torch nor msprobe.

``dump.json`` is parsed with orjson (:func:`parse_dump`) where it can be: a quarter faster than
``json.loads`` on a 50 MB dump here (the rest is allocating its millions of small objects, which no parser
avoids). orjson refuses the bare ``NaN``/``Infinity``/``-Infinity`` msprobe writes for non-finite statistics
(Python's ``json.dump`` default), and quoting them as sentinels to restore after costs more than it saves
(they also stand in lists, and finding them again is a walk over every object): a file that holds them, one
orjson cannot read, and every unreadable file go to ``json.loads``, whose error names the byte offset.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import orjson

from precision_harness.errors import GoldenCorruptError

DUMP = "dump.json"
STAGE_OUTPUTS = "stage_outputs.json"
METRICS = "metrics.jsonl"
#: the msprobe-style API prefix of every stage_outputs.json entry (msprobe's own are Functional, Tensor, Module...)
STAGE_PREFIX = "Stage"


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path``, read in 1 MiB chunks. Raises OSError."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_dump(path: Path) -> dict[str, Any]:
    """Read an msprobe ``dump.json`` (bare NaN/Infinity allowed); raise GoldenCorruptError naming the file."""
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        raise GoldenCorruptError(f"{path}: not a readable msprobe dump.json ({exc}); re-record the golden") from None
    return parse_dump(content, shown=str(path))


def parse_dump(content: bytes, *, shown: str) -> dict[str, Any]:
    """Parse the bytes of an msprobe ``dump.json`` (bare NaN/Infinity allowed) into the same objects
    ``json.loads`` gives.

    Raises:
        GoldenCorruptError: not JSON (the message names ``shown`` and the byte offset of the error), or no
            ``data`` mapping.
    """
    data = _fast_parse(content)
    if data is None:
        try:
            data = json.loads(content)
        except ValueError as exc:
            raise GoldenCorruptError(f"{shown}: {_where(content, exc)}; re-record it or rerun the stage") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise GoldenCorruptError(f"{shown}: no 'data' mapping; not an msprobe dump.json")
    return data


def _fast_parse(content: bytes) -> Any:
    """orjson's parse of ``content``; None where it holds a bare ``NaN``/``Infinity`` or orjson cannot read it
    (the caller falls back to ``json.loads``)."""
    if b"NaN" in content or b"Infinity" in content:
        return None
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def _where(content: bytes, exc: ValueError) -> str:
    """``not JSON at byte 1234 of 5678 (Expecting ',' delimiter)``: where ``json.loads`` stopped, in bytes."""
    if isinstance(exc, json.JSONDecodeError):
        offset = len(exc.doc[: exc.pos].encode("utf-8")) if isinstance(exc.doc, str) else exc.pos
        return f"not JSON at byte {offset} of {len(content)} ({exc.msg}): a truncated or corrupt msprobe dump.json"
    return f"not a readable msprobe dump.json ({exc})"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` (one JSON object per step); raise GoldenCorruptError naming the line."""
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        raise GoldenCorruptError(f"{path}: cannot read metrics ({exc.strerror})") from None
    return parse_metrics(content, shown=str(path))


def parse_metrics(content: bytes, *, shown: str) -> list[dict[str, Any]]:
    """Parse the bytes of a ``metrics.jsonl``; raise GoldenCorruptError naming ``shown`` and the line, also for a
    step (``training/global_step``) logged twice: a compare keeps one row per step, and which row that would be
    is no choice to make silently."""
    rows, lines_of = [], {}
    try:
        lines = content.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise GoldenCorruptError(f"{shown}: not UTF-8 text ({exc.reason})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise GoldenCorruptError(f"{shown}:{lineno}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise GoldenCorruptError(f"{shown}:{lineno}: expected a JSON object per line")
        step = row.get("training/global_step")
        if step is not None and step in lines_of:
            raise GoldenCorruptError(
                f"{shown}:{lineno}: training/global_step {step} again (first at line {lines_of[step]}); expected one "
                "row per step: a resumed or restarted run logged it twice, rerun it from the start"
            )
        lines_of.setdefault(step, lineno)
        rows.append(row)
    return rows


def merged(dump: dict[str, Any], outputs: dict[str, Any] | None) -> dict[str, Any]:
    """``dump`` (a parsed dump.json) with the stage's inputs before its APIs and its outputs after them.

    That is the order the stage ran them in, so the first divergence is the earliest. Returns
    ``dump`` itself when ``outputs`` is None (an L0/L1/mix run has no stage_outputs.json).
    """
    if outputs is None:
        return dump
    data = outputs.get("data") or {}
    inputs = set(outputs.get("inputs") or [])
    before = {k: v for k, v in data.items() if k in inputs}
    after = {k: v for k, v in data.items() if k not in inputs}
    return {**dump, "data": {**before, **dump["data"], **after}}


def rank_digest(dump_sha256: str, outputs_sha256: str | None) -> str:
    """A rank's identity: its dump.json digest, joined with its stage_outputs.json digest when it has one.

    Two ranks with equal digests are identical statistic for statistic (the compare's fast path).
    """
    return dump_sha256 if outputs_sha256 is None else f"{dump_sha256}+{outputs_sha256}"
