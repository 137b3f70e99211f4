"""The rows of FSDP2's all-gather buffer where a run (or its golden's) ran without the zero-fill: left out, counted,
named.

With two or more ranks, FSDP2's ``all_gather_copy_in`` takes ``Tensor.narrow`` of a buffer that was just allocated,
before anything is copied in, and msprobe's L1 dump records that call: under a torch whose allocation the fill knows
(:mod:`precision_harness.runs.verl.fsdp2_buffers`, patch 6) the buffer is zeroed and those rows read zeros. Under one it
does not know (torch 2.4, a release that moves the allocation again) the run proceeds unfilled, and each verl rank
records so in its ``env`` (:func:`~precision_harness.runs.verl.fsdp2_buffers.fill_record`; run.json, then the golden's
manifest). Then those rows hold uninitialised memory on that side: a difference there is no numeric change, and an
agreement is luck. So the compare does not compare them (:func:`settled` reads both records):

- they are found by the run's ``stack.json`` (goldens keep none; the golden's rows are the calls the run's pair
  with, as every row is paired): the ``Tensor.narrow`` calls whose innermost frame is one of torch's copy-in
  functions (:data:`FUNCTIONS`);
- the golden's rows and statistics they hold count in the coverage ledger as
  :data:`~precision_harness.check.coverage.UNFILLED`, a declared reason: shown, never a drop;
- the stage's verdict names them in one line (:func:`line`): how many rows, which, and why.

A run and golden both filled (every torch the fill knows, every committed golden) compare every row, as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from precision_harness.check.coverage import UNFILLED, held_by_columns, held_by_row
from precision_harness.dumps.call_site import calls_made_in
from precision_harness.runs.verl.fsdp2_buffers import unfilled_reason

if TYPE_CHECKING:
    from precision_harness.check.check_settings import CheckSettings
    from precision_harness.check.compare.stage_verdict import RankVerdict, StageVerdict
    from precision_harness.dumps.columns import Columns
    from precision_harness.dumps.stage import StageSource

#: the API whose rows read the unfilled buffer
API = "Tensor.narrow"
#: torch's functions that narrow the buffer: the copy-in kernels (``all_gather_copy_in_cuda``, ``_meta``, torch_npu's
#: ``_npu``, the gate's ``_all_gather_copy_in_zeroed``), and torch 2.4's ``foreach_all_gather``, which does it inline
FUNCTIONS = re.compile(r"_?all_gather_copy_in\w*|foreach_all_gather")
#: the verdict's label of :func:`line`
LABEL = "unfilled"
#: row names :func:`line` lists before "... and N more"
SHOWN = 3


def reason(golden_env: Mapping[str, Any] | None, run_env: Mapping[str, Any] | None) -> str | None:
    """Why the all-gather buffer rows go uncompared: the run's record, else the golden's (its run's, so said); None
    where both sides were filled or do not say (:func:`~precision_harness.runs.verl.fsdp2_buffers.unfilled_reason`)."""
    run = unfilled_reason(run_env)
    if run is not None:
        return run
    golden = unfilled_reason(golden_env)
    return f"the golden's run: {golden}" if golden is not None else None


def settled(settings: CheckSettings, target: Path, golden_env: Mapping[str, Any] | None) -> CheckSettings:
    """``settings`` with :attr:`~precision_harness.check.check_settings.CheckSettings.unfilled` read from ``target``'s
    run.json and the golden's ``env``, where the caller did not set it; a target without a readable run.json records
    nothing (a folder of dumps alone: only the golden's record is read)."""
    if settings.unfilled is not None:
        return settings
    try:
        run = json.loads((Path(target) / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = None
    run_env = run.get("env") if isinstance(run, dict) else None
    found = reason(golden_env, run_env if isinstance(run_env, dict) else None)
    return replace(settings, unfilled=found) if found is not None else settings


def calls(target: StageSource, rank: str) -> frozenset[str]:
    """The run's ``Tensor.narrow`` calls of ``rank`` made in torch's copy-in (:data:`FUNCTIONS`), by its
    ``stack.json``; none where ``target`` has no folder (a golden) or no stack."""
    folder = getattr(target, "path", None)
    return calls_made_in(Path(folder) / "step0" / rank, API, FUNCTIONS) if folder is not None else frozenset()


def skip_columns(v: RankVerdict, t: Columns, golden: Columns, paired: np.ndarray, skip: frozenset[str]) -> np.ndarray:
    """``(rows,)`` bool: the paired rows of the calls ``skip`` in the run's columns ``t`` (``golden``: the golden's
    aligned to them), left out of the compare: their names into ``v.unfilled`` and what the golden holds there into
    its ledger as :data:`~precision_harness.check.coverage.UNFILLED`."""
    mask = np.fromiter((api in skip for api in t.apis), dtype=bool, count=len(t.apis)) & paired
    if mask.any():
        names = [t.names[i] for i in np.flatnonzero(mask).tolist()]
        _leave_out(v, names, held_by_columns(golden.present, golden.scalar, mask))
    return mask


def skip_row(v: RankVerdict, name: str, golden_row: dict[str, Any]) -> None:
    """Row ``name`` of a call in the skipped set, paired with ``golden_row``: left out, as :func:`skip_columns`."""
    _leave_out(v, [name], held_by_row(golden_row))


def _leave_out(v: RankVerdict, names: list[str], held: tuple[int, int]) -> None:
    """Rows ``names`` named in ``v.unfilled``, and what the golden holds there (``(rows, statistics)``) moved in its
    ledger to :data:`~precision_harness.check.coverage.UNFILLED`."""
    rows, statistics = held
    v.coverage["rows"].miss(UNFILLED, rows)
    v.coverage["statistics"].miss(UNFILLED, statistics)
    v.unfilled += names


def line(v: StageVerdict) -> str | None:
    """``"378 Tensor.narrow row(s) not compared (rank0 Tensor.narrow.0.forward.input.0, ... and 375 more): torch
    2.4.1: ..."``: the verdict's one line of the rows left out, and why; None where none were."""
    if not v.unfilled:
        return None
    shown = ", ".join(f"{rank} {name}" for rank, name in v.unfilled[:SHOWN])
    more = f", ... and {len(v.unfilled) - SHOWN} more" if len(v.unfilled) > SHOWN else ""
    return f"{len(v.unfilled)} {API} row(s) not compared ({shown}{more}): {v.unfilled_reason}"
