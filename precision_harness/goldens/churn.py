"""Golden churn: what a re-record changes, per scenario x step x stage, for review in a pull request.

For every stage dump of a new run against the golden it replaces: the largest relative change of
each statistic over all tensors, how many APIs changed at all, and which APIs are new or removed.
Relative change is ``|new - old| / |old|`` for Max, Min and Norm and ``|new - old| / RMS`` for
Mean (RMS = Norm / sqrt(numel), as the tolerance judges Mean; means near 0 have no useful relative
change). A dump whose sha256 equals the golden's is "unchanged" without being parsed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precision_harness.dumps.rows import rms, tensors
from precision_harness.dumps.stage import DirStage, StageSource
from precision_harness.dumps.statistics import STATISTICS, relative_change

if TYPE_CHECKING:
    from precision_harness.goldens.golden import Golden


@dataclass
class ChurnRow:
    """Churn of one (step, stage) across its ranks."""

    scenario: str
    step: int
    stage: str
    status: str  #: "unchanged", "changed", "new" (no previous golden dump)
    max_rel: dict[str, float] = field(default_factory=dict)  #: statistic -> largest relative change
    changed_apis: int = 0
    apis: int = 0
    new_apis: list[str] = field(default_factory=list)
    removed_apis: list[str] = field(default_factory=list)
    #: the creep alarm (:func:`precision_harness.history.golden_history.creep_review`): ``{"commit", "subject",
    #: "updates_ago", "ratio", "last_ratio"}`` where the stage sits beyond tolerance from an older
    #: version, ``{"unavailable": line}`` outside git; None: no alarm
    creep: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_rel"] = {k: (v if math.isfinite(v) else None) for k, v in self.max_rel.items()}
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChurnRow:
        """Inverse of :meth:`to_json` (``None`` in ``max_rel`` is an infinite change)."""
        max_rel = {k: (math.inf if v is None else v) for k, v in data["max_rel"].items()}
        return cls(**{**data, "max_rel": max_rel})


def _change(stat: str, new: Any, old: Any, old_tensor: dict[str, Any]) -> float:
    """Relative change of one statistic; Mean's against the old tensor's RMS (:func:`~.dumps.rows.rms`)."""
    if new is None or old is None:
        return 0.0 if new is old else math.inf
    new, old = float(new), float(old)
    if new == old or (math.isnan(new) and math.isnan(old)):
        return 0.0
    scale = rms(old_tensor.get("Norm"), old_tensor.get("shape")) if stat == "Mean" else None
    if scale is not None and scale > 0 and math.isfinite(new) and math.isfinite(old):
        return abs(new - old) / scale
    return relative_change(new, old)


def _compare_dumps(new: dict[str, Any], old: dict[str, Any], row: ChurnRow) -> None:
    new_data, old_data = new.get("data", {}), old.get("data", {})
    row.apis += len(new_data)
    row.new_apis += [a for a in new_data if a not in old_data]
    row.removed_apis += [a for a in old_data if a not in new_data]
    for api, node in new_data.items():
        if api not in old_data:
            continue
        old_tensors = dict(tensors(old_data[api]))
        changed = False
        for path, tensor in tensors(node):
            old_tensor = old_tensors.get(path)
            if (
                old_tensor is None
                or tensor.get("dtype") != old_tensor.get("dtype")
                or tensor.get("shape") != old_tensor.get("shape")
            ):
                changed = True
                continue
            for stat in STATISTICS:
                c = _change(stat, tensor.get(stat), old_tensor.get(stat), old_tensor)
                if c > 0:
                    changed = True
                    row.max_rel[stat] = max(row.max_rel.get(stat, 0.0), c)
        row.changed_apis += changed


def stage_churn(scenario: str, new: StageSource, old: StageSource | None) -> ChurnRow:
    """Churn of one stage of a new run against the previous golden's stage (None: a new stage).

    A stage whose every rank has the old digest is "unchanged" without being parsed.
    """
    new_ranks = new.ranks()
    old_ranks = set(old.ranks()) if old is not None else set()
    if old is None or not old_ranks:
        apis = sum(len(new.load(r).get("data", {})) for r in new_ranks)
        return ChurnRow(scenario, new.step, new.name, "new", apis=apis)
    if old_ranks == set(new_ranks) and all(new.digest(r) == old.digest(r) for r in new_ranks):
        return ChurnRow(scenario, new.step, new.name, "unchanged", {s: 0.0 for s in STATISTICS})
    row = ChurnRow(scenario, new.step, new.name, "changed", {s: 0.0 for s in STATISTICS})
    for rank in sorted(set(new_ranks) | old_ranks):
        new_dump = new.load(rank) if rank in new_ranks else {"data": {}}
        old_dump = old.load(rank) if rank in old_ranks else {"data": {}}
        _compare_dumps(new_dump, old_dump, row)
    if not row.changed_apis and not row.new_apis and not row.removed_apis:
        row.status = "unchanged"
    return row


def run_churn(scenario: str, run_dir: Path, golden: Golden | None, steps: Iterable[int], stages: Iterable[str]):
    """Churn of every profiled (step, stage) of ``run_dir`` against ``golden`` (None: a first recording).

    Returns one :class:`ChurnRow` per (step, stage), steps outermost.
    """
    rows = []
    for step in steps:
        for stage in stages:
            new = DirStage(Path(run_dir) / f"step_{step}" / stage, step=step, name=stage)
            rows.append(stage_churn(scenario, new, golden.stage(step, stage) if golden is not None else None))
    return rows


def _rel(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "inf"
    return "0" if x == 0 else f"{x:.1e}"


def churn_table(rows: list[ChurnRow], *, markdown: bool = False) -> list[str]:
    """The churn table's lines (plain text for the terminal, or a Markdown table)."""
    header = ["step", "stage", *STATISTICS, "changed APIs", "new", "removed"]
    body = []
    for r in rows:
        if r.status == "new":
            body.append([f"step_{r.step}", r.stage, "new", "", "", "", f"{r.apis} new", "", ""])
            continue
        body.append(
            [
                f"step_{r.step}",
                r.stage,
                *(_rel(r.max_rel.get(s, 0.0)) for s in STATISTICS),
                f"{r.changed_apis}/{r.apis}",
                str(len(r.new_apis)),
                str(len(r.removed_apis)),
            ]
        )
    if markdown:
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(b) + " |" for b in body
        ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return [fmt(header)] + [fmt(b) for b in body]


