"""Golden history and the creep alarm: six golden updates, each +0.4x tolerance on one statistic.

The session records each update with a fake runner (a prepared run directory) in a git repository
of its own; every update passes review against the last golden, and the alarm names the first
golden from the third update on.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from bisect_repo import git
from harness_testing import TINY, base_data, write_dump, write_run_json

from precision_harness.check.item_key import ItemKey
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.cli import main
from precision_harness.options import PrecisionOptions
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session import PrecisionSession

NORM = 12.5  #: Norm of Functional.linear.0.forward's output in base_data()
_NORM_TOL = TolerancePolicy().for_tensor(
    dtype="torch.float32", stage="actor_update", statistic="Norm", api="Functional.linear.0.forward.output.0"
)
STEP = 0.4 * (_NORM_TOL.atol + _NORM_TOL.rtol * NORM)  #: 0.4x its fp32 allowance
KEY = ItemKey(1, "actor_update")
UPDATES = 6
PG_LOSS = 2.0
#: 0.4x the default metric allowance of ``actor/pg_loss`` at :data:`PG_LOSS`
METRIC_STEP = 0.4 * (
    TolerancePolicy().for_metric("actor/pg_loss").atol + TolerancePolicy().for_metric("actor/pg_loss").rtol * PG_LOSS
)


def _run_dir(root: Path, scenario: Scenario, shift: float, metric_shift: float | None = None) -> Path:
    """A run of ``scenario`` whose actor_update @ step_1 has that Norm moved by ``shift``; with ``metric_shift``
    a metrics.jsonl whose ``actor/pg_loss`` is :data:`PG_LOSS` moved by it at every step."""
    shutil.rmtree(root, ignore_errors=True)
    for step in scenario.steps:
        for stage in scenario.stages:
            data = base_data()
            if (step, stage) == (KEY.step, KEY.stage):
                data["Functional.linear.0.forward"]["output"][0]["Norm"] = NORM + shift
            write_dump(root / f"step_{step}" / stage, data)
    write_run_json(root, scenario, {"device": "cpu"})
    if metric_shift is not None:
        rows = [{"training/global_step": step, "actor/pg_loss": PG_LOSS + metric_shift} for step in scenario.steps]
        (root / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def _update(
    root: Path, scenario: Scenario, shift: float, *, window: int = 10, metric_shift: float | None = None
) -> PrecisionSession:
    """One ``--precision-golden update`` of ``scenario`` whose run is prepared; the session, its records in."""
    target = _run_dir(root / "prepared", scenario, shift, metric_shift)

    def runner(s: Scenario, *, out_dir: Path, **kw) -> RunResult:
        return RunResult(s.name, target, json.loads((target / "run.json").read_text()), 0.1)

    options = PrecisionOptions(golden_mode="update", device="cpu", golden_dir=root / "golden", history_window=window)
    session = PrecisionSession(options, rootdir=root, runner=runner)
    try:
        for step in scenario.steps:
            for stage in scenario.stages:
                key = ItemKey(step, stage)
                out = session.outcome(scenario, key)
                assert out.passed, out.text
                nodeid = f"scenarios/tiny_ppo.yaml::{stage}[step_{step}]"
                session.report.records.append(session.record(out, nodeid=nodeid, scenario=scenario, key=key))
    finally:
        session.close()
    return session


def _project(root: Path) -> Scenario:
    (root / "scenarios").mkdir(parents=True)
    shutil.copy(TINY, root / "scenarios" / "tiny_ppo.yaml")
    (root / ".gitignore").write_text("prepared/\n.precision/\n")
    return Scenario.load(root / "scenarios" / "tiny_ppo.yaml")


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory):
    """The repository after six committed updates; each update's summary lines and report.json churn."""
    root = tmp_path_factory.mktemp("history") / "repo"
    scenario = _project(root)
    git(root, "init", "-q", "-b", "main")
    lines, churn = [], []
    for n in range(UPDATES):
        session = _update(root, scenario, n * STEP)
        lines.append(list(session.report.lines))
        churn.append(session.report.to_document()["churn"])
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"golden update {n}")
    shas = git(root, "log", "--reverse", "--format=%h").split()
    return root, scenario, lines, churn, shas


def _creep(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("  creep: ")]


def test_each_update_passes_review_and_the_alarm_fires_on_the_third(history) -> None:
    _, _, lines, churn, shas = history
    for n in (1, 2):
        assert not _creep(lines[n]), lines[n]  # 0.4x and 0.8x from the first golden: no alarm
        rows = [c for c in churn[n] if (c["step"], c["stage"]) == (KEY.step, KEY.stage)]
        assert rows[0]["status"] == "changed" and rows[0]["creep"] is None
    assert _creep(lines[3]) == [
        f"  creep: tiny_ppo step_1/actor_update: within tolerance of the last golden, 1.2x tolerance from "
        f"{shas[0]} (3 updates ago)"
    ]
    assert _creep(lines[5])[0].endswith(f"2.0x tolerance from {shas[0]} (5 updates ago)")
    (row,) = [c for c in churn[3] if c["creep"]]
    assert (row["step"], row["stage"], row["creep"]["commit"], row["creep"]["updates_ago"]) == (
        1,
        "actor_update",
        shas[0],
        3,
    )
    assert math.isclose(row["creep"]["ratio"], 1.2, rel_tol=1e-3)
    assert math.isclose(row["creep"]["last_ratio"], 0.4, rel_tol=1e-3)
    assert not any("history unavailable" in line for run in lines for line in run)


