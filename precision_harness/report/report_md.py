"""report.md: the report as a pull-request comment (summary, golden coverage, failures, heatmaps, churn, unused
goldens).

It fits one comment (:data:`MD_BUDGET`): findings that many items share are said once
(:mod:`~precision_harness.report.item_groups`), and report.html and report.json keep every item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from precision_harness.check.environment import grouped
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.goldens.churn import ChurnRow, churn_table, creep_line
from precision_harness.report.coverage_report import coverage_rows
from precision_harness.report.item_groups import compact, counted, group_by, item_name

#: report.md's most bytes (UTF-8): GitHub caps a pull-request comment at 65,536 characters
MD_BUDGET = 60_000
#: bytes kept for the line that says what a cut report.md left out
NOTE_ROOM = 400


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


def markdown_report(doc: dict[str, Any], *, budget: int = MD_BUDGET) -> str:
    """report.md: a pull-request comment (summary, each scenario's golden coverage, failing items, heatmaps, churn,
    unused goldens), at most ``budget`` bytes of UTF-8.

    A finding many items share (a changed code path, a first divergence) is said once, with its count and
    the items in :func:`~precision_harness.report.item_groups.compact` form. Where the comment would still
    be longer than ``budget``, what matters least is left out (the verdicts' full texts first, then unused
    goldens, churn and heatmaps, then the failure table's last rows), and a line after the summary says how
    many failing items are not named and that report.html and report.json hold every item.
    """
    sections = [
        _summary(doc),
        _environment(doc),
        _coverage(doc),
        _code_paths(doc),
        _failures(doc),
        _details(doc),
        _heatmaps(doc),
        _churn(doc),
        _goldens(doc),
    ]
    text = _render(sections, None)
    if len(text.encode()) <= budget:
        return text
    return _fitted(doc, sections, budget)


@dataclass(frozen=True)
class _Block:
    """Lines kept or left out together; ``names``: the failing items (node ids) whose finding they give (a row of
    the failures table)."""

    lines: list[str]
    names: frozenset[str] = frozenset()

    @property
    def size(self) -> int:
        return sum(len(line.encode()) + 1 for line in self.lines)


@dataclass(frozen=True)
class _Section:
    """A heading (``head``) and closing lines (``tail``) shown with the first of its blocks that is kept.

    ``rank``: the order in which sections are kept where the comment must be cut (0 first)."""

    rank: int
    blocks: list[_Block] = field(default_factory=list)
    head: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)

    @property
    def frame(self) -> int:
        return _Block(self.head + self.tail).size


def _render(sections: list[_Section], kept: set[int] | None, note: list[str] | None = None) -> str:
    """The sections' lines in order, only the blocks whose ``id`` is in ``kept`` (all where None); ``note``
    after the first section."""
    lines: list[str] = []
    for i, section in enumerate(sections):
        blocks = [b for b in section.blocks if kept is None or id(b) in kept]
        if blocks:
            lines += section.head + [line for b in blocks for line in b.lines] + section.tail
        if i == 0 and note:
            lines += note
    return "\n".join(lines).rstrip() + "\n"


def _fitted(doc: dict[str, Any], sections: list[_Section], budget: int) -> str:
    """The sections cut to ``budget`` bytes: blocks kept in the order of their section's rank, each that fits."""
    room, kept = budget - NOTE_ROOM, set()
    for section in sorted(sections, key=lambda s: s.rank):
        opened = False
        for block in section.blocks:
            cost = block.size + (0 if opened else section.frame)
            if cost <= room:
                kept.add(id(block))
                room, opened = room - cost, True
    blocks = [b for s in sections for b in s.blocks]
    named = {name for b in blocks if id(b) in kept for name in b.names}
    unnamed = {r["nodeid"] for r in _failing(doc)} - named
    parts = sum(id(b) not in kept and not b.names for b in blocks)
    note = [
        f"_Cut to fit a pull-request comment ({budget:,} bytes): {len(unnamed)} failing item(s) left out of the "
        f"failures table, {parts} other part(s) left out; report.html and report.json hold every item in full._",
        "",
    ]
    return _render(sections, kept, note)  # kept blocks take at most budget - NOTE_ROOM bytes, the note less


def _failing(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["items"] if not r["passed"] and r["kind"] != OutcomeKind.SKIPPED.value]


def _summary(doc: dict[str, Any]) -> _Section:
    s = doc["summary"]
    head = "passed" if not s["failed"] else f"{s['failed']} of {s['items']} failed"
    within = s["passed"] - s["identical"] - s["recorded"]
    skipped = [r["text"] for r in doc["items"] if r["kind"] == OutcomeKind.SKIPPED.value]
    lines = [
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
    return _Section(0, [_Block(lines)])


def _environment(doc: dict[str, Any]) -> _Section:
    """What differs between the run's environment and the goldens', once per distinct difference."""
    groups = grouped((sc["name"], sc.get("environment_diff") or []) for sc in doc["scenarios"])
    if not groups:
        return _Section(1)
    differs = any(env.differs for env, _ in groups)
    head = ["### Environment " + ("differs from the golden's" if differs else "not fully recorded by the golden"), ""]
    blocks = [_Block([f"- {', '.join(names)}: {env.summary}"]) for env, names in groups]
    return _Section(1, blocks, head, [""])


def _coverage(doc: dict[str, Any]) -> _Section:
    """A row per scenario: what share of its golden was compared, and each part not compared with its reason (the
    figures of report.json's ``scenarios[].coverage``). Kept with the environment where the comment is cut: a
    green row must say what it did not compare."""
    head = [
        "### Golden coverage: what each scenario compared of its golden",
        "",
        "| scenario | compared | not compared (unit: count reason) |",
        "|---|---|---|",
    ]
    blocks = [_Block([f"| {name} | {share} | {missing} |"]) for name, share, missing in coverage_rows(doc["scenarios"])]
    return _Section(1, blocks, head, [""])


def _code_paths(doc: dict[str, Any]) -> _Section:
    """Every stage whose code path changed (calls inserted, removed or replaced), passing or not: one entry per
    distinct change (its cause and what changed), with the stages it was seen in."""
    changed = [r for r in doc["items"] if r.get("code_path")]
    blocks = []
    for group in group_by(changed, lambda r: (r["code_path"]["cause"], tuple(r["code_path"]["what"]))):
        first, failed = group[0], sum(not r["passed"] for r in group)
        if len(group) == 1:
            lines = [f"- {item_name(first)} ({'failed' if failed else 'passed'}): {first['code_path']['line']}"]
        else:
            same = len({r["code_path"]["line"] for r in group}) == 1
            line = first["code_path"]["line"]
            shown = line if same else f"{item_name(first)}, the first of them (report.html has each): {line}"
            lines = [f"- {len(group)} stage dumps ({failed} failed, {len(group) - failed} passed): {compact(group)}"]
            lines.append(f"  {shown}")
        blocks.append(_Block(lines))
    return _Section(2, blocks, ["### Changed code paths", ""], [""])


def _finding(r: dict[str, Any]) -> tuple[str, str, str, str]:
    """A failing item's finding, as its table row says it: (first divergence, change entered, judgement, msprobe)."""
    fd = r["first_divergence"]
    first = f"`{fd['tensor']}` {fd['statistic']}" if fd else (r["problems"][0] if r["problems"] else "")
    local = (r.get("localized") or {}).get("first_divergence")
    if local:
        first += f"; {r['localized']['level']}: `{local['tensor']}` {local['statistic']}"
    ms = ", ".join(f"`{op}`" for op in r["msprobe_first_diff"].values()) or "-"
    entered = f"{r['origin']['kind']}: `{r['origin']['row']}`" if r.get("origin") else "-"
    judged = f"**{r['judgement']['verdict']}** `{r['judgement']['api']}`" if r.get("judgement") else "-"
    return first, entered, judged, ms


def _failures(doc: dict[str, Any]) -> _Section:
    """A table row per finding that failing items share (one item, or their count and compact list)."""
    head = [
        "### Failures",
        "",
        "| items | worst ratio | first divergence | change entered | judgement | msprobe first diff |",
        "|---|---|---|---|---|---|",
    ]
    blocks = []
    for group in group_by(_failing(doc), _finding):
        cells = [counted(group), _worst(group), *_finding(group[0])]
        row = "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"
        blocks.append(_Block([row], frozenset(r["nodeid"] for r in group)))
    return _Section(3, blocks, head, [""])


def _worst(group: list[dict[str, Any]]) -> str:
    """The worst ratio cell of items that share a finding: an error or a ratio without a number first."""
    texts = [ratio_text(r["worst_ratio"], r["passed"], OutcomeKind(r["kind"]), bool(r["problems"])) for r in group]
    for word in ("error", "structural", "inf"):
        if word in texts:
            return word
    numbers = [r["worst_ratio"] for r in group if r["worst_ratio"] is not None]
    if len(numbers) == len(group):
        worst = max(numbers)
        return "0" if worst == 0 else f"{worst:.2g}"
    return texts[0]


def _details(doc: dict[str, Any]) -> _Section:
    """A finding's full verdict text in a collapsed block: that of its first item, the others' in report.html."""
    blocks = []
    for group in group_by(_failing(doc), _finding):
        r = group[0]
        title = item_name(r)
        if len(group) > 1:
            title += f" and {len(group) - 1} more item(s) with the same finding (report.html has each verdict)"
        judgement = [f"**judgement**: {judgement_line(r['judgement'])}", ""] if r.get("judgement") else []
        lines = [f"<details><summary>{title}</summary>", "", *judgement, "```", r["text"], "```", "", "</details>", ""]
        blocks.append(_Block(lines))
    return _Section(7, blocks)


def _heatmaps(doc: dict[str, Any]) -> _Section:
    """Per scenario, the worst tolerance ratio of each (stage, step), failing cells marked."""
    blocks = []
    for sc in doc["scenarios"]:
        if not sc["cells"]:
            continue
        lines = [
            f"### {sc['name']}: worst tolerance ratio (stage x step; > 1 fails)",
            "",
            "| stage | " + " | ".join(f"step_{st}" for st in sc["steps"]) + " |",
            "|---|" + "---|" * len(sc["steps"]),
        ]
        cells = {(c["stage"], c["step"]): c for c in sc["cells"]}
        for stage in sc["stages"]:
            row = [_cell(cells.get((stage, st))) for st in sc["steps"]]
            lines.append(f"| {stage} | " + " | ".join(row) + " |")
        blocks.append(_Block([*lines, ""]))
    return _Section(4, blocks)


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return ""
    mark = "❌ " if not c["passed"] and c["kind"] != OutcomeKind.SKIPPED.value else ""
    return mark + ratio_text(c["ratio"], c["passed"], OutcomeKind(c["kind"]), c["structural"])


def _churn(doc: dict[str, Any]) -> _Section:
    return _Section(5, [_Block(_churn_lines(doc))] if doc["churn"] else [])


def _churn_lines(doc: dict[str, Any]) -> list[str]:
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


def _goldens(doc: dict[str, Any]) -> _Section:
    lines: list[str] = []
    if doc["unused_goldens"]:
        lines += ["### Unused goldens", ""]
        lines += [f"- `{u['path']}` (no collected scenario {u['scenario']})" for u in doc["unused_goldens"]]
        lines.append("")
    if doc["pruned"]:
        lines += ["### Pruned goldens", "", *[f"- `{p}`" for p in doc["pruned"]], ""]
    return _Section(6, [_Block(lines)] if lines else [])
