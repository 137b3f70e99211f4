"""One rank's ``dump.json`` as columns: msprobe's row names, a layout code and Max/Min/Mean/Norm per row.

:func:`~precision_harness.dumps.rows.rows` builds a dict per tensor row (a copy of its entry plus msprobe's
fields): at 65,000 calls a rank (a 7B model at L1) that is 190,000 objects a side, and building them cost more
than comparing them. :func:`columns` reads the dump once and keeps per row only references to what the dump
already holds, plus a float64 ``(rows, 4)`` array of the statistics as ``to_float`` reads them. A row's dict is
built on demand (:meth:`Columns.item`), for the rows a verdict names.

An API entry in the plain layout msprobe writes under ``task: statistics`` (each argument kind a list of leaves,
or a dict of them for keyword arguments; each leaf a tensor entry of only type/dtype/shape/Max/Min/Mean/Norm/
requires_grad, a plain scalar or null) is read inline, one Python step per leaf, without msprobe's parser (whose
generic walk cost about 1.5 s a 30,000-call dump). Any other entry (a bool tensor, whose Max and Min msprobe
turns into text; a ``torch.Size``; a nested tuple; a debug or ``parameters_grad`` API...) goes through the parser
(:func:`walked_columns` for the whole dump where a row name comes twice), so the names are exactly ``rows()``'s
keys, in its order, with its kwargs normalisation: ``tests/test_plain_columns.py`` checks the two agree field
for field on every committed golden and plant. msprobe is imported only for a dump that holds such an entry.

The statistics are read from a dump parsed by :func:`~precision_harness.dumps.files.parse_dump` or
:func:`~precision_harness.dumps.files.parse_dump_raw` (whose :data:`~precision_harness.dumps.files.NON_FINITE`
strings read as their floats here).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from precision_harness.dumps.files import NON_FINITE, collector_paused
from precision_harness.dumps.rows import (
    DEBUG,
    IO_NAME_MAPPING,
    PARAMS_GRAD,
    PEERS,
    SCALAR,
    TENSOR,
    TENSOR_KEYS,
    msprobe_parser,
    none_item,
    numel,
    plain_scalar,
    tensor_item,
    to_float,
)
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
        keys: the key of each code (its dtype and shape as the dump holds them: a plain row's entry is rebuilt
            from them, :meth:`Columns.item`).
    """

    codes: dict[tuple[Any, ...], int] = field(default_factory=dict)
    dtypes: list[str] = field(default_factory=list)
    numels: list[int] = field(default_factory=list)
    keys: list[tuple[Any, ...]] = field(default_factory=list)

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
            self.keys.append(key)
        return found


@dataclass
class Columns:
    """The rows of one parsed dump.json, in :func:`~precision_harness.dumps.rows.rows`' order.

    Attributes:
        names: ``(rows,)`` msprobe's row names (``rows()``' keys).
        apis: ``(rows,)`` the dump.json key of each row's call.
        sources: ``(rows,)`` a plain tensor row's entry as an :data:`Entry` (none of the parsed dump is kept, so it
            is freed once its columns are built), a plain scalar's entry, else msprobe's item.
        states: ``(rows,)`` msprobe's state of a plain tensor row (``input``, ``output``...); ``(state, SCALAR)``
            for a plain scalar argument's row; None for an item row.
        layout: ``(rows,)`` int64 :class:`Layouts` code of ``(dtype or type, shape)``.
        stats: ``(rows, 4)`` float64 Max/Min/Mean/Norm as ``to_float`` reads them, NaN where absent.
        present: ``(rows, 4)`` bool: the statistic is a number.
        scalar: ``(rows,)`` bool: a scalar argument's row (its ``value`` is compared, not the four).
    """

    names: list[str]
    apis: list[str]
    sources: list[Any]
    states: list[Any]
    layout: np.ndarray
    stats: np.ndarray
    present: np.ndarray
    scalar: np.ndarray
    #: :attr:`Layouts.keys`, for a plain row's entry
    keys: list[tuple[Any, ...]] = field(default_factory=list, repr=False)
    #: the dump's calls (its ``data`` keys), in order: those without a row too
    calls: list[str] = field(default_factory=list, repr=False)

    def item(self, i: int) -> dict[str, Any]:
        """Row ``i`` as :func:`~precision_harness.dumps.rows.rows` gives it (built now for a plain row)."""
        state = self.states[i]
        if state is None:
            return self.sources[i]
        if type(state) is tuple:  # a scalar argument: msprobe's own item, as rows() builds it
            item = msprobe_parser(leaves=True).gen_op_item(self.sources[i], self.names[i], state[0])
        else:
            item = tensor_item(self.entry(i), self.names[i], state)
        item["api"] = self.apis[i]
        return item

    def entry(self, i: int) -> dict[str, Any]:
        """The tensor entry of plain row ``i`` as the dump holds it (key for key, in its order), rebuilt from its
        :data:`Entry`: dtype and shape from its layout code, the statistics from :attr:`stats` where all four are
        floats (float64 holds a float exactly), else as kept."""
        source = self.sources[i]
        if type(source) is not tuple:
            return source
        keys, kind, grad, four = source
        dtype, shape_type, shape = self.keys[int(self.layout[i])]
        four = self.stats[i].tolist() if four is None else four
        found = {"type": kind, "dtype": dtype, "shape": list(shape) if shape_type is list else shape}
        found.update(zip(STATISTICS, four, strict=True), requires_grad=grad)
        return {key: found[key] for key in keys}


