"""report.md fits a pull-request comment: a finding many items share is said once, with its count and a compact
list of the items; past its budget the comment is cut, and says what it left out. report.json keeps every item.

The records are the report's own (:class:`ItemRecord`), shaped like the older-transformers upgrade of issue 52:
74 failing stage dumps with one first divergence and one changed code path, 55 passing ones with the same change.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.localize.drift_origin import DriftOrigin, OriginKind
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.report.item_groups import compact, step_ranges
from precision_harness.report.item_record import ItemRecord
from precision_harness.report.precision_report import PrecisionReport
from precision_harness.report.report_md import MD_BUDGET, markdown_report

UPGRADE = EnvironmentDiff.between({"transformers": "5.10.4"}, {"transformers": "4.57.1"})
SCENARIOS = ("dapo_tiny", "grpo_tiny", "ppo_gae_tiny", "ppo_tiny_bf16", "reinforce_tiny", "rloo_tiny")
STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "compute_values", "critic_update", "actor_update")
MASK = "Tensor.__getitem__.3.forward.output.0"
CODE_PATH = {
    "line": (
        "transformers 5.10.4 -> 4.57.1 changed the code path: Torch.arange -> Tensor.expand, Tensor.__and__ (x2; "
        "first after Functional.embedding.0.forward, before Torch.triu.0.forward, at transformers/masking_utils.py:"
        "112 in sdpa_mask: causal_mask = causal_mask[None, None, :, :].expand(batch_size, -1, -1, -1)); paired "
        "values beyond tolerance (worst ratio inf: a dtype, shape or finiteness changed, or an exact value moved), "
        "the values leaving the changed calls identical"
    ),
    "count": 2,
    "failing": 0,
    "undecided": 0,
    "what": ["Torch.arange -> Tensor.expand, Tensor.__and__"],
    "cause": "transformers 5.10.4 -> 4.57.1",
    "changes": [],
}


def _text(scenario: str, stage: str, step: int) -> str:
    """A failing verdict of the length the real one has (about 3 KB)."""
    lines = [
        f"{stage} @ step_{step}, rank0: 1 structural difference(s) from the golden",
        f"  environment differs from the golden's: {UPGRADE.summary}",
        f"  change entered    the change is upstream of {stage}: its input {MASK} is the first value that differs",
        f"  always fails      {MASK}: dtype/shape torch.bool [1, 1, 16, 16] -> torch.bool [16, 16]",
        f"  code path         2 other changed block(s) whose values match: {CODE_PATH['what'][0]} (x2)",
        f"  artifacts         .precision/artifacts/{scenario}/step_{step}/{stage}/",
        f'  rerun             pytest scenarios/{scenario}.yaml -k "{stage} and step_{step}"',
    ]
    lines += [f"  msprobe           DiffAnalyzer: the mask row {i} differs in shape, not in value" for i in range(20)]
    return "\n".join(lines)


def _origin(stage: str) -> DriftOrigin:
    api = MASK.rsplit(".output", 1)[0]
    return DriftOrigin(OriginKind.UPSTREAM, MASK, api, "rank0", stage, MASK, structural=True)


def _record(scenario: str, stage: str, step: int, *, passed: bool) -> ItemRecord:
    return ItemRecord(
        nodeid=f"scenarios/{scenario}.yaml::{stage}[step_{step}]",
        scenario=scenario,
        step=step,
        stage=stage,
        kind=OutcomeKind.COMPARED,
        passed=passed,
        text=_text(scenario, stage, step) if not passed else f"{stage} @ step_{step}: 120 statistics within tolerance",
        worst_ratio=0.0 if passed else None,
        checked=120,
        problems=[] if passed else [f"rank0: {MASK}: dtype/shape torch.bool [1, 1, 16, 16] -> torch.bool [16, 16]"],
        environment_diff=UPGRADE.to_json(),
        origin=None if passed else _origin(stage).to_json(),
        code_path=CODE_PATH,
    )


def _upgrade() -> PrecisionReport:
    """129 items: 74 failing alike, 55 passing; every one with the same changed code path."""
    cells = [(sc, st, step) for sc in SCENARIOS for st in STAGES for step in (1, 2, 3, 4, 5)][:129]
    records = [_record(*cell, passed=i >= 74) for i, cell in enumerate(cells)]
    return PrecisionReport(mode="check", records=records)


def test_a_74_item_failing_upgrade_fits_a_pull_request_comment(tmp_path: Path) -> None:
    report = _upgrade()
    report.write(tmp_path)
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert len(md.encode()) < MD_BUDGET <= 60_000, len(md.encode())
    assert md.startswith("## pytest-precision (check): 74 of 129 failed")
    assert "Cut to fit" not in md  # grouping alone is enough: nothing left out
    failing = [r for r in report.records if not r.passed]
    # the changed code path: once, with its count, and every stage dump named in the compact list
    assert md.count(CODE_PATH["line"]) == 1
    assert f"- 129 stage dumps (74 failed, 55 passed): {compact([r.to_json() for r in report.records])}" in md
    # the shared first finding: one table row, with the count and a compact list naming every failing item
    rows = [line for line in md.splitlines() if line.startswith("| 74 items: ")]
    assert len(rows) == 1 and f"| 74 items: {compact([r.to_json() for r in failing])} | structural | " in rows[0]
    named = _named(rows[0])
    assert named == {(r.scenario, r.stage, r.step) for r in failing}
    assert md.count("<details>") == 1 and "and 73 more item(s) with the same finding" in md
    # report.json and report.html keep every item in full
    doc = json.loads((tmp_path / "report.json").read_text())
    assert [item["text"] for item in doc["items"]] == [r.text for r in _sorted(report.records)]
    assert all(item["code_path"] == CODE_PATH for item in doc["items"])
    html = (tmp_path / "report.html").read_text()
    assert all(f"{r.stage} @ step_{r.step}" in html for r in failing)


def _sorted(records: list[ItemRecord]) -> list[ItemRecord]:
    return sorted(records, key=lambda r: (r.scenario, r.step, r.stage))


def _named(row: str) -> set[tuple[str, str, int]]:
    """The (scenario, stage, step) items a compact list names: ``sc {a, b}[step_1..3, step_5], c[step_2]; ...``."""
    listed = row.removeprefix("| 74 items: ").split(" | ")[0]
    found = set()
    for part in listed.split("; "):
        scenario, rest = part.split(" ", 1)
        for stages, steps in re.findall(r"(\{[^}]*\}|\w+)\[([^\]]*)\]", rest):
            for stage in stages.strip("{}").split(", "):
                for run in steps.split(", "):
                    first, _, last = run.removeprefix("step_").partition("..")
                    found |= {(scenario, stage, s) for s in range(int(first), int(last or first) + 1)}
    return found


def test_past_its_budget_report_md_is_cut_and_says_what_it_left_out(tmp_path: Path) -> None:
    """Findings that share nothing (each item its own first divergence): the comment is cut, never over budget."""
    report = _upgrade()
    for i, r in enumerate(r for r in report.records if not r.passed):
        r.problems = [f"rank0: Functional.linear.{i}.forward.output.0: dtype/shape {'x' * 300}"]
    doc = report.to_document()
    full = markdown_report(doc, budget=10**9)
    assert len(full.encode()) > 40_000 and "Cut to fit" not in full
    md = markdown_report(doc, budget=20_000)
    assert len(md.encode()) <= 20_000
    rows = [line for line in md.splitlines() if line.startswith("| ") and "Functional.linear." in line]
    assert 0 < len(rows) < 74
    left = f"_Cut to fit a pull-request comment (20,000 bytes): {74 - len(rows)} failing item(s) left out of the "
    assert left + "failures table, " in md
    assert "report.html and report.json hold every item in full._" in md
    assert md.startswith("## pytest-precision (check): 74 of 129 failed")


def test_compact_names_steps_as_runs_and_stages_that_share_them_together() -> None:
    assert step_ranges([5, 1, 2, 3, 7]) == "step_1..3, step_5, step_7"
    records = [
        {"scenario": "grpo_tiny", "stage": stage, "step": step}
        for stage, steps in (("actor_update", (1, 2)), ("actor_compute_log_prob", (1, 2)), ("critic_update", (2,)))
        for step in steps
    ] + [{"scenario": "grpo_tiny", "stage": None, "step": None}, {"scenario": "dapo_tiny", "stage": "x", "step": 1}]
    assert compact(records) == (
        "dapo_tiny x[step_1]; grpo_tiny {actor_compute_log_prob, actor_update}[step_1..2], critic_update[step_2], "
        "metrics"
    )
