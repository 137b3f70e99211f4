"""A golden rank's ``dump.index``: the parse of its dump.json's skeleton and its literals, written at record time, so
that a compare reads the golden's columns without parsing its dump.json.

A compare of a rank whose run has the golden's skeleton (:mod:`~precision_harness.dumps.skeleton`) builds the
skeleton's :class:`~precision_harness.dumps.skeleton.Template` once: a parse of the whole dump and a Python step per
tensor, about 4 s at 65,000 calls, where splitting the run's dump and reading its literals takes under 1 s. The ranks
of a real run seldom share a skeleton (each rank's micro-batches have their own sequence lengths), so that parse is
paid per rank, stage and step. :func:`build` pays it once, when the golden is recorded, and the golden store keeps
its result beside the dump (``step_<n>/<stage>/step0/rank<k>/dump.index``, compressed and listed in the manifest with
its sha256 like every payload). :class:`DumpIndex` reads it back.

The file is plain data, never code (no pickle): a header line, a JSON head (:data:`VERSION`, the sha256 of the
dump.json content it indexes, the skeleton's digest and literal count), a JSON body (the dump's calls, the row names,
their calls, states, entries and layouts) and the arrays as little-endian bytes. Its bytes depend only on the dump's,
so an unchanged re-record writes the same file. :func:`build` keeps an index only where reading it back gives the
very template and literals the parse gave (every name, entry and statistic, bit for bit); otherwise, and for a dump
the skeleton read declines, there is none, and the compare parses the golden as before. An index of another
:data:`VERSION` or of other dump bytes is ignored the same way: it only ever saves time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from precision_harness.dumps.columns import Columns, Layouts
from precision_harness.dumps.files import DUMP, STAGE_OUTPUTS, collector_paused
from precision_harness.dumps.skeleton import Skeleton, Template, floats, read
from precision_harness.errors import GoldenCorruptError

#: the content name of a rank's index, beside its dump.json
INDEX = "dump.index"
#: the index format this module writes and reads; another is ignored (re-recording the golden writes this one)
VERSION = 1
_MAGIC = b"precision-harness dump.index\n"
#: the arrays of an index, in file order: ``(name, dtype, columns)`` (columns 0: one value a row or literal)
_ARRAYS = (
    ("stats", "<f8", 4),
    ("present", "|b1", 4),
    ("scalar", "|b1", 0),
    ("layout", "<i8", 0),
    ("at_rows", "<i8", 0),
    ("at_stats", "<i8", 0),
    ("values", "<f8", 0),
)
#: the types a layout key's shape may have (the hashable ones JSON gives back as they were)
_SHAPE_TYPES = {t.__name__: t for t in (list, str, int, float, bool, type(None))}


def index_name(dump_name: str) -> str:
    """The index's content name beside ``dump_name`` (``.../rank0/dump.json``)."""
    return dump_name.removesuffix(DUMP) + INDEX


def indexable(name: str, names: Container[str]) -> bool:
    """``name`` (a golden's content name, among ``names``) is a dump.json an index is written for: one whose rank has
    no stage_outputs.json beside it (``level: auto``'s L0 dump, whose rank is read with its outputs)."""
    return name.endswith(f"/{DUMP}") and name.removesuffix(DUMP) + STAGE_OUTPUTS not in names


def build(content: bytes, *, shown: str) -> bytes | None:
    """The index of a dump.json's ``content``; None where the skeleton read declines it (module docstring of
    :mod:`~precision_harness.dumps.skeleton`) or reading the index back would not give the same template.

    Raises:
        ProbeUnavailableError: msprobe (its row parser) is not installed and the dump needs it.
    """
    if b"\x00" in content:
        return None
    with collector_paused():
        skeleton, parts = read(content)
        values = floats(parts[2::3])
        if values is None:
            return None
        try:
            template = Template.of(parts, skeleton, shown=shown)
        except GoldenCorruptError:
            return None
        if template is None:
            return None
        sha = hashlib.sha256(content).hexdigest()
        data = _encode(template, values, sha)
        if data is None:
            return None
        back = DumpIndex.of(data, dump_sha256=sha, shown=shown)
        return data if back is not None and _same(back, template, values) else None