#: a plain tensor row's entry as :class:`Columns` keeps it: ``(its keys in order, its type, its requires_grad, its four
#: statistics or None where all four are floats)``; its dtype and shape are its layout code's
Entry = tuple[tuple[str, ...], str, Any, list[Any] | None]


def _entry(leaf: dict[str, Any], four: list[Any], code: int, shared: dict[Any, Any]) -> Any:
    """A plain tensor row's entry (a dict of the parsed dump) as an :data:`Entry`: a tuple whose strings and keys
    are shared with every other row's (in ``shared``), about a sixth of the entry's memory. The entry itself where
    its layout has no code (an unhashable shape)."""
    if code == NO_LAYOUT:
        return leaf
    keys, kind = tuple(leaf), leaf["type"]
    floats = type(four[0]) is float and type(four[1]) is float and type(four[2]) is float and type(four[3]) is float
    return (
        shared.setdefault(keys, keys),
        shared.setdefault(kind, kind),
        leaf.get("requires_grad"),
        None if floats else four,
    )


def columns(dump: dict[str, Any], layouts: Layouts) -> Columns:
    """The :class:`Columns` of a parsed dump.json (module docstring); ``layouts`` is shared with the other side.

    An API entry in the plain layout msprobe writes under ``task: statistics`` (:func:`_plain_rows`) is read
    here without the parser; any other entry goes through the parser's walk (:func:`walked_columns`), so the
    names, their order and every row equal the walk's (``tests/test_compare_at_scale.py`` checks every
    committed golden and plant).

    Raises:
        ProbeUnavailableError: msprobe (its row parser) is not installed.
    """
    parser = None  # msprobe's, imported only for an entry that is not plain
    rows = _Rows()
    with collector_paused():
        for api, op_data in dump["data"].items():
            if not _plain_rows(api, op_data, rows, layouts):
                rows.undo()
                parser = parser or msprobe_parser(leaves=True)
                kwargs = f"{api}.kwargs."
                for found in parser.read(op_data, api):
                    rows.add(*_row(found, api, kwargs, layouts), api)
            rows.mark()
        if len(set(rows.names)) != len(rows.names):  # a name met again: rows() keeps its last row in place
            return walked_columns(dump, layouts)
        return _columns(rows.names, rows.apis, (rows.sources, rows.states, rows.codes, rows.fours), layouts, dump)


def walked_columns(dump: dict[str, Any], layouts: Layouts) -> Columns:
    """:func:`columns` by the parser's walk for every API entry (the reference the fast read is tested against).

    Raises:
        ProbeUnavailableError: msprobe (its row parser) is not installed.
    """
    parser = msprobe_parser(leaves=True)
    at: dict[str, int] = {}  # a name met again replaces its row in place, as rows()' dict does
    names: list[str] = []
    apis: list[str] = []
    rows: list[tuple[Any, Any, int, Any]] = []  # (source, state, layout code, the four statistics)
    shared: dict[Any, Any] = {}
    with collector_paused():
        for api, op_data in dump["data"].items():
            kwargs = f"{api}.kwargs."
            for found in parser.read(op_data, api):
                name, row = _row(found, api, kwargs, layouts)
                i = at.setdefault(name, len(names))
                if type(row[1]) is str:  # a plain tensor row
                    row = (_entry(row[0], row[3], row[2], shared), *row[1:])
                if i == len(names):
                    names.append(name)
                    apis.append(api)
                    rows.append(row)
                else:
                    apis[i], rows[i] = api, row
        by_field = tuple(list(c) for c in zip(*rows, strict=True)) if rows else ([],) * 4
        return _columns(names, apis, by_field, layouts, dump)


