"""--precision-report DIR (report.json/.md/.html), JUnit properties, progress lines, msprobe's answer,
and the churn table of --precision-golden update: one real failing run and one re-record, shared."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from harness_testing import CHROMIUM, chromium_dom

from precision_harness.schemas import load_schema

pytestmark = pytest.mark.slow

LR_OLD = "critic:\n  ppo_mini_batch_size: 1\n  ppo_micro_batch_size_per_gpu: 2\n  optim:\n    lr: 1.0e-3"


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )


@pytest.fixture(scope="module")
def lr_changed(recorded_project: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """critic lr changed: a check run with a report and JUnit XML, then a re-record with a report."""
    root = tmp_path_factory.mktemp("report")
    shutil.copytree(recorded_project, root, ignore=shutil.ignore_patterns(".precision"), dirs_exist_ok=True)
    scenario = root / "scenarios" / "tiny_ppo.yaml"
    scenario.write_text(scenario.read_text().replace(LR_OLD, LR_OLD.replace("1.0e-3", "3.0e-3")))
    (root / "conftest.py").write_text(
        "import sys\n"
        "def pytest_terminal_summary(terminalreporter):\n"
        "    heavy = ('torch', 'transformers', 'msprobe.pytorch', 'matplotlib')\n"
        "    heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "    terminalreporter.write_line(f'HEAVY-MODULES: {heavy}')\n"
    )
    check = _pytest(root, "--precision-report", "rep", "--junitxml", "junit.xml")
    update = _pytest(root, "--precision-golden", "update", "--precision-report", "rep_update")
    return {"root": root, "check": check, "update": update}


def test_report_json_validates(lr_changed: dict) -> None:
    assert lr_changed["check"].returncode == 1, lr_changed["check"].stdout
    doc = json.loads((lr_changed["root"] / "rep" / "report.json").read_text())
    jsonschema.validate(doc, load_schema("report"))
    assert doc["mode"] == "check" and doc["summary"] == {
        "items": 11,
        "passed": 6,
        "failed": 5,
        "skipped": 0,
        "identical": 6,
        "recorded": 0,
    }
    cells = {(c["stage"], c["step"]): c for c in doc["scenarios"][0]["cells"]}
    assert cells[("actor_update", 2)]["passed"] is False and cells[("actor_update", 2)]["ratio"] > 1
    # critic_update moved a python-scalar input, which must match exactly: an infinite ratio, not structural
    assert cells[("critic_update", 1)] == {
        "step": 1,
        "stage": "critic_update",
        "ratio": None,
        "passed": False,
        "kind": "compared",
        "structural": False,
    }
    assert cells[("actor_update", 1)]["ratio"] == 0  # identical
    failing = next(r for r in doc["items"] if r["stage"] == "critic_update" and r["step"] == 1)
    assert (
        failing["profile"]
        and failing["first_divergence"]["tensor"]
        and failing["artifacts"] == ".precision/artifacts/tiny_ppo/step_1/critic_update"
    )
    assert "precision report: rep/report.json, rep/report.md, rep/report.html (" in lr_changed["check"].stdout


def test_gate_with_failures_and_report_imports_no_torch(lr_changed: dict) -> None:
    """compare, msprobe's first diff and the report ran in the pytest process: torch never came in."""
    assert (
        "HEAVY-MODULES: ['matplotlib']" in lr_changed["check"].stdout
    )  # matplotlib only because a report was asked for


def test_report_markdown_for_a_pull_request(lr_changed: dict) -> None:
    md = (lr_changed["root"] / "rep" / "report.md").read_text()
    assert md.startswith("## pytest-precision (check): 5 of 11 failed")
    rows = [line for line in md.splitlines() if line.startswith("| ") and "tiny_ppo" in line]
    assert any(re.search(r"\bcritic_update\[step_1\b", line) for line in rows), md  # alone, or in a shared row
    assert "### tiny_ppo: worst tolerance ratio (stage x step; > 1 fails)" in md
    assert "| actor_update | 0 | ❌ " in md


def test_junit_carries_worst_ratio_and_first_divergence(lr_changed: dict) -> None:
    tree = ET.parse(lr_changed["root"] / "junit.xml")
    case = next(c for c in tree.iter("testcase") if c.get("name") == "actor_update[step_2]")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert float(props["precision_worst_ratio"]) > 1
    assert props["precision_first_divergence"].split()[1] in ("Max", "Min", "Mean", "Norm")
    ok = next(c for c in tree.iter("testcase") if c.get("name") == "actor_update[step_1]")
    assert {p.get("name"): p.get("value") for p in ok.iter("property")}["precision_worst_ratio"] == "0"


def test_failure_shows_msprobe_beside_ours(lr_changed: dict) -> None:
    out = lr_changed["check"].stdout
    assert "  first divergence  " in out
    assert "  msprobe 1st diff  " in out
    assert (lr_changed["root"] / ".precision/artifacts/tiny_ppo/step_1/critic_update/first_diff").is_dir()


def test_progress_and_timings(lr_changed: dict) -> None:
    """Every stage start of the run is shown once, in execution order, whenever the run ended."""
    out = lr_changed["check"].stdout
    shown = [x.rsplit(" (", 1)[0] for x in out.splitlines() if x.startswith("[precision] tiny_ppo: step ")]
    stages = ("actor_compute_log_prob", "ref_compute_log_prob", "compute_values", "critic_update", "actor_update")
    assert shown == [f"[precision] tiny_ppo: step {step}/2 {stage}" for step in (1, 2) for stage in stages]
    line = next(x for x in out.splitlines() if x.startswith("tiny_ppo on cpu: run "))
    assert "10 dumped stages" in line and ", compare " in line


def test_update_prints_churn(lr_changed: dict) -> None:
    out = lr_changed["update"].stdout
    assert lr_changed["update"].returncode == 0, out
    assert "golden recorded: golden/tiny_ppo/cpu" in out
    assert "  churn against the previous golden: 4 of 10 stage dumps changed" in out
    header = next(x for x in out.splitlines() if x.strip().startswith("step  "))
    assert header.split() == ["step", "stage", "Max", "Min", "Mean", "Norm", "changed", "APIs", "new", "removed"]
    assert any(x.split()[:2] == ["step_1", "critic_update"] for x in out.splitlines())
    doc = json.loads((lr_changed["root"] / "rep_update" / "report.json").read_text())
    assert doc["mode"] == "update" and {c["status"] for c in doc["churn"]} == {"changed", "unchanged"}


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless check needs Debian chromium at /usr/bin/chromium (apt-get install -y chromium)",
)
def test_html_report_loads_in_headless_chromium(lr_changed: dict, tmp_path: Path) -> None:
    """The single-file HTML opens offline; the DOM has the heatmap and the failing stage's drift plot."""
    html = lr_changed["root"] / "rep" / "report.html"
    text = html.read_text()
    assert not any(s in text for s in ("<script", "<link", "src=", 'href="http'))  # nothing to fetch: opens offline
    proc = chromium_dom(html, tmp_path / "profile")
    dom = proc.stdout
    assert '<section id="heatmap">' in dom and 'id="heatmap-tiny_ppo"' in dom, proc.stderr[-2000:]
    start = dom.index('id="plot-tiny_ppo-step_1-critic_update"')
    assert "<svg" in dom[start : start + 2000] and "first divergence" in dom[start:]
