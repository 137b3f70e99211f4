"""The coverage ledger (precision_harness.check.coverage): every committed golden checked against itself compares
all it holds, by each compare path; a plant that leaves part of the golden unread shows the part, its reason and
its count in the verdict's ledger, the terminal summary, report.json and JUnit; a check that drops part of its
golden for a reason nothing declares fails unless --precision-allow-uncompared; a -k selection drops nothing."""

from __future__ import annotations

import copy
import json
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from harness_testing import base_data, write_dump
from test_code_path import check as check_code_path
from test_compare_at_scale import GOLDENS
from test_pairing import rope

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.metrics import compare_metrics
from precision_harness.check.compare.rank import compare_rank
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.check.coverage import (
    CHANGED_CODE_PATH,
    DECLARED_UNCHECKED,
    NOT_IN_RUN,
    NOT_RECORDED,
    Ledger,
)
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import Outcome, OutcomeKind, check_stage, covered
from precision_harness.dumps.stage import DirStage
from precision_harness.goldens.golden import Golden
from precision_harness.report.item_record import ItemRecord
from precision_harness.report.precision_report import PrecisionReport
from precision_harness.report.report_html import html_report
from precision_harness.report.report_md import markdown_report
from precision_harness.schemas import load_schema

SETTINGS = CheckSettings(scenario="s", policy=TolerancePolicy())
SOFTMAX = "Functional.softmax.0.forward"


def stage(root: Path, data: dict, ranks: tuple[str, ...] = ("rank0",)) -> DirStage:
    for rank in ranks:
        write_dump(root / "step_1" / "actor_update", data, rank)
    return DirStage(root / "step_1" / "actor_update", step=1, name="actor_update")


def units(ledger: Ledger) -> dict:
    return ledger.to_json()


# ------------------------------------------------------------------------ committed goldens against themselves
@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_every_committed_golden_checked_against_itself_compares_all_it_holds(path: Path) -> None:
    golden = Golden.from_dir(path)
    for step, name in sorted(golden.stages()):
        g = golden.stage(step, name)
        ledger = compare_stage(g, g, SETTINGS).ledger
        assert ledger.complete, (step, name, ledger.to_json())
        held = units(ledger)
        assert held["stages"] == {"held": 1, "compared": 1, "not_compared": {}}
        assert held["ranks"]["held"] == len(g.ranks()) and held["statistics"]["held"] > 0


@pytest.mark.parametrize("name", ["grpo_tiny", "ppo_dp2_tiny"])
def test_the_table_counts_what_the_identical_path_counts(name: str) -> None:
    """The same dumps compared by the table (not their digests) hold the same rows and statistics, all compared."""
    golden = Golden.from_dir(next(p for p in GOLDENS if p.parent.name == name))
    for step, stage_name in sorted(golden.stages()):
        g = golden.stage(step, stage_name)
        held = units(compare_stage(g, g, SETTINGS).ledger)
        rows = statistics = 0
        for rank in g.ranks():
            by_table = compare_rank(g.load(rank, raw=True), g.load(rank, raw=True), policy=SETTINGS.policy,
                                    stage=stage_name, rank=rank).coverage  # fmt: skip
            assert by_table.complete
            rows, statistics = rows + by_table["rows"].held, statistics + by_table["statistics"].held
        assert (rows, statistics) == (held["rows"]["held"], held["statistics"]["held"])


# ------------------------------------------------------------------------------------------------- plants
def test_a_rank_missing_from_the_run_leaves_its_rows_and_statistics_unread(tmp_path: Path) -> None:
    golden = stage(tmp_path / "golden", base_data(), ("rank0", "rank1"))
    target = stage(tmp_path / "target", base_data(), ("rank0",))
    one_rank = units(compare_stage(golden, golden, SETTINGS).ledger)
    v = compare_stage(target, golden, SETTINGS)
    ledger = units(v.ledger)
    assert ledger["ranks"] == {"held": 2, "compared": 1, "not_compared": {NOT_IN_RUN: 1}}
    half_rows, half_statistics = one_rank["rows"]["held"] // 2, one_rank["statistics"]["held"] // 2
    assert ledger["rows"] == {"held": 2 * half_rows, "compared": half_rows, "not_compared": {NOT_IN_RUN: half_rows}}
    assert ledger["statistics"]["not_compared"] == {NOT_IN_RUN: half_statistics}
    assert not v.passed and v.ledger.dropped == {unit: {NOT_IN_RUN: ledger[unit]["not_compared"][NOT_IN_RUN]}
                                                 for unit in ("ranks", "rows", "statistics")}  # fmt: skip


