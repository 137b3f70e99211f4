"""The rows of a parsed ``dump.json``: the one walk over its tensor entries, msprobe's row names, statistics.

A dump's ``data`` maps an API (``Functional.linear.7.forward``) to its ``input_args``,
``input_kwargs`` and ``output``, nested lists and dicts whose leaves are tensor entries
(``{"dtype": ..., "shape": [...], "Max": ..., "Min": ..., "Mean": ..., "Norm": ...}``) or scalars.
:func:`tensors` walks them by position; :func:`rows` names them as msprobe's compare table does.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from typing import Any

from precision_harness.dumps.files import NON_FINITE, restore_non_finite
from precision_harness.dumps.statistics import STATISTICS
from precision_harness.errors import ProbeUnavailableError


def tensors(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, statistics entry)`` of every tensor below ``node`` (a dump's ``data``, or one API entry).

    Paths join keys and list indices with dots (``"input_args.0"``; below ``data``, the API name
    comes first) and are stable keys between two dumps of the same program.
    """
    if isinstance(node, dict):
        if "dtype" in node and "Max" in node:
            yield path, node
            return
        for key, value in node.items():
            yield from tensors(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from tensors(value, f"{path}.{i}" if path else str(i))


def msprobe_parser(*, leaves: bool = False) -> _Parser:
    """msprobe's row parser: ``read_op``, its recursion ``op_item_parse``, its leaf ``gen_op_item``, the name
    suffix of each argument kind (``CompareConst.IO_NAME_MAPPING``) and its depth limit.

    With ``leaves``, :meth:`_Parser.read` gives each plain tensor entry as ``(entry, row name, state)``, the
    entry itself and not its row (:func:`tensor_item` builds that), and every other row as msprobe's item.

    Raises:
        ProbeUnavailableError: msprobe is not installed.
    """
    try:
        from msprobe.core.common.const import CompareConst, Const
        from msprobe.core.compare.utils import gen_op_item, op_item_parse, read_op
    except ImportError as exc:
        raise ProbeUnavailableError(
            f"mindstudio-probe is not installed in this interpreter ({exc}); pip install mindstudio-probe"
        ) from None
    parser = _LeafParser if leaves else _Parser
    return parser(read_op, op_item_parse, gen_op_item, dict(CompareConst.IO_NAME_MAPPING), Const.MAX_DEPTH)


class _Parser:
    """msprobe's ``read_op`` with its commonest leaf, a plain tensor entry, built inline (module docstring of
    :func:`rows`); every other leaf, and every API ``read_op`` treats apart, goes to msprobe's own functions."""

    def __init__(self, read_op, op_item_parse, gen_op_item, io_names: dict[str, str], max_depth: int) -> None:
        self.read_op, self.op_item_parse, self.gen_op_item = read_op, op_item_parse, gen_op_item
        self.io_names, self.max_depth = io_names, max_depth

    def read(self, op_data: Any, api: str) -> list[Any]:
        """``read_op(op_data, api)``'s items, equal key for key."""
        last = api.rsplit(".", 2)[-2:]
        if DEBUG in last[-1:] or PARAMS_GRAD in last or not isinstance(op_data, dict):
            return self.read_op(op_data, api)
        found: list[dict[str, Any]] = []
        for key, suffix in self.io_names.items():
            if key in op_data:
                self._parse(op_data[key], api + suffix, key, 0, found)
        return found

    def _parse(self, node: Any, name: str, state: str, depth: int, out: list[Any]) -> None:
        """``op_item_parse``'s walk, appending to ``out``."""
        if state in (_INPUT_ARGS, _INPUT_KWARGS):
            state = "input"
        if node is None or depth > self.max_depth or (isinstance(node, dict) and node.get("class_type") == P2P):
            out += self.op_item_parse(node, name, state, depth)
        elif not node:
            return
        elif isinstance(node, list):
            flat = PARAMS_GRAD in name and PARAMS_GRAD in name.split(".")
            for i, value in enumerate(node):
                at = name if flat else f"{name}.{i}"
                if type(value) is dict and type(value.get("type")) is str and _plain(value):  # the common leaf
                    out.append(self.plain(value, at, "input" if state in (_INPUT_ARGS, _INPUT_KWARGS) else state))
                else:
                    self._parse(value, at, state, depth + 1, out)
        elif isinstance(node, dict):
            if isinstance(node.get("type"), str):
                out.append(self.plain(node, name, state) if _plain(node) else self.leaf(node, name, state))
                return
            for key, value in node.items():
                self._parse(value, f"{name}.{key}", state, depth + 1, out)

    @staticmethod
    def plain(leaf: dict[str, Any], name: str, state: str) -> Any:
        return tensor_item(leaf, name, state)

    def leaf(self, leaf: dict[str, Any], name: str, state: str) -> Any:
        """Any other leaf: msprobe's ``gen_op_item``."""
        return self.gen_op_item(leaf, name, state)


class _LeafParser(_Parser):
    """:class:`_Parser` that hands a plain tensor entry over as it stands (:func:`msprobe_parser`), and may read a
    dump of :func:`~precision_harness.dumps.files.parse_dump_raw`: what it gives msprobe's functions is restored
    to floats first (``gen_op_item`` turns a scalar's value into text for its md5)."""

    def __init__(self, read_op, op_item_parse, gen_op_item, io_names: dict[str, str], max_depth: int) -> None:
        super().__init__(_restoring(read_op), _restoring(op_item_parse), _restoring(gen_op_item), io_names, max_depth)

    @staticmethod
    def plain(leaf: dict[str, Any], name: str, state: str) -> Any:
        return (leaf, name, state, TENSOR)

    def leaf(self, leaf: dict[str, Any], name: str, state: str) -> Any:
        """A plain scalar argument as ``(entry, name, state, SCALAR)``; any other leaf msprobe's item."""
        if plain_scalar(leaf) and name.rsplit(".", 1)[-1] not in PEERS:
            return (leaf, name, state, SCALAR)
        return self.gen_op_item(leaf, name, state)


#: the kinds of leaf :class:`_LeafParser` hands over as they stand
TENSOR, SCALAR = 1, 2
#: the argument names ``gen_op_item`` reads as a peer rank, not a scalar
PEERS = frozenset({"src", "dst", "group_src", "group_dst"})
_SCALAR_TYPES = frozenset({"int", "float", "bool"})


def plain_scalar(leaf: dict[str, Any]) -> bool:
    """A scalar argument ``gen_op_item`` reads by its last case (``{"type": "float", "value": 0.5}``): its
    statistics are its value, its dtype ``str(type(value))``, its shape ``"[]"``."""
    if len(leaf) != 2 or leaf.get("type") not in _SCALAR_TYPES:
        return False
    value = leaf.get("value")
    return type(value) in (int, float, bool) or (type(value) is str and value in NON_FINITE)


def _restoring(fn):
    """``fn`` given its first argument with its non-finite strings restored (:func:`restore_non_finite`)."""
    return lambda node, *args: fn(restore_non_finite(node), *args)


DEBUG, PARAMS_GRAD, P2P = "debug", "parameters_grad", "torch.distributed.P2POp"
_INPUT_ARGS, _INPUT_KWARGS = "input_args", "input_kwargs"


#: the keys of the tensor entry msprobe writes under ``task: statistics``; a leaf with any other key (``md5``,
#: ``data_name``, ``value``...) goes to ``gen_op_item``
TENSOR_KEYS = frozenset({"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"})
#: ``gen_op_item``'s md5 of a leaf without ``value``: ``crc32(str(''))``
_NO_VALUE_MD5 = f"{zlib.crc32(b''):08x}"


def _plain(leaf: dict[str, Any]) -> bool:
    """A tensor entry ``gen_op_item`` reads without a special case: a string dtype other than ``torch.bool``
    (whose Max and Min are booleans, turned into text), and only :data:`TENSOR_KEYS`."""
    dtype = leaf.get("dtype")
    return type(dtype) is str and dtype != "torch.bool" and dtype != "" and leaf.keys() <= TENSOR_KEYS


def tensor_item(leaf: dict[str, Any], name: str, state: str) -> dict[str, Any]:
    """``gen_op_item(leaf, name, state)`` for a :func:`_plain` leaf, step for step (msprobe.core.compare.utils).

    A statistic read by :func:`~precision_harness.dumps.files.parse_dump_raw` as a
    :data:`~precision_harness.dumps.files.NON_FINITE` string is its float here."""
    item = {**leaf, "data_name": "-1", "full_op_name": name, "state": state, "md5": _NO_VALUE_MD5}
    grad = item.get("requires_grad")
    item["requires_grad"] = str(grad) if type(grad) is bool else grad
    for statistic in STATISTICS:
        value = item.setdefault(statistic, None)
        if type(value) is str and value in NON_FINITE:
            item[statistic] = NON_FINITE[value]
    return item


#: msprobe's ``CompareConst.IO_NAME_MAPPING`` (mindstudio-probe 26.2): the argument kinds its parser reads, in its
#: order, and each one's row name suffix. Held here so that a dump read without the parser (``dumps/columns.py``)
#: does not import msprobe (1.3 s a process); ``tests/test_compare_at_scale.py`` checks it equals msprobe's.
IO_NAME_MAPPING = {
    "input_args": ".input",
    "input_kwargs": ".input",
    "input": ".input",
    "output": ".output",
    "parameters": ".parameters",
}


def none_item(name: str, state: str) -> dict[str, Any]:
    """``op_item_parse(None, name, state)``'s one item (msprobe.core.compare.utils, its ``default_item``): the row
    of an argument msprobe recorded as null (``state`` already ``input`` for an argument)."""
    item: dict[str, Any] = {"full_op_name": name, "type": None, **dict.fromkeys(STATISTICS), "dtype": None}
    item.update({"shape": None, "md5": None, "value": None, "data_name": "-1", "state": state, "requires_grad": None})
    return item


def rows(dump: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Tensor rows of a parsed dump.json, in execution order, named as msprobe compare names them.

    Uses msprobe's own parser (``msprobe.core.compare.utils.read_op``), so each key is the
    ``NPU Name`` of msprobe's compare table, e.g. ``Functional.linear.7.forward.output.0``.
    Each row carries ``api`` (the dump.json key) besides msprobe's fields.

    ``read_op`` names a tensor saved by ``task: tensor`` after its file (``data_name``), where a keyword
    argument reads ``<api>.kwargs.<key>``; under ``task: statistics`` the same argument reads
    ``<api>.input.<key>``. The statistics name is kept for both, so a capture rerun's rows pair with the
    checked run's and the golden's.

    The walk is msprobe's ``read_op`` (``op_item_parse``), with one leaf built inline: a tensor entry with
    a dtype, the bulk of every dump, which ``gen_op_item`` copies without a special case; every other leaf
    (scalars, ``torch.Size``, slices, process groups, P2P ops) and every debug or ``parameters_grad`` API is
    msprobe's own code. The items equal ``read_op``'s key for key (``tests/test_compare_at_scale.py`` checks
    every committed golden).

    Raises:
        ProbeUnavailableError: msprobe is not installed.
    """
    parser = msprobe_parser()
    found: dict[str, dict[str, Any]] = {}
    for api, op_data in dump["data"].items():
        kwargs = f"{api}.kwargs."
        for item in parser.read(op_data, api):
            item["api"] = api
            name = item["full_op_name"]
            if name.startswith(kwargs):  # one name whatever the task (docstring)
                name = item["full_op_name"] = f"{api}.input.{name[len(kwargs) :]}"
            found[name] = item
    return found


#: a bool tensor's Max and Min as msprobe's ``read_op`` hands them over (it turns every bool into text)
_BOOLS = {"True": 1.0, "False": 0.0}


def to_float(value: Any) -> float | None:
    """``value`` as a float; None for null, msprobe's ``"N/A"``/``"-"``/``""`` and anything not a number.

    ``"True"``/``"False"`` (a bool tensor's Max and Min after ``read_op``) read 1.0 and 0.0: unread, every
    causal mask and padding mask of a dump would be compared by nothing.
    """
    if type(value) is float:  # nearly every statistic: the rest of the checks cost a million calls at 7B
        return value
    if isinstance(value, str) and value in _BOOLS:
        return _BOOLS[value]
    if value is None or (isinstance(value, str) and value.strip() in ("N/A", "", "None", "-")):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def row_statistics(item: dict[str, Any]) -> dict[str, float | None]:
    """Max/Min/Mean/Norm of a row (see :func:`rows`), or ``{"value": v}`` for a scalar argument."""
    if (
        item.get("Max") is None
        and item.get("value") is not None
        and not isinstance(item.get("value"), (list, dict, str))
    ):
        return {"value": to_float(item["value"])}
    return {s: to_float(item.get(s)) for s in STATISTICS}


def unsummarised(dump: dict[str, Any]) -> list[str]:
    """The tensor entries of a parsed dump.json with no statistic at all (msprobe records none of a FRACTAL_NZ or
    fp8 tensor on NPU), by their :func:`tensors` path."""
    return [
        path
        for path, t in tensors(dump["data"])
        if is_tensor(t) and all(t.get(s) is None for s in ("Max", "Min", "Mean", "Norm"))
    ]


def is_tensor(item: dict[str, Any]) -> bool:
    """The entry or row is a torch tensor's (its ``type`` and ``dtype`` both ``torch.*``)."""
    return str(item.get("type", "")).startswith("torch.") and str(item.get("dtype", "")).startswith("torch.")


def count_statistics(dump: dict[str, Any]) -> int:
    """Number of values the gate checks in a parsed dump.json: the non-null statistics of every row
    msprobe's parser yields (a scalar argument's value fills all four, as in msprobe's table)."""
    return sum(sum(v is not None for v in row_statistics(item).values()) for item in rows(dump).values())


def numel(shape: Any) -> int:
    """Elements of a tensor of ``shape`` (a list, or msprobe's text such as ``"(2, 3)"``); 1 for a scalar or unknown."""
    if isinstance(shape, str):
        try:
            shape = json.loads(shape.replace("(", "[").replace(")", "]"))
        except ValueError:
            return 1
    return int(math.prod(shape)) if isinstance(shape, (list, tuple)) and shape else 1


def rms(norm: Any, shape: Any) -> float | None:
    """Root mean square of a tensor from its L2 ``norm`` and ``shape``: ``Norm / sqrt(numel)``.

    The scale a Mean is judged against (docs/tolerance.md): a mean near zero has no useful relative
    error. None where ``norm`` is not a finite number.
    """
    if not isinstance(norm, (int, float)) or isinstance(norm, bool) or not math.isfinite(norm):
        return None
    return norm / math.sqrt(max(numel(shape), 1))