def show_ratio(ratio: float | None) -> str:
    """``"3.2x"``, ``"0"``, ``"inf"`` (a structural change), ``"absent"`` (no such stage)."""
    if ratio is None:
        return "absent"
    if not math.isfinite(ratio):
        return "inf"
    if ratio == 0:
        return "0"
    return f"{ratio:.2g}x" if ratio < 0.1 else f"{ratio:.1f}x"


def creep_line(row: ChurnRow) -> str | None:
    """``"grpo_tiny step_2/actor_update: within tolerance of the last golden, 3.2x tolerance from a1b2c3d
    (7 updates ago)"``; None where the row has no alarm."""
    creep = row.creep
    if not creep or "commit" not in creep:
        return None
    last = creep.get("last_ratio")  # None: absent from the last golden, or its structure changed
    if last is None:
        against_last = "not comparable to the last golden (new, or its structure changed)"
    elif last <= 1.0:
        against_last = "within tolerance of the last golden"
    else:
        against_last = f"{show_ratio(last)} tolerance from the last golden"
    ratio = creep["ratio"] if creep["ratio"] is not None else math.inf
    return (
        f"{row.scenario} step_{row.step}/{row.stage}: {against_last}, {show_ratio(ratio)} tolerance from "
        f"{creep['commit']} ({creep['updates_ago']} updates ago)"
    )
