"""A stage's drift profile: ``(rank, order, tensor, worst tolerance ratio)`` of every compared row, kept as columns.

A failing stage keeps its whole profile (a report plots it; where the change entered and the replay read it). At
7B a stage's profile is about 1.6 M rows: as a list of tuples that is about 350 MB a stage, one tuple, one int,
one float and one copy of the row's name per row (a rank's names come back from the rank pool as new strings).
Here the rows compared at once are packed into :class:`_Chunk` columns, 12 bytes a row: an int64 order, a float64
ratio and the name list, which the ranks of one stage share (they name the same rows). Readers see the same
points in the same order, as tuples (:class:`DriftProfile` is a read-only sequence of them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice, repeat
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
    """The points of a drift profile in execution order (module docstring): appended one by one or many at once,
    packed into columns when :meth:`pack` is called (a rank's result is, before it leaves the rank pool) and when
    another profile is added; compares equal to any sequence of the same points."""

    __slots__ = ("_chunks", "_points")

    def __init__(self, points: Iterable[ProfilePoint] = ()) -> None:
        self._chunks: list[_Chunk] = []
        self._points: list[ProfilePoint] = list(points)  # appended since the last pack

    def append(self, point: ProfilePoint) -> None:
        self._points.append(point)

    def extend(self, points: Iterable[ProfilePoint]) -> None:
        self._points.extend(points)

    def extend_columns(self, rank: str, span: tuple[int, int], names: list[str], ratios: np.ndarray) -> None:
        """Add the rows ``span`` (``(start, stop)``, their orders) of one rank's judged table: ``names`` and
        ``ratios`` (``(rows,)`` float64, the rows' worst ratios) indexed by order, taken as columns at once."""
        start, stop = span
        if start >= stop:
            return
        self.pack()
        kept = names if (start, stop) == (0, len(names)) else names[start:stop]
        self._add(_Chunk(rank, np.arange(start, stop, dtype=np.int64), kept, ratios[start:stop].astype(np.float64)))

    def pack(self) -> DriftProfile:
        """The points appended so far as columns, one :class:`_Chunk` per run of one rank; returns itself."""
        points, self._points = self._points, []
        start = 0
        for end in range(1, len(points) + 1):
            if end == len(points) or points[end][0] != points[start][0]:
                ranks, orders, names, ratios = zip(*points[start:end], strict=True)
                self._add(_Chunk(ranks[0], np.array(orders, np.int64), list(names), np.array(ratios, np.float64)))
                start = end
        return self

    def __iadd__(self, other: Iterable[ProfilePoint]) -> DriftProfile:
        """Add ``other``'s points after these (a :class:`DriftProfile`'s chunks as they are)."""
        self.pack()
        if isinstance(other, DriftProfile):
            for chunk in other.pack()._chunks:
                self._add(chunk)
        else:
            self._points.extend(other)
        return self

    def _add(self, chunk: _Chunk) -> None:
        last = self._chunks[-1] if self._chunks else None
        if last is not None and last.names is not chunk.names and last.names == chunk.names:
            chunk = _Chunk(chunk.rank, chunk.orders, last.names, chunk.ratios)  # another rank of the same rows
        self._chunks.append(chunk)

    def max_ratio(self, default: float = 0.0) -> float:
        """The largest worst ratio of any point (``inf`` for a structural change), ``default`` with none."""
        found = [float(c.ratios.max()) for c in self._chunks if len(c.ratios)] + [p[3] for p in self._points]
        return max(found, default=default)

    def worst(self) -> ProfilePoint | None:
        """The first point of the largest ratio, as ``max(profile, key=ratio)`` gives it; None for an empty one."""
        best: ProfilePoint | None = None
        for chunk in self._chunks:
            if np.isnan(chunk.ratios).any():  # max() keeps a NaN it meets first: read as it does
                candidates = chunk.points()
            elif len(chunk.ratios):
                i = int(np.argmax(chunk.ratios))  # the chunk's first of its largest
                candidates = chunk.points(i, i + 1)
            else:
                continue
            for point in candidates:
                if best is None or point[3] > best[3]:
                    best = point
        for point in self._points:
            if best is None or point[3] > best[3]:
                best = point
        return best

    def __len__(self) -> int:
        return sum(len(c.orders) for c in self._chunks) + len(self._points)

    def __bool__(self) -> bool:
        return bool(self._points) or any(len(c.orders) for c in self._chunks)

    def __iter__(self) -> Iterator[ProfilePoint]:
        for chunk in self._chunks:
            yield from chunk.points()
        yield from self._points

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
        return found + self._points[max(start - offset, 0) : max(stop - offset, 0) : step]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DriftProfile | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"DriftProfile({len(self)} points)"

    def __getstate__(self) -> tuple[list[_Chunk], list[ProfilePoint]]:
        self.pack()  # a rank's points cross the pool's pipe as columns
        return self._chunks, self._points

    def __setstate__(self, state: tuple[list[_Chunk], list[ProfilePoint]]) -> None:
        self._chunks, self._points = state
