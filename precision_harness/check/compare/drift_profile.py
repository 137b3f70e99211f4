"""A stage's drift profile: ``(rank, order, tensor, worst tolerance ratio)`` of every compared row, kept as columns.

A failing stage keeps its whole profile (a report plots it; where the change entered and the replay read it). At
7B a stage's profile is about 1.6 M rows: as a list of tuples that is about 350 MB a stage, one tuple, one int,
one float and one copy of the row's name per row (a rank's names come back from the rank pool as new strings).
Here a rank's points are kept as one :class:`_Chunk` of columns, 12 bytes a row: an int64 order, a float64 ratio
and the name list, which the ranks of one stage share (they name the same rows). Readers see the same points in
the same order, as tuples (:class:`DriftProfile` reads as a sequence of them). The ratios are NaN-free where the
compare makes them (:class:`~precision_harness.check.compare.stat_table.StatTable`'s are 0 where a statistic is absent).

A rank's result crosses the rank pool's pipe pickled, its names with it. A process keeps one copy of equal name
lists it unpickles while an earlier one is alive (:func:`_shared`): the results of a stage compared ahead wait
whole for their stage's turn (:func:`~precision_harness.check.compare.rank_pool.ahead`), about 17 MB of names a
rank at 7B.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby, islice, repeat
from typing import overload

import numpy as np

#: ``(rank, order, tensor, worst tolerance ratio of its statistics)`` of one compared row
ProfilePoint = tuple[str, int, str, float]


@dataclass(frozen=True)
class _Chunk:
    """Consecutive points of one rank: ``orders`` ``(n,)`` int64, ``names`` n row names, ``ratios`` ``(n,)``
    float64."""

    rank: str
    orders: np.ndarray
    names: list[str]
    ratios: np.ndarray

    def points(self, start: int = 0, stop: int | None = None, step: int = 1) -> Iterator[ProfilePoint]:
        orders, ratios = self.orders[start:stop:step].tolist(), self.ratios[start:stop:step].tolist()
        names = islice(self.names, start, stop, step)
        return zip(repeat(self.rank), orders, names, ratios)


class DriftProfile:
    """The points of a drift profile in execution order (module docstring): appended one by one or as a table's
    columns, and packed into one :class:`_Chunk` per run of one rank when read, pickled (a rank's result
    leaves the rank pool so) or added to; compares equal to any sequence of the same points."""

    __slots__ = ("_chunks", "_pending")

    def __init__(self, points: Iterable[ProfilePoint] = ()) -> None:
        self._chunks: list[_Chunk] = []
        self._pending: list[ProfilePoint | _Chunk] = list(points)  # added since the last pack, in order

    def append(self, point: ProfilePoint) -> None:
        self._pending.append(point)

    def extend_columns(self, rank: str, span: tuple[int, int], names: list[str], ratios: np.ndarray) -> None:
        """Add the rows ``span`` (``(start, stop)``, their orders) of one rank's judged table: ``names`` and
        ``ratios`` (``(rows,)`` float64, the rows' worst ratios) indexed by order, taken as columns at once."""
        start, stop = span
        if start < stop:
            kept = names if (start, stop) == (0, len(names)) else names[start:stop]
            self._pending.append(_Chunk(rank, np.arange(start, stop, dtype=np.int64), kept, ratios[start:stop]))

    def pack(self) -> DriftProfile:
        """What was added since the last pack as columns, one :class:`_Chunk` per run of one rank; returns itself."""
        pending, self._pending = self._pending, []
        group: list[ProfilePoint | _Chunk] = []
        for piece in pending:
            if group and _rank(piece) != _rank(group[0]):
                self._add(_merged(group))
                group = []
            group.append(piece)
        if group:
            self._add(_merged(group))
        return self

    def __iadd__(self, other: DriftProfile) -> DriftProfile:
        """Add ``other``'s points after these, its chunks as they are (a rank's into its stage's)."""
        self.pack()
        for chunk in other.pack()._chunks:
            self._add(chunk)
        return self

    def _add(self, chunk: _Chunk) -> None:
        last = self._chunks[-1] if self._chunks else None
        if last is not None and last.names is not chunk.names and last.names == chunk.names:
            chunk = _Chunk(chunk.rank, chunk.orders, last.names, chunk.ratios)  # another rank of the same rows
        self._chunks.append(chunk)

    def max_ratio(self, default: float = 0.0) -> float:
        """The largest worst ratio of any point (``inf`` for a structural change), ``default`` with none."""
        return max((float(c.ratios.max()) for c in self.pack()._chunks), default=default)

    def worst(self) -> ProfilePoint | None:
        """The first point of the largest ratio, as ``max(profile, key=ratio)`` gives it; None for an empty one."""
        best: ProfilePoint | None = None
        for chunk in self.pack()._chunks:
            if np.isnan(chunk.ratios).any():  # max() keeps a NaN it meets first: read as it does
                candidates = chunk.points()
            else:
                i = int(np.argmax(chunk.ratios))  # the chunk's first of its largest
                candidates = chunk.points(i, i + 1)
            for point in candidates:
                if best is None or point[3] > best[3]:
                    best = point
        return best

    def earliest_moved(self, up_to: int) -> tuple[int, str, str, float] | None:
        """``min((order, rank, tensor, ratio))`` of the points with a ratio above 0 and an order at most ``up_to``
        (the earliest row that moved at all, its ties by rank and name), read from the columns; None with none."""
        found = []
        for chunk in self.pack()._chunks:
            moved = (chunk.ratios > 0) & (chunk.orders <= up_to)
            if moved.any():
                first = chunk.orders[moved].min()
                at = np.flatnonzero(moved & (chunk.orders == first)).tolist()
                found += [(int(first), chunk.rank, chunk.names[i], float(chunk.ratios[i])) for i in at]
        return min(found, default=None)

    def __len__(self) -> int:
        return sum(len(c.orders) for c in self.pack()._chunks)

    def __bool__(self) -> bool:
        return bool(self._pending or self._chunks)

    def __iter__(self) -> Iterator[ProfilePoint]:
        for chunk in self.pack()._chunks:
            yield from chunk.points()

    @overload
    def __getitem__(self, index: int) -> ProfilePoint: ...
    @overload
    def __getitem__(self, index: slice) -> list[ProfilePoint]: ...
    def __getitem__(self, index: int | slice) -> ProfilePoint | list[ProfilePoint]:
        if isinstance(index, int):
            n = len(self)
            if not -n <= index < n:
                raise IndexError("drift profile index out of range")
            return next(islice(self, index % n, None))
        if index.step is not None and index.step < 0:
            return list(self)[index]
        return self._sliced(*index.indices(len(self)))

    def _sliced(self, start: int, stop: int, step: int) -> list[ProfilePoint]:
        found: list[ProfilePoint] = []
        offset = 0  # the index of the current chunk's first point
        for chunk in self._chunks:
            n = len(chunk.orders)
            if start < offset + n and start < stop:
                first = start - offset
                found += chunk.points(first, min(stop - offset, n), step)
                start += -(-(n - first) // step) * step
            offset += n
        return found

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DriftProfile | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"DriftProfile({len(self)} points)"

    def __getstate__(self) -> list[_Chunk]:
        # a rank's points cross the pool's pipe as columns, their names as a list a weak reference can hold
        return [_Chunk(c.rank, c.orders, _Names(c.names), c.ratios) for c in self.pack()._chunks]

    def __setstate__(self, state: list[_Chunk]) -> None:
        self._chunks, self._pending = [_Chunk(c.rank, c.orders, _shared(c.names), c.ratios) for c in state], []


class _Names(list):
    """A chunk's row names as unpickled: a list a weak reference can hold (:func:`_shared`)."""

    __slots__ = ("__weakref__",)


#: the name lists this process unpickled lately, while they are alive (at most :data:`_RECENT`)
_recent: list[weakref.ref] = []
_RECENT = 8


def _shared(names: list[str]) -> list[str]:
    """``names``, or an equal list unpickled here before and still alive (the ranks of one stage name the same rows):
    one copy of each where results wait (module docstring)."""
    global _recent
    _recent = [ref for ref in _recent if ref() is not None]
    for ref in _recent:
        known = ref()
        if known is not None and len(known) == len(names) and known == names:
            return known
    if isinstance(names, _Names) and names:
        _recent = [*_recent[1 - _RECENT :], weakref.ref(names)]
    return names


def _rank(piece: ProfilePoint | _Chunk) -> str:
    return piece.rank if isinstance(piece, _Chunk) else piece[0]


def _merged(pieces: list[ProfilePoint | _Chunk]) -> _Chunk:
    """One rank's pieces, in order, as one chunk (a lone chunk as it is)."""
    if len(pieces) == 1 and isinstance(pieces[0], _Chunk):
        return pieces[0]
    orders: list[np.ndarray] = []
    names: list[str] = []
    ratios: list[np.ndarray] = []
    for is_chunk, run in groupby(pieces, key=lambda piece: isinstance(piece, _Chunk)):
        if is_chunk:
            for chunk in run:
                orders.append(chunk.orders)
                names += chunk.names
                ratios.append(chunk.ratios)
        else:  # points added one by one, as columns
            _, point_orders, point_names, point_ratios = zip(*run, strict=True)
            orders.append(np.array(point_orders, np.int64))
            names += point_names
            ratios.append(np.array(point_ratios, np.float64))
    return _Chunk(_rank(pieces[0]), np.concatenate(orders), names, np.concatenate(ratios).astype(np.float64))
