"""Verdict text and reports.

- what a failing (or passing) stage or metrics item prints (:func:`stage_text`, :func:`metrics_text`);
- ``--precision-report DIR``: report.json (schema ``report``), report.md (a pull-request comment) and
  report.html (:mod:`precision_harness.report_html`), built from one plain record per item.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from precision_harness.compare import Drift, MetricsVerdict, StageVerdict
from precision_harness.scenario import STAGES as _STAGE_ORDER

#: problems listed before "... and N more"
MAX_PROBLEMS = 5


def _num(x: float | None) -> str:
    return "None" if x is None else f"{x:.7g}"


def _how_far(ratio: float, rel: float, *, exact: bool) -> str:
    if math.isinf(ratio):
        return f"rel {rel:.1e}, must match exactly" if exact else "non-finite"
    return f"rel {rel:.1e}, {ratio:.3g}x tolerance"


def _drift_line(label: str, d: Drift, multi_rank: bool) -> str:
    rank = f"{d.rank} " if multi_rank else ""
    how = _how_far(d.ratio, d.rel, exact=d.tol.rtol == 0 and d.tol.atol == 0)
    return f"  {label:<18}{rank}{d.tensor}  {d.statistic} {_num(d.golden)} -> {_num(d.target)} ({how})"


def settings_changed(golden: dict[str, Any] | None, current: dict[str, Any] | None) -> list[str]:
    """``["actor_rollout_ref.actor.optim.lr: 0.001 -> 0.002", ...]`` between two numeric-settings maps."""
    if not golden or current is None:
        return []
    keys = sorted(set(golden) | set(current))
    return [f"{k}: {golden.get(k)} -> {current.get(k)}" for k in keys if golden.get(k) != current.get(k)]


def stage_text(
    v: StageVerdict,
    *,
    artifacts: Path | None = None,
    rerun: str | None = None,
    changed: list[str] | None = None,
    msprobe: list[tuple[str, str]] | None = None,
) -> str:
    """The verdict of one stage, as in the architecture's "A failing stage reads like this".

    ``msprobe`` rows (label, text), msprobe's own first diff and graph command, follow ours.
    """
    ranks = ", ".join(v.ranks) or "rank0"
    where = f"{v.stage} @ step_{v.step}, {ranks}"
    if v.passed:
        how = "identical to the golden (sha256)" if v.identical else f"within tolerance ({v.tolerance})"
        return f"{where}: {v.checked} statistics {how}"
    if len(v.ranks) > 1 and v.failing_ranks:
        # multi-rank: name the rank that diverged first, then every rank that differs
        first_rank = v.first_divergence.rank if v.first_divergence is not None else v.failing_ranks[0]
        where = (
            f"{v.stage} @ step_{v.step}, {first_rank} (differs on {', '.join(v.failing_ranks)} of {len(v.ranks)} ranks)"
        )
    lines = []
    n = len({(d.rank, d.tensor, d.statistic) for d in v.drifts})
    if v.drifts:
        lines.append(f"{where}: {n} of {v.checked} statistics beyond tolerance ({v.tolerance})")
    else:
        lines.append(f"{where}: {len(v.problems)} structural difference(s) from the golden")
    multi = len(v.ranks) > 1
    first, largest = v.first_divergence, v.largest
    if first is not None:
        lines.append(_drift_line("first divergence", first, multi))
    if largest is not None and largest is not first:
        lines.append(_drift_line("largest", largest, multi))
    for label, text in msprobe or []:
        lines.append(f"  {label:<18}{text}")
    for problem in v.problems[:MAX_PROBLEMS]:
        lines.append(f"  {'always fails':<18}{problem}")
    if len(v.problems) > MAX_PROBLEMS:
        lines.append(f"  {'':<18}... and {len(v.problems) - MAX_PROBLEMS} more")
    for line in changed or []:
        lines.append(f"  {'setting changed':<18}{line}")
    if artifacts is not None:
        lines.append(f"  {'artifacts':<18}{artifacts}/")
    if rerun:
        lines.append(f"  {'rerun':<18}{rerun}")
    return "\n".join(lines)


def metrics_text(
    v: MetricsVerdict, *, rerun: str | None = None, changed: list[str] | None = None, policy_exact: bool = False
) -> str:
    """The verdict of a scenario's metrics.jsonl item."""
    if v.passed:
        return f"metrics.jsonl: {v.checked} values within tolerance"
    lines = [
        f"metrics.jsonl: {len(v.drifts)} of {v.checked} values beyond tolerance"
        if v.drifts
        else f"metrics.jsonl: {len(v.problems)} structural difference(s)"
    ]
    for d in sorted(v.drifts, key=lambda d: -d.ratio)[:MAX_PROBLEMS]:
        lines.append(
            f"  step_{d.step:<3} {d.name:<34} {_num(d.golden)} -> {_num(d.target)} ({_how_far(d.ratio, d.rel, exact=policy_exact)})"
        )
    if len(v.drifts) > MAX_PROBLEMS:
        lines.append(f"  ... and {len(v.drifts) - MAX_PROBLEMS} more")
    for problem in v.problems[:MAX_PROBLEMS]:
        lines.append(f"  always fails  {problem}")
    for line in changed or []:
        lines.append(f"  setting changed  {line}")
    if rerun:
        lines.append(f"  rerun  {rerun}")
    return "\n".join(lines)


