"""Replay one captured API call on the CPU: in float64 (the reference) and in its output's dtype (the baseline).

The call is rebuilt from msprobe's ``task: tensor`` dump of one rank (``dump.json`` and its
``dump_tensor_data/`` folder) by msprobe's own ``gen_api_params``; the output judged is one row of the
call (``Functional.linear.0.forward.output.0``), whose captured tensor is the new output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from precision_harness.runs.api_replay import figures, msprobe_acc, names

#: msprobe's folder of captured tensors beside a rank's dump.json
TENSOR_DIR = "dump_tensor_data"


def replay_call(
    dump: dict[str, Any], rank_dir: Path, api: str, output_row: str, golden_dtype: str | None = None
) -> dict[str, Any]:
    """Figures of one output of one captured call (:func:`figures.output_figures`), or why there are none.

    Args:
        dump: the capture's parsed dump.json. rank_dir: its folder (``.../step0/rank0``).
        api: the call's dump.json key (``Functional.linear.0.forward``).
        output_row: msprobe's name of the output judged (``Functional.linear.0.forward.output.0``).
        golden_dtype: the golden's dtype of that output (``"torch.float32"``). Where it is a wider float than the
            captured output's, the baseline is replayed in it and the new output held to its standard: a narrowed
            output is judged by what the golden's dtype allows, never by its own (``figures["narrowed"]``).

    Returns:
        ``{"api", "output", "replayable": True, ...figures}`` or ``{"api", "output", "replayable": False, "reason"}``.
    """
    head = {"api": api, "output": output_row}
    why = names.why_not_replayable(api) or msprobe_acc.version_problem()
    entry = dump.get("data", {}).get(api)
    if why is None and entry is None:
        why = f"the capture holds no {api}"
    if why is not None:
        return {**head, "replayable": False, "reason": why}
    try:
        return {**head, "replayable": True, **_replay(entry, rank_dir, api, output_row, golden_dtype)}
    except _NoReplay as exc:
        return {**head, "replayable": False, "reason": str(exc)}
    except Exception as exc:  # the API's own error on these arguments: no verdict, its reason
        message = str(exc).splitlines()[0] if str(exc) else ""
        return {**head, "replayable": False, "reason": f"the replay failed: {type(exc).__name__}: {message}"}


class _NoReplay(Exception):
    """The call was rebuilt, but the replay is no reference for it."""


def _replay(entry: dict[str, Any], rank_dir: Path, api: str, output_row: str, golden_dtype: str | None) -> dict:
    prefix, name, _ = names.split(api)
    path = _output_path(api, output_row)
    new = _captured(entry, path, rank_dir)
    if not new.is_floating_point():
        raise _NoReplay(f"{output_row} is {new.dtype}: the judgement compares floating-point outputs")
    dtype = standard_dtype(new.dtype, golden_dtype)
    args, kwargs = msprobe_acc.api_params(entry, name, rank_dir / TENSOR_DIR)
    reference = _pick(msprobe_acc.run_api(prefix, name, *_cast(name, args, kwargs, torch.float64)), path)
    if reference.dtype != torch.float64:
        raise _NoReplay(f"{name} fixes its output dtype ({reference.dtype}) whatever its inputs: no float64 reference")
    baseline = _pick(msprobe_acc.run_api(prefix, name, *_cast(name, args, kwargs, dtype)), path)
    if reference.shape != new.shape:
        raise _NoReplay(f"the replay's {output_row} has shape {tuple(reference.shape)}, the capture {tuple(new.shape)}")
    result = figures.output_figures(name, new, baseline, reference, dtype=dtype)
    if dtype != new.dtype:
        result["narrowed"] = {"golden": str(dtype), "new": str(new.dtype)}
    return result


def standard_dtype(new: torch.dtype, golden: str | None) -> torch.dtype:
    """The dtype whose standard the new output is held to: the golden's where it is a wider float (a narrowing
    is judged by what the golden's dtype allows), else the new output's own."""
    wide = getattr(torch, golden.removeprefix("torch."), None) if golden else None
    if not isinstance(wide, torch.dtype) or not wide.is_floating_point or wide not in figures.UNIT_ROUNDOFF:
        return new
    return wide if figures.UNIT_ROUNDOFF[wide] < figures.UNIT_ROUNDOFF.get(new, 1.0) else new


def _output_path(api: str, output_row: str) -> list[int]:
    """``Functional.linear.0.forward.output.1`` -> ``[1]``: where the row sits in the call's outputs."""
    suffix = output_row[len(api) :].lstrip(".").split(".")
    if not suffix or suffix[0] != "output" or not all(p.isdigit() for p in suffix[1:]):
        raise _NoReplay(f"{output_row} is not an output of {api}")
    return [int(p) for p in suffix[1:]] or [0]


def _pick(value: Any, path: list[int]) -> torch.Tensor:
    """The tensor at ``path`` in an API's return value (a tensor, or nested tuples and lists)."""
    if isinstance(value, torch.Tensor) and path == [0]:
        return value
    for index in path:
        value = value[index] if isinstance(value, (list, tuple)) and index < len(value) else None
    if not isinstance(value, torch.Tensor):
        raise _NoReplay(f"the replay returned {type(value).__name__} where the capture holds a tensor")
    return value


def _captured(entry: dict[str, Any], path: list[int], rank_dir: Path) -> torch.Tensor:
    """The captured output tensor at ``path`` (its ``data_name`` under ``dump_tensor_data/``)."""
    node: Any = entry.get("output")
    for index in path:
        node = node[index] if isinstance(node, list) else node
    name = node.get("data_name") if isinstance(node, dict) else None
    if not name:
        raise _NoReplay("the capture holds no tensor for this output (msprobe task: tensor saves one per row)")
    return torch.load(rank_dir / TENSOR_DIR / name, map_location="cpu", weights_only=True)


def _cast(name: str, args: list[Any], kwargs: dict[str, Any], dtype: torch.dtype) -> tuple[list[Any], dict[str, Any]]:
    """Copies of the call's floating-point tensors in ``dtype`` (an explicit ``dtype=`` argument too): the
    reference's inputs in float64, the baseline's in the output's dtype; other values as they are."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                return value.clone()
            widened = msprobe_acc.upcast(name, value.clone(), dtype) if dtype == torch.float64 else value
            return widened.to(dtype).clone()
        if isinstance(value, torch.dtype) and value.is_floating_point:
            return dtype
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v) for v in value)
        return value

    return cast(list(args)), {key: cast(value) for key, value in kwargs.items()}
