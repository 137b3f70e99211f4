"""Pair a run's API calls with the golden's by aligning the two call streams of one rank's ``dump.json``.

msprobe numbers calls per API type (``Tensor.__mul__.23.forward``: the 24th ``Tensor.__mul__`` of the
dump), so one inserted, removed or replaced call shifts the index of every later call of its type, and
pairing by name compares each of them with its neighbour. An upgrade does exactly that: transformers
5.23.0 forms RoPE's frequencies with one ``Tensor.__mul__`` where 5.10.4 used a ``Tensor.__matmul__``;
CANN and torch_npu swap op sequences for fused ops (``npu_rms_norm``, ``npu_rotary_mul``); torch changes
decompositions. msprobe's own compare offers a fuzzy match (``-fm``) for the same reason.

:func:`pair_calls` aligns the two streams of calls, each named by its :func:`call_name` (the API
without its index) and the dtypes and shapes of its tensors, with a Levenshtein alignment
(``rapidfuzz.distance.Levenshtein.opcodes``, bit-parallel and banded by :data:`SCORE_HINT`: about
0.1 s at 10^5 calls a side, benchmarks/alignment.py). Inside each stretch that does not align, calls
of the same name are paired again by name alone (``rapidfuzz.distance.Indel``, a longest common
subsequence), so a call whose dtype changed stays paired and is compared as such. A call paired so whose
tensors keep their dtypes but not their shapes (a causal mask built ``[18, 18]`` where the golden built
``[1, 1, 18, 18]``, a view, a broadcast: transformers 4.57.3 against 5.10.4) is not a pair: the same op
computed another intermediate, a changed code path judged by the values leaving it. What is left are the
changed blocks (:class:`ChangedBlock`): the golden's calls there were replaced by the run's, and no other
pairing moved.

Everything that reads both sides of a stage by name reads the golden through this pairing, renamed to
the run's names (:func:`aligned_golden` for a dump, :func:`aligned_rows` for its parsed rows,
:func:`aligned_golden_columns` for its columns): the compare, where the change entered, the judgement and
msprobe's own table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
from rapidfuzz.distance import Indel, Levenshtein

from precision_harness.dumps.columns import NO_LAYOUT, Columns, Layouts

#: the API directions msprobe names calls with
DIRECTIONS = ("forward", "backward")
#: the edit distance the alignment expects (rapidfuzz's ``score_hint``): an upgrade changes a few calls per
#: forward, so a banded alignment around the diagonal finds them in time linear in the dump (it widens the band
#: by doubling when the distance is larger): 0.1 s at 10^5 calls where the full one takes 2 s
SCORE_HINT = 64
#: the largest stretch (golden calls x run calls) paired again by name: beyond it, memory (the LCS's
#: bit matrix) grows past what a check may take, and the dumps are too different to align anyway
MAX_BY_NAME_CELLS = 20_000_000
#: below this share of the larger side's calls paired, two dumps are too different to align: another
#: model, level or scenario, not a changed code path
MIN_PAIRED_SHARE = 0.5


def call_name(api: str) -> str:
    """An API key without msprobe's call index: what the call is, not which call it is.

    ``Tensor.__mul__.23.forward`` -> ``Tensor.__mul__.forward`` (L1: ``<prefix>.<api>.<index>.<direction>``);
    ``Module.model.norm.Qwen2RMSNorm.forward.0`` -> ``Module.model.norm.Qwen2RMSNorm.forward`` (L0's module
    keys end with their index).
    """
    parts = api.split(".")
    if len(parts) >= 3 and parts[-1] in DIRECTIONS and parts[-2].isdigit():
        return ".".join(parts[:-2] + parts[-1:])
    if len(parts) >= 3 and parts[-1].isdigit() and parts[-2] in DIRECTIONS:
        return ".".join(parts[:-1])
    return api


def short_name(api: str) -> str:
    """A call's name as a verdict lists it: ``Tensor.__mul__.23.forward`` -> ``Tensor.__mul__``."""
    name = call_name(api)
    for direction in DIRECTIONS:
        if name.endswith("." + direction):
            name = name[: -len(direction) - 1] + (".backward" if direction == "backward" else "")
    return name