def test_the_window_bounds_how_far_back_the_alarm_looks(history, tmp_path: Path) -> None:
    """With precision_history_window = 2 the oldest version looked at is the one before the last: 0.8x, no alarm."""
    root, scenario, _, _, _ = history
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    session = _update(clone, scenario, UPDATES * STEP, window=2)
    assert not _creep(list(session.report.lines))
    session = _update(clone, scenario, (UPDATES + 1) * STEP, window=3)  # the 4th update, 3 commits back: 1.6x
    assert _creep(list(session.report.lines))


def test_report_md_and_json_carry_the_alarm(history, tmp_path: Path) -> None:
    root, scenario, _, _, shas = history
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    session = _update(clone, scenario, UPDATES * STEP)
    paths = session.report.write(tmp_path / "report")  # report.json validated against the schema
    md = paths[1].read_text()
    assert f"- ⚠️ tiny_ppo step_1/actor_update: within tolerance of the last golden, 2.4x tolerance from {shas[0]}" in md
    doc = json.loads(paths[0].read_text())
    assert [c["creep"]["updates_ago"] for c in doc["churn"] if c["creep"]] == [6]


def test_outside_git_history_is_unavailable_once(tmp_path: Path) -> None:
    scenario = _project(tmp_path)
    _update(tmp_path, scenario, 0.0)
    session = _update(tmp_path, scenario, STEP)
    lines = list(session.report.lines)
    unavailable = [line for line in lines if "history unavailable" in line]
    assert len(unavailable) == 1 and "not in a git checkout" in unavailable[0], lines
    assert not _creep(lines)
    md = session.report.write(tmp_path / "report")[1].read_text()  # report.json validated
    assert f"_{unavailable[0]}_" in md


def test_golden_history_command(history, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    root, _, _, _, shas = history
    monkeypatch.chdir(root)
    html = tmp_path / "history.html"
    assert main(["golden", "history", "scenarios/tiny_ppo.yaml", "--html", str(html)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tiny_ppo on cpu: the golden now against its 6 committed version(s)")
    heads = [line.split()[0] for line in out if not line.startswith(" ")][1:-1]
    assert heads == list(reversed(shas))  # newest first
    first = out.index(next(line for line in out if line.startswith(shas[0])))
    assert out[first + 1] == "    worst 2.0x at step_1/actor_update"
    assert out[first + 2] == "      step_1/actor_update  2.0x"
    latest = out.index(next(line for line in out if line.startswith(shas[-1])))
    assert out[latest + 1] == "    worst 0"
    assert "<svg" in html.read_text() and shas[0] in html.read_text()
    assert main(["golden", "history", "scenarios/tiny_ppo.yaml", "--since", shas[3]]) == 0
    assert "its 2 committed version(s)" in capsys.readouterr().out


def test_golden_history_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch, history) -> None:
    root, _, _, _, _ = history
    monkeypatch.chdir(root)
    assert main(["golden", "history", "scenarios/tiny_ppo.yaml", "--since", "nosuchrev"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("nosuchrev: unknown revision in " + str(root.resolve()) + " (expected a commit, branch or tag)")
    )
    outside = tmp_path / "outside"
    shutil.copytree(root, outside, ignore=shutil.ignore_patterns(".git"))
    monkeypatch.chdir(outside)
    assert main(["golden", "history", "scenarios/tiny_ppo.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("not in a git checkout (golden history is read from git)")


def test_a_changed_scenario_starts_a_new_baseline(history, tmp_path: Path) -> None:
    """Versions recorded under another scenario hash are not creep: the window stops at them."""
    root, scenario, _, _, _ = history
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    path = clone / "scenarios" / "tiny_ppo.yaml"
    path.write_text(path.read_text().replace("seed: 3", "seed: 4", 1))  # structural: another hash
    changed = Scenario.load(path)
    assert changed.hash != scenario.hash
    # 2.4x from the first golden, which test_report_md_and_json_carry_the_alarm shows alarms under one hash
    session = _update(clone, changed, UPDATES * STEP)
    assert not _creep(list(session.report.lines))
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "seed 4: golden re-recorded")
    session = _update(clone, changed, (UPDATES + 1) * STEP)
    assert not _creep(list(session.report.lines))


def test_golden_history_covers_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """Four updates, each moving only metrics.jsonl's actor/pg_loss by 0.4x its tolerance: the history
    names metrics.jsonl, 1.2x from the first version."""
    root = tmp_path / "repo"
    scenario = _project(root)
    git(root, "init", "-q", "-b", "main")
    for n in range(4):
        _update(root, scenario, 0.0, metric_shift=n * METRIC_STEP)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"metrics update {n}")
    shas = git(root, "log", "--reverse", "--format=%h").split()
    monkeypatch.chdir(root)
    assert main(["golden", "history", "scenarios/tiny_ppo.yaml"]) == 0
    out = capsys.readouterr().out.splitlines()
    first = out.index(next(line for line in out if line.startswith(shas[0])))
    assert out[first + 1 : first + 3] == ["    worst 1.2x at metrics.jsonl", "      metrics.jsonl  1.2x"], out
    second = out.index(next(line for line in out if line.startswith(shas[1])))
    assert out[second + 1] == "    worst 0.8x at metrics.jsonl"