class _Rows:
    """The rows read so far, column by column; :meth:`undo` drops those of the API entry being read."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.apis: list[str] = []
        self.sources: list[dict[str, Any]] = []
        self.states: list[Any] = []
        self.codes: list[int] = []
        self.fours: list[Any] = []
        self.shared: dict[Any, Any] = {}  #: the strings and key tuples the rows' entries share (:func:`_entry`)
        self._done = 0

    def add(self, name: str, row: tuple[Any, Any, int, Any], api: str) -> None:
        self.names.append(name)
        self.apis.append(api)
        self.sources.append(_entry(row[0], row[3], row[2], self.shared) if type(row[1]) is str else row[0])
        self.states.append(row[1])
        self.codes.append(row[2])
        self.fours.append(row[3])

    def columns(self) -> tuple[list[Any], ...]:
        return self.names, self.apis, self.sources, self.states, self.codes, self.fours

    def mark(self) -> None:
        self._done = len(self.names)

    def undo(self) -> None:
        for column in self.columns():
            del column[self._done :]


#: the parser's argument kinds in its order (:data:`~precision_harness.dumps.rows.IO_NAME_MAPPING`), each with its
#: row name suffix and the state its rows read
_IO = [
    (key, suffix, "input" if key in ("input_args", "input_kwargs") else key) for key, suffix in IO_NAME_MAPPING.items()
]


def _plain_rows(api: str, op_data: Any, rows: _Rows, layouts: Layouts) -> bool:
    """Append the rows of ``op_data`` in the plain layout, as the walk names and reads them; False (some rows
    may be appended) where any of it is not plain: a debug or ``parameters_grad`` API, an argument that is not
    a list of leaves (or a dict of them, for keyword arguments), a leaf that is neither a :func:`_plain` tensor
    entry, a plain scalar nor a null (a ``torch.Size``, a nested tuple, a process group...)."""
    if type(op_data) is not dict or DEBUG in api.rsplit(".", 1)[-1] or PARAMS_GRAD in api:
        return False
    kwargs = f"{api}.kwargs."
    for key, suffix, state in _IO:
        node = op_data.get(key)
        if node is None:
            if key in op_data:
                return False
            continue
        if type(node) is list:
            prefix = f"{api}{suffix}."
            leaves = zip([prefix + str(i) for i in range(len(node))], node, strict=True)
        elif type(node) is dict and "type" not in node:
            leaves = ((_input(f"{api}{suffix}.{k}", api, kwargs), leaf) for k, leaf in node.items())
        elif not node:  # an empty argument kind: no row
            continue
        else:
            return False
        if not _leaf_rows(leaves, state, rows, layouts, api):
            return False
    return True


def _leaf_rows(leaves: Any, state: str, rows: _Rows, layouts: Layouts, api: str) -> bool:
    """Append the ``(name, leaf)`` rows that are a :func:`_plain` tensor entry, a plain scalar or a null, as
    :func:`_row` reads them; False at the first that is none of these (a Python step per tensor: the checks are
    inlined)."""
    codes, code = layouts.codes, layouts.code
    names, apis, sources, states, codes_, fours = rows.columns()
    for name, leaf in leaves:
        if type(leaf) is not dict:
            if leaf is not None:
                return False
            leaf = none_item(name, state)  # msprobe's row of a null argument, an item row as the walk gives it
            leaf["api"] = api
            codes_.append(code(None, None))
            fours.append([None] * 4)
            states.append(None)
        elif type(dtype := leaf.get("dtype")) is str and dtype and dtype != "torch.bool" and leaf.keys() <= TENSOR_KEYS:
            # rows._plain, inlined
            if type(leaf.get("type")) is not str:
                return False
            shape = leaf.get("shape")
            found = codes.get((dtype, list, tuple(shape))) if type(shape) is list else None
            codes_.append(code(dtype, shape) if found is None else found)
            four = [leaf.get("Max"), leaf.get("Min"), leaf.get("Mean"), leaf.get("Norm")]
            fours.append(four)
            states.append(state)
            leaf = _entry(leaf, four, codes_[-1], rows.shared)
        elif type(leaf.get("type")) is str and plain_scalar(leaf) and name.rsplit(".", 1)[-1] not in PEERS:
            scalar = _scalar_row(leaf, state, layouts)
            codes_.append(scalar[0])
            fours.append(scalar[1])
            states.append(scalar[2])
        else:
            return False
        names.append(name)
        apis.append(api)
        sources.append(leaf)
    return True


def _scalar_row(leaf: dict[str, Any], state: str, layouts: Layouts) -> tuple[int, list[Any], tuple[str, int]]:
    """A plain scalar argument's layout code, four statistics and state: ``gen_op_item``'s statistics of a scalar
    are its value (:data:`~precision_harness.dumps.rows.SCALAR`)."""
    value = leaf["value"]
    value = NON_FINITE.get(value, value) if type(value) is str else value
    return layouts.code(str(type(value)), "[]"), [value] * 4, (state, SCALAR)


def _input(name: str, api: str, kwargs: str) -> str:
    """A keyword argument's row name as :func:`_row` normalises it (``<api>.kwargs.<k>`` reads ``<api>.input.<k>``)."""
    return f"{api}.input.{name[len(kwargs) :]}" if name.startswith(kwargs) else name


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
    else:
        leaf, name, state, _ = found
        code, four, state = _scalar_row(leaf, state, layouts)
    name = _input(name, api, kwargs)
    return name, (leaf, state, code, four)


