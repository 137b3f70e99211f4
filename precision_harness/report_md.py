"""report.md: the report as a pull-request comment (summary, failures, heatmaps, churn, unused goldens)."""

from __future__ import annotations

from typing import Any

from precision_harness.churn import ChurnRow, churn_table


def _ratio_text(r: float | None, passed: bool, kind: str, structural: bool = True) -> str:
    if kind == "error":
        return "error"
    if kind == "recorded":
        return "recorded"
    if r is None:
        return ("structural" if structural else "inf") if not passed else "-"
    return "0" if r == 0 else f"{r:.2g}"


def markdown_report(doc: dict[str, Any]) -> str:
    """report.md: a pull-request comment (summary, failing items, heatmaps, churn, unused goldens)."""
    s = doc["summary"]
    head = "passed" if not s["failed"] else f"{s['failed']} of {s['items']} failed"
    lines = [
        f"## pytest-precision ({doc['mode']}): {head}",
        "",
        f"{s['items']} items: {s['identical']} identical to golden, "
        f"{s['passed'] - s['identical'] - s['recorded']} within tolerance, "
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
                f"{_ratio_text(r['worst_ratio'], r['passed'], r['kind'], bool(r['problems']))} | "
                f"{first.replace('|', '/')} | {ms} |"
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
            rows = [ChurnRow.from_json(c) for c in doc["churn"] if c["scenario"] == name]
            changed = [r for r in rows if r.status != "unchanged"]
            lines.append(f"**{name}**: {len(changed)} of {len(rows)} stage dumps changed")
            lines.append("")
            if changed:
                lines += [*churn_table(changed, markdown=True), ""]
    if doc["unused_goldens"]:
        lines += (
            ["### Unused goldens", ""]
            + [f"- `{u['path']}` (no collected scenario {u['scenario']})" for u in doc["unused_goldens"]]
            + [""]
        )
    if doc["pruned"]:
        lines += ["### Pruned goldens", ""] + [f"- `{p}`" for p in doc["pruned"]] + [""]
    return "\n".join(lines).rstrip() + "\n"