def test_a_row_missing_from_the_run_is_counted_with_its_statistics(tmp_path: Path) -> None:
    golden = stage(tmp_path / "golden", base_data())
    data = base_data()
    data[SOFTMAX]["output"] = []
    ledger = units(compare_stage(stage(tmp_path / "target", data), golden, SETTINGS).ledger)
    assert ledger["rows"]["not_compared"] == {NOT_IN_RUN: 1}
    assert ledger["statistics"]["not_compared"] == {NOT_IN_RUN: 4}
    assert ledger["rows"]["held"] == ledger["rows"]["compared"] + 1


def _no_statistics(data: dict) -> dict:
    data = copy.deepcopy(data)
    data[SOFTMAX]["output"][0].update(Max=None, Min=None, Mean=None, Norm=None)
    return data


@pytest.mark.parametrize("identical", [True, False], ids=["identical", "compared"])
def test_rows_msprobe_did_not_record_are_named_declared_where_the_scenario_declares_them(
    tmp_path: Path, identical: bool
) -> None:
    golden = stage(tmp_path / "golden", _no_statistics(base_data()))
    data = _no_statistics(base_data())
    if not identical:
        data["Functional.linear.0.forward"]["output"][0]["Max"] += 1e-9
    target = stage(tmp_path / "target", data)
    undeclared = compare_stage(target, golden, SETTINGS)
    assert undeclared.ledger["rows"].not_compared == {NOT_RECORDED: 1} and not undeclared.passed
    declared = CheckSettings(scenario="s", policy=TolerancePolicy.from_config({"unchecked": ["Functional.softmax.*"]}))
    v = compare_stage(target, golden, declared)
    assert v.passed and v.ledger["rows"].not_compared == {DECLARED_UNCHECKED: 1} and not v.ledger.dropped
    line = v.ledger.line("s")
    assert line.startswith("coverage s: ") and "rows: 1 declared unchecked" in line


def test_a_changed_code_path_names_the_golden_rows_it_left_to_the_code_path_rule(tmp_path: Path) -> None:
    out = check_code_path(tmp_path, rope(new=False), rope(new=True))
    ledger = out.ledger
    assert out.passed and ledger["rows"].not_compared.keys() == {CHANGED_CODE_PATH}
    assert ledger["statistics"].not_compared[CHANGED_CODE_PATH] > 0 and not ledger.dropped
    assert ledger["rows"].held == ledger["rows"].compared + ledger["rows"].not_compared[CHANGED_CODE_PATH]


def test_a_metric_the_run_lacks_is_counted_and_a_null_holds_nothing() -> None:
    golden = [{"training/global_step": 1, "actor/loss": 0.5, "actor/kl": None}, {"training/global_step": 2, "x": 1}]
    same = compare_metrics(golden, golden, SETTINGS).ledger
    assert same.complete and same["metrics"].held == 4
    run = [{"training/global_step": 1, "actor/kl": None}]
    ledger = compare_metrics(run, golden, SETTINGS).ledger
    assert ledger["metrics"].to_json() == {"held": 4, "compared": 1, "not_compared": {NOT_IN_RUN: 3}}