# ======================================================================================= reports
# A report is built from plain records, one per item (:func:`item_record`), so it can be assembled
# wherever the items' results arrive: the pytest process, the xdist controller (records travel on
# the TestReport), or ``precision-harness compare``.

REPORT_FORMAT = 1
#: execution-order points kept per failing stage's drift profile (the plot); longer ones are thinned
MAX_PROFILE_POINTS = 4000


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _drift_json(d: Drift | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "rank": d.rank,
        "tensor": d.tensor,
        "statistic": d.statistic,
        "golden": _finite(d.golden),
        "target": _finite(d.target),
        "ratio": _finite(d.ratio),
        "order": d.order,
    }


def item_record(
    *, nodeid: str, scenario: str, step: int | None, stage: str | None, outcome: Any, run: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON-ready record of one item's :class:`~precision_harness.check.Outcome` (schema ``report``, ``items``)."""
    v = outcome.verdict
    rec: dict[str, Any] = {
        "nodeid": nodeid,
        "scenario": scenario,
        "step": step,
        "stage": stage,
        "kind": outcome.kind,
        "passed": bool(outcome.passed),
        "text": outcome.text,
        "worst_ratio": None,
        "checked": 0,
        "beyond": 0,
        "first_divergence": None,
        "largest": None,
        "problems": [],
        "msprobe_first_diff": {},
        "graphs": [],
        "msprobe_errors": [],
        "artifacts": str(outcome.artifacts) if outcome.artifacts else None,
        "compare_s": round(outcome.seconds, 4),
        "profile": [],
        "churn": [r.to_json() for r in outcome.extra.get("churn", [])],
        "run": run,
    }
    if isinstance(v, StageVerdict):
        rec.update(
            worst_ratio=_finite(v.worst_ratio),
            checked=v.checked,
            beyond=len(v.drifts),
            problems=v.problems[:20],
            first_divergence=_drift_json(v.first_divergence),
            largest=_drift_json(v.largest),
        )
        if not v.passed and v.profile:
            step_n = max(1, len(v.profile) // MAX_PROFILE_POINTS + (len(v.profile) % MAX_PROFILE_POINTS > 0))
            rec["profile"] = [[rank, order, name, _finite(ratio)] for rank, order, name, ratio in v.profile[::step_n]]
    elif isinstance(v, MetricsVerdict):
        worst = max((d.ratio for d in v.drifts), default=0.0)
        rec.update(
            worst_ratio=None if v.problems else _finite(worst),
            checked=v.checked,
            beyond=len(v.drifts),
            problems=v.problems[:20],
        )
    if outcome.kind == "error":
        rec["problems"] = [outcome.text]
    if outcome.msprobe is not None:
        rec.update(
            msprobe_first_diff=dict(outcome.msprobe.first_diff),
            graphs=[str(p) for p in outcome.msprobe.graphs],
            msprobe_errors=list(outcome.msprobe.errors),
        )
    return rec


def build_report(
    records: list[dict[str, Any]],
    *,
    mode: str,
    unused: list[dict[str, Any]] | None = None,
    pruned: list[str] | None = None,
    partial: list[str] | None = None,
) -> dict[str, Any]:
    """The report.json document: summary, items, per-scenario heatmaps, churn, unused goldens."""
    records = sorted(records, key=lambda r: (r["scenario"], r["step"] is None, r["step"] or 0, r["stage"] or ""))
    scenarios: dict[str, dict[str, Any]] = {}
    for r in records:
        sc = scenarios.setdefault(
            r["scenario"],
            {"name": r["scenario"], "steps": [], "stages": [], "cells": [], "run": None, "compare_s": 0.0},
        )
        sc["compare_s"] = round(sc["compare_s"] + r["compare_s"], 4)
        if r["run"]:
            sc["run"] = r["run"]
        if r["stage"] is None or r["step"] is None:
            continue
        if r["step"] not in sc["steps"]:
            sc["steps"].append(r["step"])
        if r["stage"] not in sc["stages"]:
            sc["stages"].append(r["stage"])
        sc["cells"].append(
            {
                "step": r["step"],
                "stage": r["stage"],
                "ratio": r["worst_ratio"],
                "passed": r["passed"],
                "kind": r["kind"],
                "structural": bool(r["problems"]),
            }
        )
    for sc in scenarios.values():
        sc["steps"].sort()
        order = {s: i for i, s in enumerate(_STAGE_ORDER)}
        sc["stages"].sort(key=lambda s: order.get(s, len(order)))
    return {
        "format": REPORT_FORMAT,
        "mode": mode,
        "summary": {
            "items": len(records),
            "passed": sum(r["passed"] for r in records),
            "failed": sum(not r["passed"] for r in records),
            "identical": sum(r["kind"] == "identical" for r in records),
            "recorded": sum(r["kind"] == "recorded" for r in records),
        },
        "scenarios": list(scenarios.values()),
        "items": records,
        "churn": [c for r in records for c in r["churn"]],
        "unused_goldens": unused or [],
        "pruned": pruned or [],
        "partial_run": partial or [],
    }


def _ratio_text(r: float | None, passed: bool, kind: str, structural: bool = True) -> str:
    if kind == "error":
        return "error"
    if kind == "recorded":
        return "recorded"
    if r is None:
        return ("structural" if structural else "inf") if not passed else "-"
    return "0" if r == 0 else f"{r:.2g}"


def write_report(directory: Path, document: dict[str, Any]) -> list[Path]:
    """Write ``report.json`` (schema-validated), ``report.md`` and ``report.html`` into ``directory``."""
    import json

    from precision_harness.scenario import validate

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    validate(document, "report", source=directory / "report.json")
    paths = [directory / "report.json", directory / "report.md", directory / "report.html"]
    paths[0].write_text(json.dumps(document, indent=1, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
    paths[1].write_text(markdown_report(document), encoding="utf-8")
    from precision_harness.report_html import html_report

    paths[2].write_text(html_report(document), encoding="utf-8")
    return paths


def markdown_report(doc: dict[str, Any]) -> str:
    """report.md: a pull-request comment (summary, failing items, heatmaps, churn, unused goldens)."""
    from precision_harness.churn import ChurnRow, churn_table

    s = doc["summary"]
    head = "passed" if not s["failed"] else f"{s['failed']} of {s['items']} failed"
    lines = [
        f"## pytest-precision ({doc['mode']}): {head}",
        "",
        f"{s['items']} items: {s['identical']} identical to golden, {s['passed'] - s['identical'] - s['recorded']} within tolerance, "
        f"{s['recorded']} recorded, {s['failed']} failed",
        "",
    ]
    failing = [r for r in doc["items"] if not r["passed"]]
    if failing:
        lines += [
            "### Failures",
            "",
            "| scenario | step | stage | worst ratio | first divergence | msprobe first diff |",
            "|---|---|---|---|---|---|",
        ]
        for r in failing:
            fd = r["first_divergence"]
            first = f"`{fd['tensor']}` {fd['statistic']}" if fd else (r["problems"][0] if r["problems"] else "")
            ms = ", ".join(f"`{op}`" for op in r["msprobe_first_diff"].values()) or "-"
            lines.append(
                f"| {r['scenario']} | {r['step'] if r['step'] is not None else ''} | {r['stage'] or 'metrics'} | "
                f"{_ratio_text(r['worst_ratio'], r['passed'], r['kind'], bool(r['problems']))} | {first.replace('|', '/')} | {ms} |"
            )
        lines.append("")
        for r in failing:
            lines += [
                "<details><summary>"
                + (f"{r['scenario']} {r['stage']} step_{r['step']}" if r["stage"] else f"{r['scenario']} metrics")
                + "</summary>",
                "",
                "```",
                r["text"],
                "```",
                "",
                "</details>",
                "",
            ]
    for sc in doc["scenarios"]:
        if not sc["cells"]:
            continue
        lines += [
            f"### {sc['name']}: worst tolerance ratio (stage x step; > 1 fails)",
            "",
            "| stage | " + " | ".join(f"step_{st}" for st in sc["steps"]) + " |",
            "|---|" + "---|" * len(sc["steps"]),
        ]
        cells = {(c["stage"], c["step"]): c for c in sc["cells"]}
        for stage in sc["stages"]:
            row = []
            for st in sc["steps"]:
                c = cells.get((stage, st))
                row.append(
                    ""
                    if c is None
                    else ("❌ " if not c["passed"] else "")
                    + _ratio_text(c["ratio"], c["passed"], c["kind"], c["structural"])
                )
            lines.append(f"| {stage} | " + " | ".join(row) + " |")
        lines.append("")
    if doc["churn"]:
        lines += [
            "### Golden churn against the previous golden",
            "",
            "Largest relative change per statistic (Mean: relative to RMS).",
            "",
        ]
        for name in sorted({c["scenario"] for c in doc["churn"]}):
            rows = [
                ChurnRow(**{**c, "max_rel": {k: (v if v is not None else math.inf) for k, v in c["max_rel"].items()}})
                for c in doc["churn"]
                if c["scenario"] == name
            ]
            changed = [r for r in rows if r.status != "unchanged"]
            lines.append(f"**{name}**: {len(changed)} of {len(rows)} stage dumps changed")
            lines.append("")
            if changed:
                lines += churn_table(changed, markdown=True) + [""]
    if doc["unused_goldens"]:
        lines += (
            ["### Unused goldens", ""]
            + [f"- `{u['path']}` (no collected scenario {u['scenario']})" for u in doc["unused_goldens"]]
            + [""]
        )
    if doc["pruned"]:
        lines += ["### Pruned goldens", ""] + [f"- `{p}`" for p in doc["pruned"]] + [""]
    return "\n".join(lines).rstrip() + "\n"
