"""The rows of a parsed ``dump.json``: the one walk over its tensor entries, msprobe's row names, statistics.

A dump's ``data`` maps an API (``Functional.linear.7.forward``) to its ``input_args``,
``input_kwargs`` and ``output``, nested lists and dicts whose leaves are tensor entries
(``{"dtype": ..., "shape": [...], "Max": ..., "Min": ..., "Mean": ..., "Norm": ...}``) or scalars.
:func:`tensors` walks them by position; :func:`rows` names them as msprobe's compare table does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

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


def _read_op():
    try:
        from msprobe.core.compare.utils import read_op
    except ImportError as exc:
        raise ProbeUnavailableError(
            f"mindstudio-probe is not installed in this interpreter ({exc}); pip install mindstudio-probe"
        ) from None
    return read_op


def rows(dump: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Tensor rows of a parsed dump.json, in execution order, named as msprobe compare names them.

    Uses msprobe's own parser (``msprobe.core.compare.utils.read_op``), so each key is the
    ``NPU Name`` of msprobe's compare table, e.g. ``Functional.linear.7.forward.output.0``.
    Each row carries ``api`` (the dump.json key) besides msprobe's fields.

    ``read_op`` names a tensor saved by ``task: tensor`` after its file (``data_name``), where a keyword
    argument reads ``<api>.kwargs.<key>``; under ``task: statistics`` the same argument reads
    ``<api>.input.<key>``. The statistics name is kept for both, so a capture rerun's rows pair with the
    checked run's and the golden's.

    Raises:
        ProbeUnavailableError: msprobe is not installed.
    """
    read_op = _read_op()
    found: dict[str, dict[str, Any]] = {}
    for api, op_data in dump["data"].items():
        kwargs = f"{api}.kwargs."
        for item in read_op(op_data, api):
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