# ------------------------------------------------------------------------------------- the rule of a drop
def test_a_passing_check_that_dropped_part_of_its_golden_fails_unless_allowed(tmp_path: Path) -> None:
    golden = stage(tmp_path / "golden", base_data())
    passing = check_stage(golden, golden, SETTINGS)
    assert covered(passing, SETTINGS) is passing
    verdict = passing.verdict
    assert isinstance(verdict, StageVerdict)
    verdict.coverage["statistics"].miss(NOT_IN_RUN, 3)  # what a reason no rule judges leaves: a drop
    failed = covered(passing, SETTINGS)
    assert not failed.passed and failed.kind is OutcomeKind.ERROR
    assert failed.text.splitlines()[0] == (
        f"golden coverage dropped: statistics: 3 {NOT_IN_RUN} of what the golden holds was not compared; "
        "re-record the golden if that is intended, or accept it with --precision-allow-uncompared"
    )
    allowed = CheckSettings(scenario="s", policy=TolerancePolicy(), allow_uncompared=True)
    assert covered(passing, allowed) is passing
    verdict.coverage["statistics"].reclass(NOT_IN_RUN, CHANGED_CODE_PATH, 3)  # declared: no drop
    assert covered(passing, SETTINGS).passed


# ------------------------------------------------------------------------------ report.json, summary, JUnit
def _record(out: Outcome, scenario: str, step: int, name: str) -> ItemRecord:
    return ItemRecord.from_outcome(out, nodeid=f"{scenario}::{name}", scenario=scenario, step=step, stage=name)


def test_report_json_holds_each_scenarios_ledger_and_the_summary_names_only_the_one_that_moved(
    tmp_path: Path,
) -> None:
    golden = stage(tmp_path / "golden", base_data(), ("rank0", "rank1"))
    full = check_stage(golden, golden, SETTINGS)
    short = check_stage(stage(tmp_path / "target", base_data()), golden, SETTINGS)
    report = PrecisionReport(mode="check", records=[_record(full, "whole", 1, "a"), _record(short, "short", 1, "a")])
    report.write(tmp_path / "rep")
    doc = json.loads((tmp_path / "rep/report.json").read_text())
    jsonschema.validate(doc, load_schema("report"))
    by_name = {s["name"]: s["coverage"] for s in doc["scenarios"]}
    assert by_name["whole"]["steps"] == {"held": 1, "compared": 1, "not_compared": {}}
    assert all(not unit["not_compared"] for unit in by_name["whole"].values())
    assert by_name["short"]["ranks"] == {"held": 2, "compared": 1, "not_compared": {NOT_IN_RUN: 1}}
    assert all(item["coverage"] is not None for item in doc["items"])
    lines = [line for line in report.lines if line.startswith("coverage ")]
    assert len(lines) == 1 and lines[0].startswith("coverage short: ") and f"ranks: 1 {NOT_IN_RUN}" in lines[0]
    props = dict(report.records[0].user_properties())
    assert props["precision_coverage"].endswith(" golden statistics compared (100 %)")
    assert f"not compared: ranks: 1 {NOT_IN_RUN}" in dict(report.records[1].user_properties())["precision_coverage"]
    bad = copy.deepcopy(doc)
    bad["scenarios"][0]["coverage"]["statistics"]["not_compared"] = {NOT_IN_RUN: 0}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, load_schema("report"))


def test_report_md_and_html_show_each_scenarios_share_compared_and_why_the_rest_was_not(tmp_path: Path) -> None:
    """A reviewer reads report.md in a pull request: a row per scenario with report.json's figures, kept where the
    comment is cut to its budget; report.html the same."""
    golden = stage(tmp_path / "golden", base_data(), ("rank0", "rank1"))
    full = check_stage(golden, golden, SETTINGS)
    short = check_stage(stage(tmp_path / "target", base_data()), golden, SETTINGS)
    report = PrecisionReport(mode="check", records=[_record(full, "whole", 1, "a"), _record(short, "short", 1, "a")])
    doc = report.to_document()
    ledgers = {s["name"]: Ledger.from_json(s["coverage"]) for s in doc["scenarios"]}
    share, missing = ledgers["short"].headline(), ledgers["short"].missing_text()
    assert share == "30 of 60 golden statistics compared (50.0 %)"
    assert missing == f"ranks: 1 {NOT_IN_RUN}; rows: 8 {NOT_IN_RUN}; statistics: 30 {NOT_IN_RUN}"
    md = markdown_report(doc)
    assert f"| short | {share} | {missing} |" in md
    assert "| whole | 60 of 60 golden statistics compared (100 %) | - |" in md
    cut = markdown_report(doc, budget=1_000)
    assert "Cut to fit" in cut and "### Failures" not in cut
    assert f"| short | {share} | {missing} |" in cut and "| whole | " in cut
    page = html_report(doc)
    assert '<section id="coverage">' in page
    assert f'<th class="stage">short</th><td>{share}</td><td class="left">{missing}</td>' in page


