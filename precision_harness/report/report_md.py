"""report.md: the report as a pull-request comment (summary, failures, heatmaps, churn, unused goldens)."""

from __future__ import annotations

from typing import Any

from precision_harness.check.environment import grouped
from precision_harness.check.items import OutcomeKind
from precision_harness.goldens.churn import ChurnRow, churn_table, creep_line


def judgement_line(judgement: dict[str, Any]) -> str:
    """``regression at API Functional.linear.0.forward: ...``: a report record's judgement, as the verdict says it."""
    return f"{judgement['verdict']} at API {judgement['api']}: {judgement['reason']}"


def ratio_text(r: float | None, passed: bool, kind: OutcomeKind, structural: bool = True) -> str:
    """A heatmap cell's or a failure row's text: the worst tolerance ratio, or why there is none
    (``error``, ``recorded``, ``skipped``, ``structural``, ``inf``; ``-``: passed without a ratio)."""
    if kind is OutcomeKind.ERROR:
        return "error"
    if kind is OutcomeKind.RECORDED:
        return "recorded"
    if kind is OutcomeKind.SKIPPED:
        return "skipped"
    if r is None:
        return ("structural" if structural else "inf") if not passed else "-"
    return "0" if r == 0 else f"{r:.2g}"


def markdown_report(doc: dict[str, Any]) -> str:
    """report.md: a pull-request comment (summary, failing items, heatmaps, churn, unused goldens)."""
    lines = _summary(doc) + _environment(doc) + _code_paths(doc) + _failures(doc) + _heatmaps(doc)
    lines += _churn(doc) + _goldens(doc)
    return "\n".join(lines).rstrip() + "\n"


def _summary(doc: dict[str, Any]) -> list[str]:
    s = doc["summary"]
    head = "passed" if not s["failed"] else f"{s['failed']} of {s['items']} failed"
    within = s["passed"] - s["identical"] - s["recorded"]
    skipped = [r["text"] for r in doc["items"] if r["kind"] == OutcomeKind.SKIPPED.value]
    return [
        f"## pytest-precision ({doc['mode']}): {head}",
        "",
        f"{s['items']} items: {s['identical']} identical to golden, {within} within tolerance, "
        f"{s['recorded']} recorded, {s['failed']} failed, {s['skipped']} skipped",
        "",
        *(
            f"- skipped (--precision-allow-skip): {skipped.count(t)} items, not checked: {t}"
            for t in sorted({*skipped})
        ),
        *([""] if skipped else []),
    ]


def _environment(doc: dict[str, Any]) -> list[str]:
    """What differs between the run's environment and the goldens', once per distinct difference."""
    groups = grouped((sc["name"], sc.get("environment_diff") or []) for sc in doc["scenarios"])
    if not groups:
        return []
    differs = any(env.differs for env, _ in groups)
    lines = ["### Environment " + ("differs from the golden's" if differs else "not fully recorded by the golden"), ""]
    for env, names in groups:
        lines.append(f"- {', '.join(names)}: {env.summary}")
    return [*lines, ""]


def _code_paths(doc: dict[str, Any]) -> list[str]:
    """Every stage whose code path changed (calls inserted, removed or replaced), passing or not."""
    changed = [r for r in doc["items"] if r.get("code_path")]
    if not changed:
        return []
    lines = ["### Changed code paths", ""]
    for r in changed:
        how = "passed" if r["passed"] else "failed"
        lines.append(f"- {r['scenario']} `{r['stage']}` step_{r['step']} ({how}): {r['code_path']['line']}")
    return [*lines, ""]


def _failures(doc: dict[str, Any]) -> list[str]:
    """A table row per failing item, then each verdict's full text in a collapsed block."""
    failing = [r for r in doc["items"] if not r["passed"] and r["kind"] != OutcomeKind.SKIPPED.value]
    if not failing:
        return []
    lines = [
        "### Failures",
        "",
        "| scenario | step | stage | worst ratio | first divergence | change entered | judgement "
        "| msprobe first diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in failing:
        fd = r["first_divergence"]
        first = f"`{fd['tensor']}` {fd['statistic']}" if fd else (r["problems"][0] if r["problems"] else "")
        local = (r.get("localized") or {}).get("first_divergence")
        if local:
            first += f"; {r['localized']['level']}: `{local['tensor']}` {local['statistic']}"
        ms = ", ".join(f"`{op}`" for op in r["msprobe_first_diff"].values()) or "-"
        step = r["step"] if r["step"] is not None else ""
        ratio = ratio_text(r["worst_ratio"], r["passed"], OutcomeKind(r["kind"]), bool(r["problems"]))
        entered = f"{r['origin']['kind']}: `{r['origin']['row']}`" if r.get("origin") else "-"
        judged = f"**{r['judgement']['verdict']}** `{r['judgement']['api']}`" if r.get("judgement") else "-"
        cells = [r["scenario"], step, r["stage"] or "metrics", ratio, first, entered, judged, ms]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    lines.append("")
    for r in failing:
        title = f"{r['scenario']} {r['stage']} step_{r['step']}" if r["stage"] else f"{r['scenario']} metrics"
        judgement = [f"**judgement**: {judgement_line(r['judgement'])}", ""] if r.get("judgement") else []
        lines += [f"<details><summary>{title}</summary>", "", *judgement, "```", r["text"], "```", "", "</details>", ""]
    return lines


def _heatmaps(doc: dict[str, Any]) -> list[str]:
    """Per scenario, the worst tolerance ratio of each (stage, step), failing cells marked."""
    lines: list[str] = []
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
            row = [_cell(cells.get((stage, st))) for st in sc["steps"]]
            lines.append(f"| {stage} | " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return ""
    mark = "❌ " if not c["passed"] and c["kind"] != OutcomeKind.SKIPPED.value else ""
    return mark + ratio_text(c["ratio"], c["passed"], OutcomeKind(c["kind"]), c["structural"])


def _churn(doc: dict[str, Any]) -> list[str]:
    if not doc["churn"]:
        return []
    lines = [
        "### Golden churn against the previous golden",
        "",
        "Largest relative change per statistic (Mean: relative to RMS).",
        "",
    ]
    for name in sorted({c["scenario"] for c in doc["churn"]}):
        rows = [ChurnRow.from_json(c) for c in doc["churn"] if c["scenario"] == name]
        changed = [r for r in rows if r.status != "unchanged"]
        lines += [f"**{name}**: {len(changed)} of {len(rows)} stage dumps changed", ""]
        if changed:
            lines += [*churn_table(changed, markdown=True), ""]
        creep = [line for line in map(creep_line, rows) if line]
        if creep:
            lines += ["Creep against older goldens (not a failure: the reviewer decides):", ""]
            lines += [*(f"- ⚠️ {line}" for line in creep), ""]
    creeps = [c.get("creep") or {} for c in doc["churn"]]
    unavailable = next((c["unavailable"] for c in creeps if c.get("unavailable")), None)
    if unavailable:
        lines += [f"_{unavailable}_", ""]
    return lines


def _goldens(doc: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if doc["unused_goldens"]:
        lines += ["### Unused goldens", ""]
        lines += [f"- `{u['path']}` (no collected scenario {u['scenario']})" for u in doc["unused_goldens"]]
        lines.append("")
    if doc["pruned"]:
        lines += ["### Pruned goldens", "", *[f"- `{p}`" for p in doc["pruned"]], ""]
    return lines