def signature(api: str, entry: Any) -> tuple[Any, ...]:
    """What pairs calls reliably: the call's name and the dtype and shape of each of its tensors, in order."""
    found: list[Any] = [call_name(api)]
    _layouts(entry, found)
    return tuple(found)


def _layouts(node: Any, found: list[Any]) -> None:
    """Append ``(dtype, shape)`` of every tensor entry below ``node`` (the walk of
    :func:`precision_harness.dumps.rows.tensors`, without its paths: this runs once per call of both dumps)."""
    if isinstance(node, dict):
        if "dtype" in node and "Max" in node:
            shape = node.get("shape")
            found.append((node["dtype"], tuple(shape) if isinstance(shape, list) else shape))
            return
        for value in node.values():
            if isinstance(value, (dict, list)):
                _layouts(value, found)
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, (dict, list)):
                _layouts(value, found)


@dataclass(frozen=True)
class ChangedBlock:
    """A stretch of calls that differs between the two streams: the golden's calls -> the run's.

    Attributes:
        golden: the golden's dump.json keys there, in execution order (empty: calls were inserted).
        target: the run's keys there (empty: calls were removed).
        before: the paired call before the block, as ``(run key, golden key)``; None at the start.
        after: the paired call after it; None at the end.
    """

    golden: tuple[str, ...]
    target: tuple[str, ...]
    before: tuple[str, str] | None = None
    after: tuple[str, str] | None = None

    @property
    def what(self) -> str:
        """``"Tensor.__matmul__ -> Tensor.__mul__"``; a removed or inserted side reads ``(nothing)``; the same calls
        with other shapes read ``"Tensor.__le__, Tensor.__and__ (other shapes)"``."""
        golden, target = _names(self.golden), _names(self.target)
        return f"{golden} (other shapes)" if golden == target else f"{golden} -> {target}"


def _names(apis: Sequence[str]) -> str:
    """``Tensor.pow, Tensor.mean, Tensor.__add__`` (repeats of one name collapsed as ``Tensor.__mul__ x2``)."""
    if not apis:
        return "(nothing)"
    out: list[list[Any]] = []
    for api in apis:
        name = short_name(api)
        if out and out[-1][0] == name:
            out[-1][1] += 1
        else:
            out.append([name, 1])
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in out)


@dataclass
class Pairing:
    """How one rank's calls pair: ``pairs`` in execution order, the changed ``blocks`` between them.

    Attributes:
        pairs: ``(run key, golden key)`` of every paired call, in execution order.
        blocks: the stretches that differ (:class:`ChangedBlock`), in execution order.
        golden_calls: how many calls the golden's dump holds.
        target_calls: how many the run's holds.
    """

    pairs: list[tuple[str, str]] = field(default_factory=list)
    blocks: list[ChangedBlock] = field(default_factory=list)
    golden_calls: int = 0
    target_calls: int = 0

    @property
    def paired_share(self) -> float:
        """Paired calls over the larger side's calls (1.0 for two empty dumps)."""
        larger = max(self.golden_calls, self.target_calls)
        return len(self.pairs) / larger if larger else 1.0

    @property
    def alignable(self) -> bool:
        """At least :data:`MIN_PAIRED_SHARE` of the calls pair: the same program, with changed blocks at most."""
        return self.paired_share >= MIN_PAIRED_SHARE

    def golden_of(self) -> dict[str, str]:
        """``{run key: golden key}`` of every paired call."""
        return dict(self.pairs)


