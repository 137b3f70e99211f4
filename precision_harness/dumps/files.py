"""The files of a verl-layout dump: ``dump.json``, ``stage_outputs.json``, ``metrics.jsonl``, and rank digests.

A run (and a golden, and verl's ``global_profiler.save_path``) holds
``step_<n>/<stage>/step0/rank<r>/dump.json`` (msprobe's statistics, one entry per API call) and
``metrics.jsonl`` (one JSON object per training step). Parsing errors raise
:class:`~precision_harness.errors.GoldenCorruptError` naming the file, whichever side it came from.

``stage_outputs.json`` (``level: auto``): a stage's own inputs and outputs beside its L0
``dump.json``. An L0 dump sees module boundaries only; what a PPO stage computes outside every
module (log-probs and entropy after the LM head, values, per-micro-batch losses, gradient norms,
the advantages and returns an update consumes) is invisible to it. The built-in runner
(:mod:`precision_harness.runs.numerics.stage_outputs`) writes their statistics in msprobe's ``dump.json`` format:

.. code-block:: json

    {"task": "statistics", "level": "auto", "framework": "pytorch",
     "inputs": ["Stage.advantages.0.forward"],
     "data": {"Stage.advantages.0.forward": {"input_args": [{"type": "torch.Tensor", "dtype": ..., "Max": ...}]},
              "Stage.pg_loss.0.forward": {"output": [{"type": "torch.Tensor", "shape": [], "Max": ...}]}}}

Rows are named the way msprobe's compare names them (``Stage.pg_loss.1.forward.output.0``: the
loss of micro-batch 1), so the compare, the tolerance and the verdicts treat them as any API row.
This module imports neither torch nor msprobe.

``dump.json`` is parsed with orjson (:func:`parse_dump`), about twice as fast as ``json.loads``, with the
garbage collector paused: a dump is millions of small acyclic objects, and the collections their allocation
sets off cost more than the parse (measured here: 0.26 s parsing a 24 MB dump, 1.3 s with collections).
orjson refuses the bare ``NaN``/``Infinity``/``-Infinity`` msprobe writes for non-finite statistics (Python's
``json.dump`` default); :func:`quote_non_finite` quotes each one standing as a value, and :func:`parse_dump`
turns them back into floats (:func:`parse_dump_raw` leaves them for a reader that maps them itself, the
compare's columns). A file orjson cannot read goes to ``json.loads``, whose error names the byte offset.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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


def load_dump(path: Path, *, raw: bool = False) -> dict[str, Any]:
    """Read an msprobe ``dump.json`` (bare NaN/Infinity allowed; with ``raw``, as :func:`parse_dump_raw` reads
    them); raise GoldenCorruptError naming the file."""
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        raise GoldenCorruptError(f"{path}: not a readable msprobe dump.json ({exc}); re-record the golden") from None
    return (parse_dump_raw if raw else parse_dump)(content, shown=str(path))


def parse_dump(content: bytes, *, shown: str) -> dict[str, Any]:
    """Parse the bytes of an msprobe ``dump.json`` (bare NaN/Infinity allowed) into the objects ``json.loads``
    gives.

    Raises:
        GoldenCorruptError: not JSON (the message names ``shown`` and the byte offset of the error), or no
            ``data`` mapping.
    """
    data, quoted = _parse(content, shown)
    return restore_non_finite(data) if quoted else data


def parse_dump_raw(content: bytes, *, shown: str) -> dict[str, Any]:
    """:func:`parse_dump` with each bare ``NaN``/``Infinity``/``-Infinity`` left as its :data:`NON_FINITE` string,
    for a reader that maps them as it reads the statistics (a walk over every object to restore them costs
    about what the parse does). Raises as :func:`parse_dump`."""
    return _parse(content, shown)[0]


#: the strings :func:`quote_non_finite` puts in place of Python's bare non-finite tokens, and their floats. The
#: NUL they start with stands in no string of a dump orjson is given (:func:`quote_non_finite`), so a string so
#: spelt is one of these tokens.
NON_FINITE = {"\x00NaN": math.nan, "\x00Infinity": math.inf, "\x00-Infinity": -math.inf}
_TOKENS = (b"NaN", b"Infinity")
_SPACE = b" \t\r\n"


def quote_non_finite(content: bytes) -> tuple[bytes, int] | None:
    """``content`` with every bare ``NaN``, ``Infinity`` and ``-Infinity`` that stands as a value written as
    its :data:`NON_FINITE` string, and how many; None where ``content`` holds a NUL (``\\u0000`` or a raw byte),
    so that a sentinel could not be told from a string of the dump.

    A token stands as a value where the first non-blank byte before it is ``:``, ``,`` or ``[`` and the first
    after it is ``,``, ``]`` or ``}``; a token elsewhere is left as it is. No string of the dump can be changed
    by a parse that succeeds: a token inside a string that looks so placed gets a ``"`` inserted after a byte
    that is not a backslash, which ends the string, and the ``\\u0000`` after it then stands outside any string,
    which no JSON parser accepts; the caller then reads the original bytes with ``json.loads``.
    """
    if b"\\u0000" in content or b"\x00" in content:
        return None
    spans = []
    for token in _TOKENS:
        at = content.find(token)
        while at >= 0:
            start = at - 1 if token == b"Infinity" and content[at - 1 : at] == b"-" else at
            end = at + len(token)
            if _value_at(content, start, end):
                spans.append((start, end))
            at = content.find(token, end)
    if not spans:
        return content, 0
    spans.sort()
    parts, last = [], 0
    for start, end in spans:
        parts += [content[last:start], b'"\\u0000', content[start:end], b'"']
        last = end
    parts.append(content[last:])
    return b"".join(parts), len(spans)


def _value_at(content: bytes, start: int, end: int) -> bool:
    """The bytes ``content[start:end]`` stand as a JSON value (:func:`quote_non_finite`)."""
    before = start - 1
    while before >= 0 and content[before] in _SPACE:
        before -= 1
    after = end
    while after < len(content) and content[after] in _SPACE:
        after += 1
    return before >= 0 and content[before] in b":,[" and after < len(content) and content[after] in b",]}"


def _parse(content: bytes, shown: str) -> tuple[dict[str, Any], int]:
    """The parsed dump and how many non-finite tokens it holds as :data:`NON_FINITE` strings."""
    quoted = quote_non_finite(content)
    with collector_paused():
        data, count = _fast_parse(quoted), (quoted[1] if quoted else 0)
        if data is None:
            count = 0
            try:
                data = json.loads(content)
            except ValueError as exc:
                raise GoldenCorruptError(f"{shown}: {_where(content, exc)}; re-record it or rerun the stage") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise GoldenCorruptError(f"{shown}: no 'data' mapping; not an msprobe dump.json")
    return data, count


def _fast_parse(quoted: tuple[bytes, int] | None) -> Any:
    """orjson's parse of the quoted content; None where there is none or orjson cannot read it."""
    if quoted is None:
        return None
    try:
        return orjson.loads(quoted[0])
    except orjson.JSONDecodeError:
        return None


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (a parse allocates no cycle), back as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def restore_non_finite(node: Any) -> Any:
    """``node`` (a dict or list of a parsed dump; anything else is returned as it is) with every
    :data:`NON_FINITE` string below it replaced by its float, in place."""
    if not isinstance(node, (dict, list)):
        return node
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        if type(value) is str:
            if value in NON_FINITE:
                node[key] = NON_FINITE[value]
        elif isinstance(value, (dict, list)):
            restore_non_finite(value)
    return node


