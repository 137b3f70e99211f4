"""Reruns as the check ran (issue 36): ``calibrate``'s reruns of a verl scenario with pinned rollouts, and the
judgement's capture rerun, are started with the check's pinned rollouts (the golden's), Ray address and device.
Rollouts a rerun sampled itself would differ from the check's by sampling noise: calibration would store it as
device noise (and widen the tolerance to 3x it), and the judgement would read "not deterministic". No verl runs
here: the runner is a fake that records how each run was started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_testing import base_data, write_dump, write_run_json

from precision_harness import cli
from precision_harness import session as session_module
from precision_harness.check.item_key import ItemKey
from precision_harness.check.rerun import replay
from precision_harness.errors import RunFailedError
from precision_harness.goldens.store import GoldenStore
from precision_harness.options import PrecisionOptions
from precision_harness.runs import kind_runners
from precision_harness.runs.launch import RunOptions, RunResult
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session import PrecisionSession

RAY = "ray://head:10001"
VERL_SCENARIO = """engine: verl
verl: {overrides: {algorithm.adv_estimator: grpo}}
global_profiler:
  steps: [1]
  global_tool_config:
    precision_debugger: {stages: [actor_update]}
"""


def _recorded(root: Path, scenario: Scenario, *, moved: bool = False) -> Path:
    """A run folder of ``scenario`` with its pinned rollouts (``moved``: one output Norm 1 % off)."""
    data = base_data()
    if moved:
        data["Functional.linear.0.forward"]["output"][0]["Norm"] *= 1.01
    write_dump(root / "step_1" / "actor_update", data)
    write_run_json(root, scenario, {"device": "cpu"})
    (root / "metrics.jsonl").write_text('{"step": 1, "actor/pg_loss": 0.5}\n')
    (root / "rollouts" / "step_1").mkdir(parents=True)
    (root / "rollouts" / "step_1" / "batch.pt").write_bytes(b"the rollouts the golden recorded")
    return root


@pytest.fixture
def verl_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Scenario, GoldenStore]:
    """A pinned-rollout verl scenario (loaded without verl's checks) and its golden on cpu."""
    (tmp_path / "scenarios").mkdir()
    path = tmp_path / "scenarios" / "v.yaml"
    path.write_text(VERL_SCENARIO)
    scenario = Scenario.load(path)
    assert scenario.pins_rollouts
    store = GoldenStore(tmp_path / "golden")
    store.promote(_recorded(tmp_path / "recorded", scenario), scenario, "cpu")
    monkeypatch.setattr(session_module, "engine_missing", lambda s: None)  # verl "installed"
    return scenario, store


def _rollouts(options: RunOptions) -> list[str]:
    return sorted(n for n in options.pinned.contents if n.startswith("rollouts/")) if options.pinned else []


def test_the_judgements_capture_rerun_runs_as_the_check_did(
    verl_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario, store = verl_project
    target = _recorded(tmp_path / "target", scenario, moved=True)
    started: list[tuple[str, RunOptions]] = []

    def runner(s: Scenario, *, out_dir: Path, device: str, options: RunOptions) -> RunResult:
        started.append((device, options))
        return RunResult(s.name, target, json.loads((target / "run.json").read_text()), 0.1)

    def judge(out, request, claim):  # the replay itself is check/rerun/replay.py's: here only its rerun is started
        request.settings.run(request.scenario, tmp_path / "capture")
        return out

    monkeypatch.setattr(replay, "judge_outcome", judge)
    options = PrecisionOptions(ray_address=RAY, golden_dir=store.root, judgement="replay")
    session = PrecisionSession(options, rootdir=tmp_path, runner=runner)
    try:
        out = session.outcome(scenario, ItemKey(1, "actor_update"))
    finally:
        session.close()
    assert not out.passed, out.text
    (check_device, check), (rerun_device, rerun) = started  # the check's run, then the capture rerun
    assert _rollouts(check) == ["rollouts/step_1/batch.pt"]
    assert (rerun_device, rerun.ray_address, _rollouts(rerun)) == (check_device, RAY, _rollouts(check))


def test_calibrate_reruns_load_the_goldens_pinned_rollouts(
    verl_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario, store = verl_project
    started: list[RunOptions] = []

    def run_scenario(s: Scenario, *, out_dir: Path, device: str, options: RunOptions) -> RunResult:
        started.append(options)
        raise RunFailedError("stop after the first rerun started")

    monkeypatch.setattr(kind_runners, "load_scenario", Scenario.load)  # verl's own checks need verl
    monkeypatch.setattr(kind_runners, "run_scenario", run_scenario)
    monkeypatch.chdir(tmp_path)
    argv = ["calibrate", str(scenario.path), "--runs", "2", "--golden-dir", str(store.root), "--ray-address", RAY]
    assert cli.main(argv) != 0
    (options,) = started
    assert _rollouts(options) == ["rollouts/step_1/batch.pt"] and options.ray_address == RAY