def pair_calls(target: dict[str, Any], golden: dict[str, Any]) -> Pairing:
    """Align the calls of two parsed dump.json files of one rank (module docstring).

    Args:
        target: the run's parsed dump.json (``{"data": {api: entry}}``).
        golden: the golden's.

    Returns:
        The pairing; where both dumps name the same calls in the same order and no call's tensors changed shape,
        every call pairs with its namesake and nothing is aligned (the common case, linear).
    """
    t_apis, g_apis = list(target["data"]), list(golden["data"])
    pairing = Pairing(golden_calls=len(g_apis), target_calls=len(t_apis))
    if t_apis == g_apis and not any(_reshaped_call(a, target["data"][a], golden["data"][a]) for a in t_apis):
        pairing.pairs = list(zip(t_apis, g_apis, strict=True))
        return pairing
    ids: dict[tuple[Any, ...], int] = {}  # small integers: rapidfuzz compares them without hashing tuples
    t_sig = [ids.setdefault(signature(a, target["data"][a]), len(ids)) for a in t_apis]
    g_sig = [ids.setdefault(signature(a, golden["data"][a]), len(ids)) for a in g_apis]
    sigs = list(ids)
    matched: list[tuple[int, int]] = []
    for op in Levenshtein.opcodes(g_sig, t_sig, score_hint=SCORE_HINT):
        if op.tag == "equal":
            matched += [(op.src_start + k, op.dest_start + k) for k in range(op.src_end - op.src_start)]
        else:
            found = _by_name(g_apis, t_apis, (op.src_start, op.src_end), (op.dest_start, op.dest_end))
            matched += [(i, j) for i, j in found if not reshaped(sigs[g_sig[i]], sigs[t_sig[j]])]
    pairing.pairs = [(t_apis[j], g_apis[i]) for i, j in matched]
    pairing.blocks = _blocks(matched, g_apis, t_apis)
    return pairing


def reshaped(golden: tuple[Any, ...], target: tuple[Any, ...]) -> bool:
    """Two :func:`signature` of one API whose tensors have the same dtypes, in order, and not the same shapes: the op
    computed another intermediate (a mask ``[18, 18]`` for ``[1, 1, 18, 18]``), a changed code path, not a pair."""
    if len(golden) != len(target) or golden[0] != target[0] or golden == target:
        return False
    return all(g[0] == t[0] for g, t in zip(golden[1:], target[1:], strict=True))


def _reshaped_call(api: str, target: Any, golden: Any) -> bool:
    """The call of one key on both sides computed another intermediate (:func:`reshaped`); its signatures are built
    only where a shape differs (:func:`_shape_moved`: the common case, every call the golden's, stays linear)."""
    return _shape_moved(target, golden) and reshaped(signature(api, golden), signature(api, target))


def _shape_moved(target: Any, golden: Any) -> bool:
    """Some tensor entry below ``target`` has another shape than the one in its place below ``golden`` (or the two
    differ in form): :func:`_layouts`' walk, both sides at once, without building anything."""
    if isinstance(target, dict):
        if not isinstance(golden, dict):
            return True
        if "dtype" in target and "Max" in target:
            return target.get("shape") != golden.get("shape")
        return any(
            _shape_moved(value, golden.get(key)) for key, value in target.items() if isinstance(value, (dict, list))
        )
    if isinstance(target, list):
        if not isinstance(golden, list) or len(golden) != len(target):
            return True
        return any(_shape_moved(t, g) for t, g in zip(target, golden, strict=True) if isinstance(t, (dict, list)))
    return False


def _by_name(g_apis: list[str], t_apis: list[str], g_span: tuple[int, int], t_span: tuple[int, int]) -> list:
    """Inside a stretch that did not align, pair the calls of the same name (their dtypes or shapes changed)."""
    (g0, g1), (t0, t1) = g_span, t_span
    if g0 == g1 or t0 == t1 or (g1 - g0) * (t1 - t0) > MAX_BY_NAME_CELLS:
        return []
    g_names, t_names = [call_name(a) for a in g_apis[g0:g1]], [call_name(a) for a in t_apis[t0:t1]]
    found = []
    for op in Indel.opcodes(g_names, t_names):
        if op.tag == "equal":
            found += [(g0 + op.src_start + k, t0 + op.dest_start + k) for k in range(op.src_end - op.src_start)]
    return found