# -------------------------------------------------------------------- end to end: a command scenario, 2 ranks
FAKE = textwrap.dedent(
    """
    import json, os
    from pathlib import Path

    data = json.loads(Path(__file__).with_name("dump_data.json").read_text())
    root = Path(os.environ["PRECISION_DUMP_DIR"])
    for step in map(int, os.environ["PRECISION_STEPS"].split(",")):
        for rank in ("rank0", "rank1")[: 1 if step == 2 and os.environ.get("FAKE_ONE_RANK") else 2]:
            out = root / f"step_{step}" / "actor_update" / "step0" / rank
            out.mkdir(parents=True, exist_ok=True)
            out.joinpath("dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "data": data}))
    """
)


def test_the_gate_shows_the_ledger_in_summary_report_and_junit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenarios = pytester.path / "scenarios"
    scenarios.mkdir()
    (scenarios / "fake_train.py").write_text(FAKE)
    (scenarios / "dump_data.json").write_text(json.dumps(base_data()))
    (scenarios / "fake.yaml").write_text(
        f"command: [{json.dumps(sys.executable)}, fake_train.py]\ninputs: [fake_train.py]\n"
        "global_profiler:\n  steps: [1, 2]\n  global_tool_config:\n    precision_debugger:\n"
        "      stages: [actor_update]\n      strict: true\n"
    )
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=2)
    whole = pytester.runpytest_subprocess("--precision-report", "rep", "--junitxml", "junit.xml")
    whole.assert_outcomes(passed=2)
    assert not [line for line in whole.outlines if line.startswith("coverage ")]  # silent when nothing moved
    doc = json.loads((pytester.path / "rep/report.json").read_text())
    assert doc["scenarios"][0]["coverage"]["ranks"] == {"held": 4, "compared": 4, "not_compared": {}}
    case = next(ET.parse(pytester.path / "junit.xml").iter("testcase"))
    assert {p.get("name"): p.get("value") for p in case.iter("property")}["precision_coverage"].endswith("(100 %)")

    monkeypatch.setenv("FAKE_ONE_RANK", "1")  # a run that lost a rank at step 2, where only step 1 is selected
    selected = pytester.runpytest_subprocess("--precision-report", "rep", "-k", "step_1")
    selected.assert_outcomes(passed=1)
    assert not [line for line in selected.outlines if line.startswith("coverage ")]  # -k drops nothing
    doc = json.loads((pytester.path / "rep/report.json").read_text())
    assert doc["scenarios"][0]["coverage"]["ranks"] == {"held": 2, "compared": 2, "not_compared": {}}


def test_an_outcome_without_a_verdict_carries_its_own_ledger_into_the_scenarios() -> None:
    """How a part of the golden no item compares (a golden stage the scenario no longer lists) joins the ledger."""
    narrowed = Ledger()
    narrowed["stages"].miss("narrowed scenario", held=True)
    out = Outcome(False, "the golden holds step 2 that this scenario no longer checks", OutcomeKind.ERROR)
    out.coverage = narrowed
    report = PrecisionReport(mode="check", records=[_record(out, "s", 2, "actor_update")])
    (line,) = [line for line in report.lines if line.startswith("coverage ")]
    expected = "0 of 1 golden stages compared (0.0 %); not compared: steps: 1 narrowed scenario; stages: 1 narrowed"
    assert line == f"coverage s: {expected} scenario"
