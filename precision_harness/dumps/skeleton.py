"""A rank's two dump.json files read as columns from one parse: where the run's bytes are the golden's but for
the floating-point statistics, the run's columns are the golden's with the run's numbers.

Between a golden and a run of the same code, a dump.json differs in its numbers only: the same calls, tensors,
dtypes and shapes, written by the same msprobe in the same order. Parsing the run's dump and naming its rows
(:func:`~precision_harness.dumps.columns.columns`, a Python step per tensor) is then work already done for the
golden's. Here each side's bytes are split at its floating-point statistics (:data:`_STAT`: a ``Max``/``Min``/
``Mean``/``Norm`` key whose value is a float literal, one with a ``.`` or an exponent); what is left is the
*skeleton*. Where the two skeletons are equal (piece for piece), one parse names the rows of both, and each side's
statistics are its literals read by orjson (correctly rounded, as the dump's parse reads them). The ranks, steps and
stages of a run often share a skeleton (the same model, micro-batch shapes and call sequence), so a process keeps
the last parse (:class:`Template`, known by the golden's skeleton's sha256, :class:`Skeleton`) and parses again
only for another skeleton.

Which row and statistic each literal becomes is learnt from the parse itself, not assumed: the bytes are parsed
with literal ``k`` replaced by the marker ``-(k+1)e+290``, and the markers are found in the parsed columns'
statistics. A skeleton holding any number of exponent 280 or more (which a marker could be taken for) is not
read this way. The parse is used only where every marker stands exactly once, in a plain tensor row (its entry
rebuilt from the statistics, :meth:`~precision_harness.dumps.columns.Columns.entry`; a row with a non-finite or
null statistic keeps its four, and gets each side's numbers in place of the markers). Then no other part of the
parse (an item row of msprobe's parser, a scalar argument) holds a literal, so those parts are the same on both
sides. Anything else (another skeleton, a rank with a ``stage_outputs.json``, a NUL byte, a literal that reads as
a non-finite float, markers that land elsewhere, bytes that do not parse) declines, and the caller reads both
dumps as before: the verdict is the same either way (``tests/test_dump_skeleton.py``, every committed golden
and plant).

A golden recorded with an index (:mod:`~precision_harness.dumps.dump_index`: the template of its dump and its
literals, built at record time) is not split nor parsed at all: the run's skeleton is checked against the index's
digest, and only the run's literals are read.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import orjson

from precision_harness.dumps.columns import Columns, Layouts, columns
from precision_harness.dumps.files import DUMP, collector_paused, parse_dump_raw
from precision_harness.dumps.stage import StageSource
from precision_harness.errors import GoldenCorruptError

#: a rank's run columns, golden columns and the layouts they share
Sides = tuple[Columns, Columns, Layouts]

#: a floating-point statistic of a tensor entry: its key (group 1) and its float literal (group 2)
#: (the keys' alternatives factored by their first letters: a quarter less time a split than ``Max|Min|Mean|Norm``)
_STAT = re.compile(rb'("(?:M(?:ax|in|ean)|Norm)": )(-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+))(?=[\s,}\]])')
#: an exponent of 280 or more (a number a marker could be taken for), each case searched by its literal prefix
_HUGE = [re.compile(e + rb"\+?0*(?:2[89]\d|[3-9]\d\d|[1-9]\d{3,})") for e in (rb"e", rb"E")]
#: markers are -(k+1) * 10**290; a finite value at or below this is one
_MARKED = -1e289


@dataclass(frozen=True)
class Skeleton:
    """A dump.json's bytes without its floating-point statistics' literals, as a digest.

    Attributes:
        digest: sha256 of the bytes between the literals, joined by NUL (no valid dump.json holds a NUL byte, so
            the join is one-to-one), then of the literals' keys (``"Max": ``...).
        count: how many literals.
    """

    digest: bytes
    count: int


def read(content: bytes) -> tuple[Skeleton, list[bytes]]:
    """``content``'s skeleton and ``content`` split at its literals (``[text, key, literal, ..., text]``)."""
    parts = _STAT.split(content)
    digest = hashlib.sha256(b"\x00".join(parts[0::3]))
    digest.update(b"\x00" + b"".join(parts[1::3]))
    return Skeleton(digest.digest(), len(parts) // 3), parts


def floats(literals: list[bytes]) -> np.ndarray | None:
    """``(literals,)`` float64 of each literal as orjson reads it (as the dump's parse does; correctly rounded, as
    ``float``, in half its time); None where one reads as a non-finite float or is not a JSON number (an overflowing
    exponent, a leading zero: the parse judges those)."""
    try:
        values = np.array(orjson.loads(b"[" + b",".join(literals) + b"]"), dtype=np.float64)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    return values if values.shape == (len(literals),) and np.isfinite(values).all() else None


@dataclass
class Template:
    """One skeleton parsed with markers: the columns of every dump.json of that skeleton, but their statistics.

    Attributes:
        skeleton: the :class:`Skeleton` it reads.
        marked: the :class:`~precision_harness.dumps.columns.Columns` of the marked parse.
        at: ``((count,), (count,))`` int64: the row and statistic of literal ``k``.
        layouts: the :class:`~precision_harness.dumps.columns.Layouts` of the marked parse, shared by every
            dump read with this template.
        kept: the marked rows whose entry keeps its four statistics (one is non-finite or null).
    """

    skeleton: Skeleton
    marked: Columns
    at: tuple[np.ndarray, np.ndarray]
    layouts: Layouts
    kept: list[int]

    @classmethod
    def of(cls, parts: list[bytes], skeleton: Skeleton, *, shown: str) -> Template | None:
        """The template of a dump split as :func:`read` splits it (``parts``: its literals are replaced here by
        markers, and the list is emptied once joined, so that the parse is the only copy held); None where a
        number of its skeleton could be taken for a marker or the markers do not each land once in a plain tensor
        row (module docstring).

        Raises:
            GoldenCorruptError: the bytes do not parse (``shown`` names the file).
            ProbeUnavailableError: msprobe (its row parser) is not installed.
        """
        texts = b"\x00".join(parts[0::3])  # no number spans two texts
        if any(huge.search(texts) for huge in _HUGE):
            return None
        del texts
        parts[2::3] = [b"-%de+290" % (k + 1) for k in range(skeleton.count)]
        marked_bytes = b"".join(parts)
        parts.clear()
        layouts = Layouts()
        marked = columns(parse_dump_raw(marked_bytes, shown=shown), layouts)
        del marked_bytes
        at = _markers(marked, skeleton.count)
        if at is None:
            return None
        kept = [i for i in np.unique(at[0]).tolist() if marked.sources[i][3] is not None]
        return cls(skeleton, marked, at, layouts, kept)

    def columns(self, values: np.ndarray) -> Columns:
        """The columns of a dump of this skeleton whose literals read ``values`` (``(count,)`` float64)."""
        stats = self.marked.stats.copy()
        stats[self.at] = values
        if not self.kept:  # every marked row rebuilds its entry from the statistics
            return replace(self.marked, stats=stats)
        sources = list(self.marked.sources)
        for i in self.kept:  # a row with a non-finite or null statistic keeps its four: this dump's numbers in place
            keys, kind, grad, four = sources[i]
            sources[i] = (keys, kind, grad, [float(stats[i, j]) if _is_marker(x) else x for j, x in enumerate(four)])
        return replace(self.marked, sources=sources, stats=stats)


#: the template this process built last, and the skeleton it last could not build one of (the ranks of a stage
#: refuse alike)
_last: Template | None = None
_refused: Skeleton | None = None


def same_skeleton_columns(target: StageSource, golden: StageSource, rank: str) -> Sides | None:
    """The run's and the golden's :class:`~precision_harness.dumps.columns.Columns` of one rank, and the
    :class:`~precision_harness.dumps.columns.Layouts` they share, where the run's dump.json has the golden's
    skeleton (module docstring); None otherwise (nothing parsed where the skeletons differ), and where either
    side has a stage_outputs.json or a dump that does not parse (the caller's read names it in one line).

    Raises:
        GoldenCorruptError: the golden's dump.json is missing or edited (:meth:`StageSource.content`).
        ProbeUnavailableError: msprobe (its row parser) is not installed.
    """
    run = target.content(rank)
    if run is None or b"\x00" in run:
        return None
    index = golden.index(rank)
    if index is not None:
        return _indexed_columns(run, index)
    golden_bytes = golden.content(rank)
    if golden_bytes is None or b"\x00" in golden_bytes:
        return None
    with collector_paused():
        skeleton, parts = read(golden_bytes)
        del golden_bytes
        t_parts = _STAT.split(run)
        del run
        if not _same_skeleton(t_parts, parts):  # another skeleton: its literals are never read
            return None
        ran = floats(t_parts[2::3])
        del t_parts
        values = floats(parts[2::3]) if ran is not None else None  # the golden's converted only if the run's read
        if values is None:
            return None
        template = _template(skeleton, partial(_parsed, parts, skeleton, shown=f"{golden}/step0/{rank}/{DUMP}"))
        del parts
        return None if template is None else (template.columns(ran), template.columns(values), template.layouts)


def _indexed_columns(run: bytes, index: Any) -> Sides | None:
    """:func:`same_skeleton_columns` where the golden's rank has an index (``index``, a
    :class:`~precision_harness.dumps.dump_index.DumpIndex`): only the run's dump is split and read; the golden's
    template and literals are the index's."""
    with collector_paused():
        skeleton, parts = read(run)
        del run
        if skeleton != index.skeleton:  # another skeleton: its literals are never read
            return None
        ran = floats(parts[2::3])
        del parts
        template = _template(skeleton, index.template) if ran is not None else None
        return None if template is None else (template.columns(ran), template.columns(index.values()), template.layouts)


def _template(skeleton: Skeleton, build: Callable[[], Template | None]) -> Template | None:
    """The template of ``skeleton``: the last one built where it is of that skeleton, else ``build()`` (an index's
    :meth:`~precision_harness.dumps.dump_index.DumpIndex.template`, or :func:`_parsed`); None where it refused."""
    global _last, _refused
    if _last is not None and _last.skeleton == skeleton:
        return _last
    if _refused == skeleton:
        return None
    _last = _refused = None  # freed before the next is built
    _last = build()
    if _last is None:
        _refused = skeleton
    return _last


def _parsed(parts: list[bytes], skeleton: Skeleton, *, shown: str) -> Template | None:
    """:meth:`Template.of` ``parts``; None where the bytes do not parse (the row-by-row read names the file and the
    byte offset)."""
    try:
        return Template.of(parts, skeleton, shown=shown)
    except GoldenCorruptError:
        return None


def _same_skeleton(parts: list[bytes], golden: list[bytes]) -> bool:
    """Two dumps split as :func:`read` splits them have one skeleton: the same texts between their literals and the
    same keys, piece for piece (what :class:`Skeleton`'s digest stands for, compared here without joining and
    hashing the run's pieces)."""
    return len(parts) == len(golden) and parts[0::3] == golden[0::3] and parts[1::3] == golden[1::3]


def _is_marker(value: object) -> bool:
    return type(value) is float and -np.inf < value <= _MARKED


def _markers(marked: Columns, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(rows, statistics)`` where marker ``k`` stands, for every ``k`` below ``count``; None unless each stands
    exactly once, in a plain tensor row (module docstring)."""
    rows, stats = np.nonzero(np.isfinite(marked.stats) & (marked.stats <= _MARKED))
    k = np.rint(-marked.stats[rows, stats] / 1e290).astype(np.int64) - 1
    if len(k) != count or (count and (k.min() < 0 or k.max() >= count)):
        return None
    if count and not (np.bincount(k, minlength=count) == 1).all():
        return None
    sources = marked.sources
    if any(type(sources[i]) is not tuple for i in np.unique(rows).tolist()):
        return None
    order = np.empty(count, dtype=np.int64)
    order[k] = np.arange(count)
    return rows[order], stats[order]