def _blocks(matched: list[tuple[int, int]], g_apis: list[str], t_apis: list[str]) -> list[ChangedBlock]:
    """The stretches between consecutive pairs (and before the first, after the last) that hold any call."""
    bounds = [(-1, -1), *matched, (len(g_apis), len(t_apis))]
    blocks = []
    for (gi, ti), (gj, tj) in pairwise(bounds):
        if gj - gi > 1 or tj - ti > 1:
            before = (t_apis[ti], g_apis[gi]) if gi >= 0 else None
            after = (t_apis[tj], g_apis[gj]) if gj < len(g_apis) else None
            blocks.append(ChangedBlock(tuple(g_apis[gi + 1 : gj]), tuple(t_apis[ti + 1 : tj]), before, after))
    return blocks


def aligned_golden(golden: dict[str, Any], pairing: Pairing) -> dict[str, Any]:
    """``golden`` (a parsed dump.json) with each paired call renamed to its run partner's key, in the run's
    order; the calls of changed blocks are left out. Read by name, it answers for the run's calls."""
    data = golden["data"]
    return {**golden, "data": {t_api: data[g_api] for t_api, g_api in pairing.pairs}}


def aligned_rows(golden_rows: dict[str, dict[str, Any]], pairing: Pairing) -> dict[str, dict[str, Any]]:
    """msprobe's rows of the golden (:func:`precision_harness.dumps.rows.rows`) named as the run's calls they pair
    with, the rows of changed blocks left out: :func:`aligned_golden` without parsing the golden again."""
    rename = {g_api: t_api for t_api, g_api in pairing.pairs}
    if all(t == g for g, t in rename.items()):
        return golden_rows if not pairing.blocks else {n: r for n, r in golden_rows.items() if r["api"] in rename}
    aligned = {}
    for name, row in golden_rows.items():
        t_api = rename.get(str(row["api"]))
        if t_api is not None:
            aligned[t_api + name[len(str(row["api"])) :]] = row
    return aligned


@dataclass(frozen=True)
class Aligned:
    """The golden's columns read at the run's rows (absent rows: no statistic, layout :data:`NO_LAYOUT`)."""

    stats: np.ndarray
    present: np.ndarray
    layout: np.ndarray
    scalar: np.ndarray


def aligned_golden_columns(t: Columns, g: Columns) -> tuple[np.ndarray, Aligned]:
    """``(rows,)`` the golden's row of each run row (-1: none), and the golden's columns in the run's rows."""
    n = len(t.names)
    if t.names == g.names:
        return np.arange(n), Aligned(g.stats, g.present, g.layout, g.scalar)
    at = dict(zip(g.names, range(len(g.names)), strict=True))
    g_at = np.array([at.get(name, -1) for name in t.names], dtype=np.int64)
    paired, rows_ = g_at >= 0, g_at[g_at >= 0]
    aligned = Aligned(np.full((n, 4), np.nan), np.zeros((n, 4), dtype=bool), np.full(n, NO_LAYOUT), np.zeros(n, bool))
    aligned.stats[paired], aligned.present[paired] = g.stats[rows_], g.present[rows_]
    aligned.layout[paired], aligned.scalar[paired] = g.layout[rows_], g.scalar[rows_]
    return g_at, aligned


def blank_rows(t: Columns, golden: Aligned, paired: np.ndarray, layouts: Layouts) -> np.ndarray:
    """``(rows,)`` bool: the run's rows paired with a golden row (``paired``, ``golden`` aligned to the run's rows by
    :func:`aligned_golden_columns`) that neither side gives anything to compare: one layout on both sides whose dtype
    (``dtype``, else ``type``) is null, so not a tensor's, and no statistic nor scalar value on either side. These
    are the arguments msprobe wrote as null (a ``linear`` without bias), about one row in twenty of a transformer's
    dump; the compare's row-by-row check finds nothing in them."""
    null = np.array([not key[0] for key in layouts.keys] + [False], dtype=bool)[t.layout]  # NO_LAYOUT: the False
    blank = paired & null & (t.layout == golden.layout) & ~t.scalar & ~golden.scalar
    return blank & ~t.present.any(axis=1) & ~golden.present.any(axis=1)