@dataclass(frozen=True)
class DumpIndex:
    """A read index: its head at once, its template and literals when asked for.

    Attributes:
        skeleton: the :class:`~precision_harness.dumps.skeleton.Skeleton` of the dump it indexes.
    """

    skeleton: Skeleton
    _data: bytes
    _body: slice
    _arrays: dict[str, tuple[str, int, int, int]]
    _shown: str

    @classmethod
    def of(cls, data: bytes, *, dump_sha256: str, shown: str) -> DumpIndex | None:
        """The index in ``data`` where it is of :data:`VERSION` and indexes the dump.json whose content sha256 is
        ``dump_sha256``; None otherwise (the compare parses the dump).

        Raises:
            GoldenCorruptError: ``data`` is not an index (``shown`` names the file).
        """
        try:
            head, body, arrays = _framing(data)
        except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
            raise GoldenCorruptError(f"{shown}: not a {INDEX} file; re-record the golden") from None
        if head.get("version") != VERSION or head.get("dump_sha256") != dump_sha256:
            return None
        try:
            skeleton = Skeleton(bytes.fromhex(head["skeleton"]), int(head["count"]))
        except (KeyError, TypeError, ValueError):
            raise GoldenCorruptError(f"{shown}: {INDEX} head unreadable; re-record the golden") from None
        return cls(skeleton, data, body, arrays, shown)

    def values(self) -> np.ndarray:
        """``(count,)`` float64: the golden's literals, in file order."""
        return self._array("values")

    def template(self) -> Template:
        """The :class:`~precision_harness.dumps.skeleton.Template` of the indexed skeleton (a Python step per row:
        about 0.3 s at 65,000 calls).

        Raises:
            GoldenCorruptError: the body does not read as an index's.
        """
        with collector_paused():  # a few hundred thousand acyclic objects
            try:
                return self._template()
            except (KeyError, TypeError, ValueError, IndexError, orjson.JSONDecodeError):
                raise GoldenCorruptError(f"{self._shown}: {INDEX} body unreadable; re-record the golden") from None

    def _template(self) -> Template:
        body = orjson.loads(self._data[self._body])
        layouts = Layouts()
        for dtype, shape_type, shape in body["layouts"]:
            layouts.code(dtype, list(shape) if shape_type == "list" else shape)
        keys, kinds = [tuple(k) for k in body["entry_keys"]], body["kinds"]
        sources = [
            (keys[s[0]], kinds[s[1]], s[2], s[3]) if type(s) is list else s
            for s in body["sources"]  # a list: a plain tensor row's Entry, by its keys' and type's numbers
        ]
        apis: list[str] = []
        for api, count in body["apis"]:
            apis += [api] * count
        states = [tuple(s) if type(s) is list else s for s in body["states"]]
        arrays = (self._array(n) for n in ("layout", "stats", "present", "scalar"))
        marked = Columns(body["names"], apis, sources, states, *arrays, layouts.keys, body["calls"])
        return Template(self.skeleton, marked, (self._array("at_rows"), self._array("at_stats")), layouts, body["kept"])

    def _array(self, name: str) -> np.ndarray:
        dtype, offset, count, width = self._arrays[name]
        array = np.frombuffer(self._data, dtype=dtype, count=count * max(width, 1), offset=offset).copy()
        return array.reshape(count, width) if width else array


