"""One rank's ``dump.json`` as columns: msprobe's row names, a layout code and Max/Min/Mean/Norm per row.

:func:`~precision_harness.dumps.rows.rows` builds a dict per tensor row (a copy of its entry plus msprobe's
fields): at 65,000 calls a rank (a 7B model at L1) that is 190,000 objects a side, and building them cost more
than comparing them. :func:`columns` walks the dump once with the same parser (so the names are exactly
``rows()``'s keys, in its order, with its kwargs normalisation) and keeps per row only references to what the
dump already holds, plus a float64 ``(rows, 4)`` array of the statistics as ``to_float`` reads them. A row's
dict is built on demand (:meth:`Columns.item`), for the rows a verdict names.

The statistics are read from a dump parsed by :func:`~precision_harness.dumps.files.parse_dump` or
:func:`~precision_harness.dumps.files.parse_dump_raw` (whose :data:`~precision_harness.dumps.files.NON_FINITE`
strings read as their floats here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from precision_harness.dumps.files import NON_FINITE, collector_paused
from precision_harness.dumps.rows import SCALAR, TENSOR, msprobe_parser, numel, tensor_item, to_float
from precision_harness.dumps.statistics import STATISTICS

#: a row's layout code where its dtype or shape has no hashable form: compared row by row
NO_LAYOUT = -1


@dataclass
class Layouts:
    """The ``(dtype, shape)`` pairs of both sides of a compare, as small integers (shared by the two
    :class:`Columns`, so equal codes mean equal dtype and shape as ``==`` compares them).

    Attributes:
        codes: ``{(dtype, shape's type, shape as a tuple): code}``.
        dtypes: the dtype of each code, as the tolerance policy reads it (``str``).
        numels: the elements of each code's shape (:func:`~precision_harness.dumps.rows.numel`).
    """

    codes: dict[tuple[Any, ...], int] = field(default_factory=dict)
    dtypes: list[str] = field(default_factory=list)
    numels: list[int] = field(default_factory=list)

    def code(self, dtype: Any, shape: Any) -> int:
        """The code of a row judged by ``dtype`` with ``shape``; :data:`NO_LAYOUT` where either is unhashable."""
        try:
            key = (dtype, type(shape), tuple(shape) if type(shape) is list else shape)
            found = self.codes.get(key)
        except TypeError:
            return NO_LAYOUT
        if found is None:
            found = self.codes[key] = len(self.dtypes)
            self.dtypes.append(str(dtype))
            self.numels.append(numel(shape))
        return found


@dataclass
class Columns:
    """The rows of one parsed dump.json, in :func:`~precision_harness.dumps.rows.rows`' order.

    Attributes:
        names: ``(rows,)`` msprobe's row names (``rows()``' keys).
        apis: ``(rows,)`` the dump.json key of each row's call.
        sources: ``(rows,)`` the tensor entry of a plain row (in the parsed dump), else msprobe's item.
        states: ``(rows,)`` msprobe's state of a plain tensor row (``input``, ``output``...); ``(state, SCALAR)``
            for a plain scalar argument's row; None for an item row.
        layout: ``(rows,)`` int64 :class:`Layouts` code of ``(dtype or type, shape)``.
        stats: ``(rows, 4)`` float64 Max/Min/Mean/Norm as ``to_float`` reads them, NaN where absent.
        present: ``(rows, 4)`` bool: the statistic is a number.
        scalar: ``(rows,)`` bool: a scalar argument's row (its ``value`` is compared, not the four).
    """

    names: list[str]
    apis: list[str]
    sources: list[dict[str, Any]]
    states: list[Any]
    layout: np.ndarray
    stats: np.ndarray
    present: np.ndarray
    scalar: np.ndarray

    def item(self, i: int) -> dict[str, Any]:
        """Row ``i`` as :func:`~precision_harness.dumps.rows.rows` gives it (built now for a plain row)."""
        state = self.states[i]
        if state is None:
            return self.sources[i]
        if type(state) is tuple:  # a scalar argument: msprobe's own item, as rows() builds it
            item = msprobe_parser(leaves=True).gen_op_item(self.sources[i], self.names[i], state[0])
        else:
            item = tensor_item(self.sources[i], self.names[i], state)
        item["api"] = self.apis[i]
        return item


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


def columns(dump: dict[str, Any], layouts: Layouts) -> Columns:
    """The :class:`Columns` of a parsed dump.json (module docstring); ``layouts`` is shared with the other side.

    Raises:
        ProbeUnavailableError: msprobe (its row parser) is not installed.
    """
    parser = msprobe_parser(leaves=True)
    at: dict[str, int] = {}  # a name met again replaces its row in place, as rows()' dict does
    names: list[str] = []
    apis: list[str] = []
    rows: list[tuple[Any, Any, int, Any]] = []  # (source, state, layout code, the four statistics)
    with collector_paused():
        for api, op_data in dump["data"].items():
            kwargs = f"{api}.kwargs."
            for found in parser.read(op_data, api):
                name, row = _row(found, api, kwargs, layouts)
                i = at.setdefault(name, len(names))
                if i == len(names):
                    names.append(name)
                    apis.append(api)
                    rows.append(row)
                else:
                    apis[i], rows[i] = api, row
        return _columns(names, apis, rows)


def _row(found: Any, api: str, kwargs: str, layouts: Layouts) -> tuple[str, tuple[Any, Any, int, Any]]:
    """``(name, (source, state, layout code, the four statistics))`` of one of the parser's rows."""
    if type(found) is not tuple:
        leaf, name, state = _item_row(found, api, kwargs)
        code = layouts.code(found.get("dtype") or found.get("type"), found.get("shape"))
        four = _four_of_item(found)
    elif found[3] == TENSOR:
        leaf, name, state, _ = found
        code = layouts.code(leaf["dtype"], leaf.get("shape"))
        four = [leaf.get("Max"), leaf.get("Min"), leaf.get("Mean"), leaf.get("Norm")]
    else:  # a scalar argument: gen_op_item's statistics are its value (rows.SCALAR)
        leaf, name, state, _ = found
        value = leaf["value"]
        value = NON_FINITE.get(value, value) if type(value) is str else value
        code = layouts.code(str(type(value)), "[]")
        four = [value, value, value, value]
        state = (state, SCALAR)
    if name.startswith(kwargs):
        name = f"{api}.input.{name[len(kwargs) :]}"
    return name, (leaf, state, code, four)


def _item_row(item: dict[str, Any], api: str, kwargs: str) -> tuple[dict[str, Any], str, None]:
    """msprobe's item as rows() keeps it: ``api`` added, a kwargs name normalised."""
    item["api"] = api
    name = item["full_op_name"]
    if name.startswith(kwargs):
        name = item["full_op_name"] = f"{api}.input.{name[len(kwargs) :]}"
    return item, name, None


#: the four of a scalar argument's row: :func:`~precision_harness.check.stat_table.four` gives None there
_SCALAR = None


def _four_of_item(item: dict[str, Any]) -> list[Any] | None:
    """The statistics of an item row as ``stat_table.four`` reads them; :data:`_SCALAR` for a scalar's."""
    if item.get("Max") is None:
        value = item.get("value")
        if value is not None and not isinstance(value, (list, dict, str)):
            return _SCALAR
    return [item.get(s) for s in STATISTICS]


def _columns(names: list[str], apis: list[str], rows: list[tuple[Any, Any, int, Any]]) -> Columns:
    """The arrays of :class:`Columns` from the walk's rows."""
    n = len(names)
    sources, states, layout, values = (list(column) for column in zip(*rows, strict=True)) if rows else ([],) * 4
    scalar = np.fromiter((v is None for v in values), dtype=bool, count=n)
    flat = [x for v in values if v is not None for x in v]
    if all(type(x) is float for x in flat):  # nearly every dump: the statistics are numbers, one array at once
        dense = np.array(flat, dtype=np.float64).reshape(-1, 4)
        present = np.ones_like(dense, dtype=bool)
    else:
        read = [_number(x) for x in flat]
        dense = np.array([np.nan if x is None else x for x in read], dtype=np.float64).reshape(-1, 4)
        present = np.array([x is not None for x in read], dtype=bool).reshape(-1, 4)
    stats, has = np.full((n, 4), np.nan), np.zeros((n, 4), dtype=bool)
    stats[~scalar], has[~scalar] = dense, present
    return Columns(names, apis, sources, states, np.array(layout, dtype=np.int64), stats, has, scalar)


def _number(value: Any) -> float | None:
    """``to_float(value)``, with :data:`~precision_harness.dumps.files.NON_FINITE` strings read as their floats."""
    if type(value) is float:
        return value
    if type(value) is str and value in NON_FINITE:
        return NON_FINITE[value]
    return to_float(value)