def _item_row(item: dict[str, Any], api: str, kwargs: str) -> tuple[dict[str, Any], str, None]:
    """msprobe's item as rows() keeps it: ``api`` added, a kwargs name normalised."""
    item["api"] = api
    name = item["full_op_name"] = _input(item["full_op_name"], api, kwargs)
    return item, name, None


#: the four of a scalar argument's row: :func:`~precision_harness.check.compare.stat_table.four` gives None there
_SCALAR = None


def _four_of_item(item: dict[str, Any]) -> list[Any] | None:
    """The statistics of an item row as ``stat_table.four`` reads them; :data:`_SCALAR` for a scalar's."""
    if item.get("Max") is None:
        value = item.get("value")
        if value is not None and not isinstance(value, (list, dict, str)):
            return _SCALAR
    return [item.get(s) for s in STATISTICS]


def _columns(
    names: list[str], apis: list[str], rows: tuple[list[Any], ...], layouts: Layouts, dump: dict[str, Any]
) -> Columns:
    """The arrays of :class:`Columns` from the rows' sources, states, layout codes and statistics (one list each), and
    the calls of ``dump`` (the parsed dump.json they were read from)."""
    n = len(names)
    sources, states, layout, values = rows
    scalar = np.fromiter((v is None for v in values), dtype=bool, count=n)
    dense, present = _floats([x for v in values if v is not None for x in v])
    dense, present = dense.reshape(-1, 4), present.reshape(-1, 4)
    stats, has = np.full((n, 4), np.nan), np.zeros((n, 4), dtype=bool)
    stats[~scalar], has[~scalar] = dense, present
    codes = np.array(layout, dtype=np.int64)
    return Columns(names, apis, sources, states, codes, stats, has, scalar, layouts.keys, list(dump["data"]))


#: the types of statistic numpy reads as ``to_float`` does (None as NaN, marked absent)
_NUMERIC = frozenset({float, int, bool, type(None)})


def _floats(flat: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(values,)`` float64 :func:`_number` of each of ``flat`` (NaN where None) and ``(values,)`` bool: not None.

    One array at once where the statistics are numbers, None or :data:`~precision_harness.dumps.files.NON_FINITE`
    strings (every dump msprobe writes); value by value otherwise."""
    kinds = set(map(type, flat))
    if str in kinds:  # the few strings read one by one (a NON_FINITE sentinel, msprobe's "N/A"...), in place
        for i in [i for i, x in enumerate(flat) if type(x) is str]:
            flat[i] = _number(flat[i])
        kinds = set(map(type, flat))
    if kinds <= _NUMERIC:
        try:
            dense = np.array(flat, dtype=np.float64)
        except OverflowError:  # an int larger than any float: raised below as to_float raises it
            dense = None
        if dense is not None and type(None) not in kinds:
            return dense, np.ones(len(flat), dtype=bool)
        if dense is not None:
            return dense, np.fromiter(map(operator.is_not, flat, repeat(None)), dtype=bool, count=len(flat))
    read = [_number(x) for x in flat]
    return np.array([np.nan if x is None else x for x in read], dtype=np.float64), np.array(
        [x is not None for x in read], dtype=bool
    )


def _number(value: Any) -> float | None:
    """``to_float(value)``, with :data:`~precision_harness.dumps.files.NON_FINITE` strings read as their floats."""
    if type(value) is float:
        return value
    if type(value) is str and value in NON_FINITE:
        return NON_FINITE[value]
    return to_float(value)