def restored_calls(dump: dict[str, Any], calls: Iterable[str]) -> dict[str, Any]:
    """``dump`` (parsed raw: :func:`load_dump` with ``raw=True``) cut to those of ``calls`` it holds, in that order,
    their non-finite values restored (in place): what a reader of a few calls of a large dump needs, without
    restoring and keeping every call."""
    data = dump["data"]
    return {**dump, "data": {key: restore_non_finite(data[key]) for key in calls if key in data}}


def cut_calls(content: bytes, calls: list[str], span: tuple[int, int]) -> dict[str, Any] | None:
    """:func:`restored_calls` of a dump.json's ``content`` for its calls ``calls[start:end]`` (``calls``: every call of
    the dump, its ``data`` keys in order; ``span``: ``(start, end)``), parsed from the bytes of those calls, of its
    last call and of the head before ``data`` only: milliseconds, where the whole parse of a 65,000-call dump takes a
    second. None where the bytes do not cut so (``data`` not the last key, as msprobe writes it; a key spelt
    otherwise; what is cut does not parse to exactly the calls asked for): the caller parses the whole dump."""
    start, end = span
    data_at = content.find(b'"data"')
    if data_at < 0 or not 0 <= start < end <= len(calls):
        return None
    cut = _cut(content, calls, (start, end), data_at)
    if cut is None or (end < len(calls) and _cut(content, calls, (len(calls) - 1, len(calls)), data_at) is None):
        return None  # the last call read up to the root's end: nothing follows data
    try:
        head = parse_dump_raw(content[:data_at] + b'"data": {}}', shown="head")
    except GoldenCorruptError:
        return None
    if head["data"]:
        return None
    return {**head, "data": {key: restore_non_finite(entry) for key, entry in cut.items()}}


def _cut(content: bytes, calls: list[str], span: tuple[int, int], data_at: int) -> dict[str, Any] | None:
    """``{call: entry}`` of ``calls[start:end]`` parsed raw from their bytes, the last call's up to the root's closing
    brace; None where they do not parse to exactly those calls."""
    start, end = span
    first = _key_at(content, calls[start], data_at)
    after = _key_at(content, calls[end], first) if end < len(calls) and first is not None else None
    if first is None or (end < len(calls) and after is None):
        return None
    if after is None:  # up to the root's closing brace: the data's closes the cut
        text = content[first:].rstrip().removesuffix(b"}").rstrip()
    else:
        text = content[first:after].rstrip().removesuffix(b",") + b"}"
    try:
        cut = parse_dump_raw(b'{"data": {' + text + b"}", shown="calls")
    except GoldenCorruptError:
        return None
    return cut["data"] if len(cut) == 1 and list(cut["data"]) == calls[start:end] else None


def _key_at(content: bytes, key: str, start: int) -> int | None:
    """Where ``"key":`` first stands in ``content`` from ``start`` (the key as JSON spells it without escapes)."""
    found = re.compile(re.escape(orjson.dumps(key)) + rb"\s*:").search(content, start)
    return found.start() if found else None


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
