"""report.html: one self-contained file (inline CSS and SVG, no scripts, no network) that opens offline.

- a drift heatmap per scenario (``#heatmap``): stage x step, colour = worst tolerance ratio
  (white: identical; green to yellow: within tolerance; orange to red: beyond; dark red: structural);
- for each failing stage a plot of drift along execution order (``figure.drift-plot``): the worst
  tolerance ratio of every tensor, in the order the stage ran them, on a log scale with the
  tolerance line at 1 and the first divergence marked, so where divergence starts and how it spreads
  reads off one picture; msprobe's DiffAnalyzer answer is drawn beside ours.

matplotlib is imported here only, lazily, when a report is asked for.
"""

from __future__ import annotations

import html
import io
import math
import re
from typing import Any

from precision_harness.check.environment import grouped
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.errors import PrecisionError
from precision_harness.report.coverage_report import coverage_rows
from precision_harness.report.report_md import judgement_line, ratio_text

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.3em .6em;font-size:.9em;text-align:center}
th.stage,td.left{text-align:left}
td.fail{font-weight:bold}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.85em}
.legend span{display:inline-block;padding:.1em .5em;margin-right:.3em;border:1px solid #ccc;font-size:.8em}
figure.drift-plot{margin:1em 0;border:1px solid #ddd;padding:.5em}
p.origin,p.judgement{margin:.3em 0;font-size:.95em}
p.judgement.improvement{color:#1b5e20} p.judgement.regression{color:#b71c1c} p.judgement.undecided{color:#555}
"""


def ratio_colour(ratio: float | None, passed: bool, kind: OutcomeKind) -> str:
    """Background colour of a heatmap cell for a worst tolerance ratio."""
    if kind is OutcomeKind.ERROR or (ratio is None and not passed):
        return "#7f0000"  # structural, non-finite or an exact-match value that moved
    if kind is OutcomeKind.RECORDED or ratio is None:
        return "#eeeeee"
    if ratio == 0:
        return "#ffffff"
    if ratio <= 1:  # 1e-3 .. 1: green -> yellow
        t = min(1.0, max(0.0, (math.log10(max(ratio, 1e-3)) + 3) / 3))
        return _mix((0xC8, 0xE6, 0xC9), (0xFF, 0xF5, 0x9D), t)
    t = min(1.0, math.log10(ratio) / 3)  # 1 .. 1e3: orange -> red
    return _mix((0xFF, 0xB7, 0x4D), (0xD3, 0x2F, 0x2F), t)


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


def _slug(*parts: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(str(p) for p in parts)).strip("-")


def _cell_text(c: dict[str, Any]) -> str:
    return ratio_text(c["ratio"], c["passed"], OutcomeKind(c["kind"]), bool(c.get("structural")))


def heatmap(sc: dict[str, Any]) -> str:
    """One scenario's stage x step table."""
    cells = {(c["stage"], c["step"]): c for c in sc["cells"]}
    out = [
        f'<table class="heatmap" id="heatmap-{_slug(sc["name"])}"><tr><th class="stage">{html.escape(sc["name"])}</th>'
    ]
    out += [f"<th>step_{st}</th>" for st in sc["steps"]] + ["</tr>"]
    for stage in sc["stages"]:
        out.append(f'<tr><th class="stage">{html.escape(stage)}</th>')
        for st in sc["steps"]:
            c = cells.get((stage, st))
            if c is None:
                out.append("<td></td>")
                continue
            colour = ratio_colour(c["ratio"], c["passed"], OutcomeKind(c["kind"]))
            fg = "#fff" if colour == "#7f0000" else "#222"
            link = (
                f'<a href="#plot-{_slug(sc["name"], f"step_{st}", stage)}" style="color:{fg}">'
                if not c["passed"]
                else ""
            )
            cls = ' class="fail"' if not c["passed"] else ""
            close = "</a>" if link else ""
            style = f"background:{colour};color:{fg}"
            out.append(f'<td{cls} style="{style}" title="worst tolerance ratio">{link}{_cell_text(c)}{close}</td>')
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def _op_name(tensor: str) -> str:
    """``Functional.linear.0.forward.output.0`` -> ``Functional.linear.0.forward`` (DiffAnalyzer's op names)."""
    m = re.match(r"(.*?\.(?:forward|backward))(?:\.|$)", tensor)
    return m.group(1) if m else tensor


def _plot_ranks(ax: Any, spread: Any, profile: list[list[Any]], floor: float) -> None:
    """Each rank's tolerance ratios along execution order (``ax``) and its count beyond tolerance so far
    (``spread``)."""
    ranks = sorted({p[0] for p in profile})
    for rank in ranks:
        pts = [p for p in profile if p[0] == rank]
        xs = [p[1] for p in pts]
        ys = [max(p[3], floor) if p[3] is not None else 1e6 for p in pts]
        suffix = f" {rank}" if len(ranks) > 1 else ""
        ok = [(x, y) for x, y in zip(xs, ys, strict=True) if y <= 1]
        bad = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 1]
        if ok:
            ax.scatter(*zip(*ok, strict=True), s=4, color="#9e9e9e", label=f"within tolerance{suffix}")
        if bad:
            label = f"beyond tolerance{suffix} ({len(bad)})"
            ax.scatter(*zip(*bad, strict=True), s=6, color="#d32f2f", zorder=3, label=label)
        count, cum = 0, []
        for y in ys:
            count += y > 1
            cum.append(count)
        spread.step(xs, cum, where="post", color="#6a1b9a", lw=1.0, label=f"tensors beyond so far{suffix}")


def _mark_first_divergences(ax: Any, record: dict[str, Any], floor: float) -> None:
    """The gate's first divergence and msprobe's first differing op, as vertical lines with their names."""
    fd = record["first_divergence"]
    if fd:
        ax.axvline(fd["order"], color="#d32f2f", lw=0.8)
        ax.annotate(
            f"first divergence: {fd['tensor']}",
            (fd["order"], 1.0),
            xytext=(5, 12),
            textcoords="offset points",
            fontsize=7,
            color="#d32f2f",
        )
    names = {_op_name(p[2]): p[1] for p in reversed(record["profile"])}
    for op in record.get("msprobe_first_diff", {}).values():
        if op in names:
            ax.axvline(names[op], color="#1565c0", lw=0.8, ls=":")
            ax.annotate(
                f"msprobe first diff: {op}",
                (names[op], floor * 10),
                xytext=(5, 0),
                textcoords="offset points",
                fontsize=7,
                color="#1565c0",
            )


def drift_plot_svg(record: dict[str, Any]) -> str:
    """Inline SVG: worst tolerance ratio of every tensor along execution order, one line per rank."""
    try:
        import matplotlib

        matplotlib.use("svg", force=True)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PrecisionError(f"report.html needs matplotlib ({exc}); pip install matplotlib") from None
    floor = 1e-6
    fig, ax = plt.subplots(figsize=(9, 3.2), dpi=96)
    spread = ax.twinx()
    _plot_ranks(ax, spread, record["profile"], floor)
    spread.set_ylabel("tensors beyond tolerance so far", fontsize=8, color="#6a1b9a")
    ax.axhline(1.0, color="#555", ls="--", lw=0.8, label="tolerance")
    _mark_first_divergences(ax, record, floor)
    ax.set_yscale("log")
    ax.set_xlabel("tensor in execution order")
    ax.set_ylabel("|diff| / allowance")
    ax.set_title(f"{record['scenario']}  {record['stage']} @ step_{record['step']}", fontsize=9)
    handles = ax.get_legend_handles_labels()
    extra = spread.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="upper left", framealpha=0.85)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    return re.sub(r"<metadata>.*?</metadata>", "", svg[svg.index("<svg") :], flags=re.S)


def environment_section(doc: dict[str, Any]) -> str:
    """``#environment``: the run's environment against the goldens', once per distinct difference ("" if none)."""
    groups = grouped((sc["name"], sc.get("environment_diff") or []) for sc in doc["scenarios"])
    if not groups:
        return ""
    rows = "".join(
        f"<li><b>{html.escape(', '.join(names))}</b>: "
        f"{'differs' if env.differs else 'not fully recorded'}: {html.escape(env.summary)}</li>"
        for env, names in groups
    )
    return f'<section id="environment"><h2>Environment against the golden\'s</h2><ul>{rows}</ul></section>'


def coverage_section(doc: dict[str, Any]) -> str:
    """``#coverage``: per scenario, what share of its golden was compared and each part not compared with its reason
    (report.json's ``scenarios[].coverage``); "" where no scenario compared anything."""
    rows = coverage_rows(doc["scenarios"])
    if not rows:
        return ""
    body = "".join(
        f'<tr><th class="stage">{html.escape(name)}</th><td>{html.escape(share)}</td>'
        f'<td class="left">{html.escape(missing)}</td></tr>'
        for name, share, missing in rows
    )
    return (
        '<section id="coverage"><h2>Golden coverage: what each scenario compared of its golden</h2><table>'
        f'<tr><th class="stage">scenario</th><th>compared</th><th>not compared</th></tr>{body}</table></section>'
    )


def code_path_section(doc: dict[str, Any]) -> str:
    """``#code-paths``: every stage whose code path changed (calls inserted, removed or replaced), passing or not."""
    changed = [r for r in doc["items"] if r.get("code_path")]
    if not changed:
        return ""
    rows = "".join(
        f"<li><b>{html.escape(r['scenario'])} {html.escape(r['stage'])} @ step_{r['step']}</b> "
        f"({'passed' if r['passed'] else 'failed'}): {html.escape(r['code_path']['line'])}</li>"
        for r in changed
    )
    return f'<section id="code-paths"><h2>Changed code paths</h2><ul>{rows}</ul></section>'


def _reading(record: dict[str, Any]) -> str:
    """Where a failing stage's change entered and its judgement, above its verdict ("" for neither)."""
    parts = []
    if record.get("origin"):
        parts.append(f'<p class="origin"><b>change entered</b>: {html.escape(record["origin"]["text"])}</p>')
    if record.get("judgement"):
        verdict = html.escape(record["judgement"]["verdict"])
        line = html.escape(judgement_line(record["judgement"]))
        parts.append(f'<p class="judgement {verdict}"><b>judgement</b>: {line}</p>')
    return "".join(parts)


def failures_section(doc: dict[str, Any]) -> str:
    """``#failures``: each failing item's reading, its verdict and its drift plot ("" if none failed)."""
    failing = [r for r in doc["items"] if not r["passed"] and r["kind"] != OutcomeKind.SKIPPED.value]
    if not failing:
        return ""
    parts = ['<section id="failures"><h2>Failures</h2>']
    for r in failing:
        title = f"{r['scenario']} {r['stage']} @ step_{r['step']}" if r["stage"] else f"{r['scenario']} metrics"
        parts.append(f"<h3>{html.escape(title)}</h3>{_reading(r)}<pre>{html.escape(r['text'])}</pre>")
        if r["stage"] and r["profile"]:
            anchor = _slug(r["scenario"], "step_" + str(r["step"]), r["stage"])
            parts.append(
                f'<figure class="drift-plot" id="plot-{anchor}">'
                f"{drift_plot_svg(r)}<figcaption>drift along execution order: {html.escape(title)}"
                "</figcaption></figure>"
            )
    parts.append("</section>")
    return "".join(parts)


def churn_section(doc: dict[str, Any]) -> str:
    """``#churn``: an update's churn against the previous golden, and the creep alarm ("" without an update)."""
    if not doc["churn"]:
        return ""
    from precision_harness.goldens.churn import ChurnRow, churn_table, creep_line

    head = '<section id="churn"><h2>Golden churn against the previous golden</h2>'
    rows = [
        ChurnRow(**{**c, "max_rel": {k: (v if v is not None else math.inf) for k, v in c["max_rel"].items()}})
        for c in doc["churn"]
    ]
    creep = [line for line in map(creep_line, rows) if line]
    return head + "<pre>" + html.escape("\n".join(churn_table(rows) + creep)) + "</pre></section>"


def html_report(doc: dict[str, Any]) -> str:
    """The whole report.html."""
    s = doc["summary"]
    head = "passed" if not s["failed"] else f"{s['failed']} of {s['items']} failed"
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>pytest-precision report</title>',
        f"<style>{CSS}</style></head><body>",
        f"<h1>pytest-precision ({html.escape(doc['mode'])}): {html.escape(head)}</h1>",
        f"<p>{s['items']} items: {s['identical']} identical to golden, {s['recorded']} recorded, "
        f"{s['failed']} failed, {s['skipped']} skipped.</p>",
        '<section id="heatmap"><h2>Drift heatmap: worst tolerance ratio, stage x step (&gt; 1 fails)</h2>',
        '<p class="legend">'
        + "".join(
            f'<span style="background:{ratio_colour(r, p, k)};color:{"#fff" if k == "error" else "#222"}">{t}</span>'
            for r, p, k, t in (
                (0.0, True, "compared", "identical"),
                (0.01, True, "compared", "0.01"),
                (1.0, True, "compared", "1"),
                (10.0, False, "compared", "10"),
                (1000.0, False, "compared", "1000"),
                (None, False, "error", "structural / error"),
            )
        )
        + "</p>",
    ]
    for sc in doc["scenarios"]:
        if sc["cells"]:
            parts.append(heatmap(sc))
    parts.append("</section>")
    parts.append(environment_section(doc))
    parts.append(coverage_section(doc))
    parts.append(code_path_section(doc))
    parts.append(failures_section(doc))
    parts.append(churn_section(doc))
    if doc["unused_goldens"]:
        parts.append(
            '<section id="unused"><h2>Unused goldens</h2><ul>'
            + "".join(f"<li>{html.escape(u['path'])}</li>" for u in doc["unused_goldens"])
            + "</ul></section>"
        )
    parts.append("</body></html>\n")
    return "".join(parts)