def _encode(template: Template, values: np.ndarray, dump_sha256: str) -> bytes | None:
    """The index's bytes; None where a layout key's shape is of a type JSON would not give back."""
    marked, layouts = template.marked, template.layouts
    shapes = []
    for dtype, shape_type, shape in layouts.keys:
        if shape_type.__name__ not in _SHAPE_TYPES or _SHAPE_TYPES[shape_type.__name__] is not shape_type:
            return None
        shapes.append([dtype, shape_type.__name__, list(shape) if shape_type is list else shape])
    entry_keys: dict[tuple[str, ...], int] = {}
    kinds: dict[str, int] = {}
    sources = [
        [entry_keys.setdefault(s[0], len(entry_keys)), kinds.setdefault(s[1], len(kinds)), s[2], s[3]]
        if type(s) is tuple
        else s
        for s in marked.sources
    ]
    runs: list[list[Any]] = []
    for api in marked.apis:
        if runs and runs[-1][0] == api:
            runs[-1][1] += 1
        else:
            runs.append([api, 1])
    body = {
        "names": marked.names,
        "calls": marked.calls,
        "apis": runs,
        "states": marked.states,
        "sources": sources,
        "entry_keys": list(entry_keys),
        "kinds": list(kinds),
        "layouts": shapes,
        "kept": template.kept,
    }
    stats = marked.stats.copy()
    stats[template.at] = 0.0  # the markers: unique numbers, never read again (Template.columns writes the literals)
    arrays = {
        "stats": stats,
        "present": marked.present,
        "scalar": marked.scalar,
        "layout": marked.layout,
        "at_rows": template.at[0],
        "at_stats": template.at[1],
        "values": values,
    }
    head = {"version": VERSION, "dump_sha256": dump_sha256, "skeleton": template.skeleton.digest.hex()}
    head["count"] = template.skeleton.count
    try:
        body_bytes = orjson.dumps(body)
    except (TypeError, orjson.JSONEncodeError):  # a value JSON cannot hold (a tuple in an entry is caught by _same)
        return None
    blobs = [np.ascontiguousarray(arrays[name], dtype=dtype).tobytes() for name, dtype, _ in _ARRAYS]
    head["body_bytes"] = len(body_bytes)
    head["rows"] = len(marked.names)
    head_bytes = json.dumps(head, sort_keys=True).encode()
    return b"".join([_MAGIC, head_bytes, b"\n", body_bytes, *blobs])


def _framing(data: bytes) -> tuple[dict[str, Any], slice, dict[str, tuple[str, int, int, int]]]:
    """The head, the body's span and each array's ``(dtype, offset, rows, columns)``; ValueError where the sizes do
    not add up to ``data``'s."""
    if not data.startswith(_MAGIC):
        raise ValueError("no magic line")
    end = data.index(b"\n", len(_MAGIC))
    head = orjson.loads(data[len(_MAGIC) : end])
    start = end + 1
    body = slice(start, start + int(head["body_bytes"]))
    rows, count, offset = int(head["rows"]), int(head["count"]), body.stop
    arrays = {}
    for name, dtype, width in _ARRAYS:
        n = count if name in ("at_rows", "at_stats", "values") else rows
        arrays[name] = (dtype, offset, n, width)
        offset += n * max(width, 1) * np.dtype(dtype).itemsize
    if offset != len(data) or rows < 0 or count < 0:
        raise ValueError("sizes")
    return head, body, arrays


def _same(back: DumpIndex, template: Template, values: np.ndarray) -> bool:
    """``back`` reads as ``template`` and ``values``: every list equal, every array equal bit for bit."""
    got, want = back.template(), template
    lists = ("names", "apis", "sources", "states", "keys", "calls")
    if any(getattr(got.marked, n) != getattr(want.marked, n) for n in lists) or got.kept != want.kept:
        return False
    if (got.layouts.codes, got.layouts.dtypes, got.layouts.numels) != (
        want.layouts.codes,
        want.layouts.dtypes,
        want.layouts.numels,
    ):
        return False
    pairs = [(back.values(), values), *zip(got.at, want.at, strict=True)]
    stats = want.marked.stats.copy()
    stats[want.at] = 0.0
    pairs += [(got.marked.stats, stats)]
    pairs += [(getattr(got.marked, n), getattr(want.marked, n)) for n in ("present", "scalar", "layout")]
    return all(a.shape == b.shape and a.tobytes() == np.ascontiguousarray(b, dtype=a.dtype).tobytes() for a, b in pairs)
