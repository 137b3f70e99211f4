"""``verl.fresh_steps`` (issue 56, item 2): steps after the pinned ones, sampled by the rollout engine, gated by the
mismatch of their rollouts with training against the bounds the recording and ``calibrate`` observed.

The end-to-end tests run a stand-in for verl's trainer (as tests/test_verl_engine.py does: seconds, not minutes). It
reads the gate's overrides, caches and loads the rollouts of ``skip.rollout_tq.steps`` only (as verl 0.9.1's
``SkipManager`` does), samples every other step from the system's entropy, and logs there the mismatch metrics verl's
``calculate_debug_metrics`` logs: ``1e-5 x step`` scaled by ``FAKE_ENGINE_DRIFT`` (an engine whose log-probs moved away
from training's) and by ``1 + (threads - 1) / 10`` (what calibration's thread-count variation then measures). verl's
real trainer runs the same scenario key in tests/test_rollout_engine_gate.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testing import base_data

from precision_harness.check.environment import EnvironmentDiff, rollout_engine_line
from precision_harness.check.tolerance.fresh_bounds import FLOOR, FreshBound, check_step
from precision_harness.errors import ScenarioError
from precision_harness.scenarios import fresh_steps
from precision_harness.scenarios.scenario import Scenario

FAKE_VERL = textwrap.dedent(
    """
    import json, os, random, sys
    from pathlib import Path
    import yaml

    args = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    total = args["trainer.total_training_steps"]
    with open("passes.jsonl", "a") as passes:
        passes.write(json.dumps(total) + "\\n")
    pd = "global_profiler.global_tool_config.precision_debugger."
    data = json.loads(Path(__file__).with_name("dump_data.json").read_text())
    level = json.loads(Path(args[pd + "config_path"]).read_text())["level"]
    pinned = set(args.get("skip.rollout_tq.steps") or []) if args.get("skip.rollout_tq.enable") else set()
    cache = Path(args.get("skip.rollout_tq.dump_dir") or ".")
    drift = float(os.environ.get("FAKE_ENGINE_DRIFT", "1")) * (1 + (int(os.environ["OMP_NUM_THREADS"]) - 1) / 10)
    logger = open(os.environ["VERL_FILE_LOGGER_PATH"], "w")
    for step in range(1, total + 1):
        row = {}
        cached = cache / str(step) / "batch.json"
        if step in pinned and cached.is_file():
            reward = json.loads(cached.read_text())["reward"]
        else:
            reward = random.SystemRandom().random()
            if step in pinned:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps({"reward": reward}))
            else:
                row["training/rollout_probs_diff_max"] = 1e-5 * step * drift
                row["training/rollout_probs_diff_mean"] = 2e-6 * drift
        if step in args["global_profiler.steps"]:
            for stage in args[pd + "stages"]:
                out = Path(args["global_profiler.save_path"]) / f"step_{step}" / stage / "step0" / "rank0"
                out.mkdir(parents=True, exist_ok=True)
                dump = json.loads(json.dumps(data))
                dump["Functional.linear.0.forward"]["output"][0]["Norm"] *= 1 + reward
                out.joinpath("dump.json").write_text(json.dumps({"task": "statistics", "level": level, "data": dump}))
        row["critic/score/mean"] = reward
        logger.write(json.dumps({"step": step, "data": row}) + "\\n")
    """
)

SCENARIO = """\
engine: verl
inputs: [fake_verl.py]
verl:
  entrypoint: [{python}, fake_verl.py]
  pin_rollouts: {pin}
  fresh_steps: 1
  overrides:
    algorithm.adv_estimator: grpo
global_profiler:
  steps: [1, 2]
  global_tool_config:
    precision_debugger:
      stages: [actor_compute_log_prob, actor_update]
      strict: true
"""

FRESH_ITEM = "fresh_rollout_mismatch[step_3]"


def _project(root: Path, *, pin: str = "true") -> Path:
    scenarios = root / "scenarios"
    scenarios.mkdir(exist_ok=True)
    (scenarios / "fake_verl.py").write_text(FAKE_VERL)
    (scenarios / "dump_data.json").write_text(json.dumps(base_data()))
    (scenarios / "grpo.yaml").write_text(SCENARIO.format(python=json.dumps(sys.executable), pin=pin))
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return scenarios


def _outcomes(result: pytest.RunResult) -> dict[str, str]:
    return dict(re.findall(r"::(\S+) (PASSED|FAILED|ERROR)", result.stdout.str()))


def _failure(result: pytest.RunResult, item: str) -> list[str]:
    """The lines of ``item``'s failure section."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("_") and item in line) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(("_", "="))), len(lines))
    return lines[start:end]


def _verdict(root: Path, item: str = FRESH_ITEM) -> str:
    """``item``'s verdict text, from the report a run with ``--precision-report rep`` wrote."""
    document = json.loads((root / "rep" / "report.json").read_text())
    return next(i["text"] for i in document["items"] if i["nodeid"].endswith(f"::{item}"))


def _passes(scenarios: Path) -> list[int]:
    """The ``trainer.total_training_steps`` of each process the stand-in ran, in order."""
    path = scenarios / "passes.jsonl"
    passes = [json.loads(line) for line in path.read_text().splitlines()]
    path.unlink()
    return passes


ITEMS = [*(f"{s}[step_{n}]" for n in (1, 2) for s in ("actor_compute_log_prob", "actor_update")), FRESH_ITEM, "metrics"]


@pytest.fixture(scope="module")
def recorded_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose golden was recorded with the fresh step, once for the module."""
    root = tmp_path_factory.mktemp("fresh")
    scenarios = _project(root)
    record = subprocess.run(
        [sys.executable, "-m", "pytest", "--precision-golden", "update", "-v"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    outcomes = dict(re.findall(r"::(\S+) (PASSED|FAILED|ERROR)", record.stdout))
    assert outcomes == dict.fromkeys(ITEMS, "PASSED"), record.stdout[-3000:]
    # pass 1 saves the pinned steps' rollouts and ends with them; pass 2, the golden's run, samples step 3 afresh
    assert _passes(scenarios) == [2, 3]
    shutil.rmtree(root / ".precision")
    return root


@pytest.fixture
def recorded(recorded_once: Path, pytester: pytest.Pytester) -> Path:
    """This test's copy of :func:`recorded_once`, in pytester's folder."""
    shutil.copytree(recorded_once, pytester.path, dirs_exist_ok=True)
    return pytester.path


def test_the_recording_keeps_the_fresh_steps_mismatch_in_the_manifest_and_not_in_the_compared_metrics(
    recorded: Path,
) -> None:
    from precision_harness.goldens.golden import Golden

    golden = Golden.from_dir(recorded / "golden" / "grpo" / "cpu")
    assert golden.manifest["fresh_rollouts"] == {
        "3": {"training/rollout_probs_diff_max": pytest.approx(3e-5), "training/rollout_probs_diff_mean": 2e-6}
    }
    # the fresh step's reward was sampled afresh: it is in no golden row, and no check compares it
    assert [row["training/global_step"] for row in golden.metrics()] == [1, 2]
    assert sorted(n for n in golden.contents if n.startswith("rollouts/")) == [
        "rollouts/1/batch.json",
        "rollouts/2/batch.json",
    ]


def test_an_unchanged_engine_passes_and_a_drifted_one_fails_the_fresh_item_alone_naming_the_engine(
    recorded: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenarios = recorded / "scenarios"
    same = pytester.runpytest_subprocess("-v", "--precision-report", "rep")
    assert set(_outcomes(same).values()) == {"PASSED"} and len(_outcomes(same)) == 6, same.stdout.str()[-3000:]
    assert _verdict(recorded) == (
        "fresh_rollout_mismatch @ step_3: training/rollout_probs_diff_max 3e-05 <= 3.15e-05, "
        "training/rollout_probs_diff_mean 2e-06 <= 2.1e-06; bounds from the recording run alone "
        "(precision-harness calibrate measures the spread between reruns)"
    )
    assert _passes(scenarios) == [3]

    # the engine's log-probs a hundredfold further from training's, and the golden recorded under a vLLM this
    # machine does not have: the verdict names that change first
    monkeypatch.setenv("FAKE_ENGINE_DRIFT", "100")
    path = recorded / "golden" / "grpo" / "cpu" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "env": {**manifest["env"], "vllm": "0.10.1"}}))
    drifted = pytester.runpytest_subprocess("-v")
    outcomes = _outcomes(drifted)
    assert outcomes.pop(FRESH_ITEM) == "FAILED", drifted.stdout.str()[-3000:]
    assert set(outcomes.values()) == {"PASSED"}  # the pinned steps and their metrics: training did not move
    first, verdict = _failure(drifted, FRESH_ITEM)[:2]
    assert first == "rollout engine precision_cpu: vllm 0.10.1 -> not recorded since the golden"
    assert verdict.startswith(
        "fresh_rollout_mismatch @ step_3: training/rollout_probs_diff_max 0.003 > 3.15e-05 (recorded 3e-05), "
        "training/rollout_probs_diff_mean 0.0002 > 2.1e-06 (recorded 2e-06); bounds from the recording run alone"
    ), verdict

    monkeypatch.setenv("FAKE_ENGINE_DRIFT", "0.5")  # closer agreement: not a regression
    better = pytester.runpytest_subprocess("-v", "-k", "fresh_rollout_mismatch", "--precision-report", "rep")
    assert _outcomes(better) == {FRESH_ITEM: "PASSED"}, better.stdout.str()[-3000:]
    assert "training/rollout_probs_diff_max 1.5e-05 <= 3.15e-05 (below every observation: closer" in _verdict(recorded)


def test_calibration_reruns_widen_the_bounds_by_their_spread(
    recorded: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in's mismatch grows 10 % per thread: reruns at 1 and 2 threads log 3e-5 and 3.3e-5, so the bound
    becomes 3.3e-5 + 3 x 3e-6 = 4.2e-5, and a mismatch of 3.9e-5 that failed the recording's bound alone passes."""
    from precision_harness.cli import main

    monkeypatch.setenv("FAKE_ENGINE_DRIFT", "1.3")
    before = pytester.runpytest_subprocess("-v", "-k", "fresh_rollout_mismatch")
    assert _outcomes(before) == {FRESH_ITEM: "FAILED"}, before.stdout.str()[-3000:]
    monkeypatch.delenv("FAKE_ENGINE_DRIFT")
    monkeypatch.chdir(recorded)
    assert main(["calibrate", "scenarios/grpo.yaml", "--runs", "2"]) == 0
    manifest = json.loads((recorded / "golden" / "grpo" / "cpu" / "manifest.json").read_text())
    assert manifest["noise"]["fresh_rollouts"] == {
        "3": {
            "training/rollout_probs_diff_max": [pytest.approx(3e-5), pytest.approx(3.3e-5)],
            "training/rollout_probs_diff_mean": [pytest.approx(2e-6), pytest.approx(2.2e-6)],
        }
    }
    monkeypatch.setenv("FAKE_ENGINE_DRIFT", "1.3")
    after = pytester.runpytest_subprocess("-v", "-k", "fresh_rollout_mismatch", "--precision-report", "rep")
    assert _outcomes(after) == {FRESH_ITEM: "PASSED"}, after.stdout.str()[-3000:]
    verdict = _verdict(recorded)
    assert verdict.startswith("fresh_rollout_mismatch @ step_3: training/rollout_probs_diff_max 3.9e-05 <= 4.2e-05")
    assert verdict.endswith("; bounds from the recording run and 2 calibration reruns")


def test_a_selection_that_ends_at_a_pinned_step_runs_no_fresh_step_and_one_of_the_fresh_item_runs_them(
    tmp_path: Path,
) -> None:
    """verl's own trainer (no ``entrypoint``, so the gate may end its runs early): a check of the pinned steps alone
    runs no fresh step; one that selects the fresh item runs the whole scenario."""
    path = _project(tmp_path) / "grpo.yaml"
    path.write_text(re.sub(r"  entrypoint: .*\n", "", path.read_text()))
    scenario = Scenario.load(path)
    assert scenario.run_to(3) is None
    for last in (1, 2):
        cut = scenario.run_to(last)
        assert cut == {"verl.fresh_steps": 0, "global_profiler.steps": list(range(1, last + 1))}
        variant = scenario.with_overrides(cut, directory=tmp_path / "variants", name=scenario.name)
        assert (variant.fresh_steps, variant.total_steps) == ((), last)


def test_fresh_steps_without_pinned_rollouts_is_one_line(tmp_path: Path) -> None:
    scenarios = _project(tmp_path, pin="false")
    with pytest.raises(ScenarioError) as err:
        Scenario.load(scenarios / "grpo.yaml")
    assert str(err.value) == (
        f"{scenarios / 'grpo.yaml'}: verl.fresh_steps: fresh steps follow the pinned ones, and verl.pin_rollouts is "
        "false (every step samples and is compared with the golden); set verl.pin_rollouts: true or remove "
        "verl.fresh_steps"
    )


def test_off_the_cpu_fresh_steps_need_verls_rollout_log_probs_in_one_line(tmp_path: Path) -> None:
    """On the CPU the gate's server returns its log-probs; elsewhere verl's ``calculate_log_probs`` decides."""
    path = tmp_path / "s.yaml"
    with pytest.raises(ScenarioError) as err:
        fresh_steps.check_log_probs(path, {"actor_rollout_ref.rollout.name": "vllm"})
    assert str(err.value) == (
        f"{path}: verl.fresh_steps: a fresh step is gated on the rollout-training mismatch verl logs from the "
        "rollout's log-probs, which it returns only with actor_rollout_ref.rollout.calculate_log_probs: true; set it "
        "in verl.overrides"
    )
    fresh_steps.check_log_probs(path, {"actor_rollout_ref.rollout.calculate_log_probs": True})


def test_the_run_gets_the_fresh_steps_and_the_pinned_ones_stay_pinned(tmp_path: Path) -> None:
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    from precision_harness.runs import kind_runners

    scenario = Scenario.load(_project(tmp_path) / "grpo.yaml")
    assert (scenario.steps, scenario.fresh_steps, scenario.total_steps) == ((1, 2), (3,), 3)
    (tmp_path / "run").mkdir()
    spec = kind_runners.command_spec(scenario, tmp_path / "run", device="cpu")
    assert "trainer.total_training_steps=3" in spec.argv and "skip.rollout_tq.steps=[1,2]" in spec.argv
    assert spec.generate_argv is not None and "trainer.total_training_steps=2" in spec.generate_argv
    assert spec.fresh_steps == (3,)
    assert (
        "precision gate: fresh steps 3 (verl.fresh_steps): verl samples them, outside skip.rollout_tq.steps; a "
        "recording's pass 1 ends at step 2"
    ) in spec.header


@pytest.mark.parametrize(
    ("observed", "high"),
    [
        ((2.0,), 2.0 * (1 + FLOOR)),  # the recording alone: the floor
        ((2.0, 2.0, 2.0), 2.0 * (1 + FLOOR)),  # bitwise reruns (the CPU): still the floor
        ((2.0, 1.5, 2.5), 2.5 + 3 * 1.0),  # a spread: k x (hi - lo) above the largest
        ((-0.002, -0.001), -0.001 + 3 * 0.001),  # chi-squared estimates go below 0: the same rule
    ],
    ids=["recording", "bitwise", "spread", "negative"],
)
def test_a_bound_is_the_largest_observation_plus_k_spreads_or_the_floor(observed: tuple, high: float) -> None:
    bound = FreshBound("m", observed, k=3.0)
    assert bound.high == pytest.approx(high)
    assert bound.holds(high) and not bound.holds(high * 1.0001 if high > 0 else high + 1e-9)


def test_a_step_without_bounds_or_without_a_logged_row_or_metric_fails() -> None:
    golden = {"3": {"training/rollout_probs_diff_max": 1e-5}}
    assert check_step(4, {}, golden, None).text == (
        "fresh_rollout_mismatch @ step_4: the golden holds no mismatch bounds for step 4; re-record it"
    )
    assert not check_step(3, None, golden, None).passed
    missing = check_step(3, {"training/rollout_probs_diff_mean": 0.0}, golden, None)
    assert not missing.passed and "logged no finite training/rollout_probs_diff_max" in missing.text
    assert check_step(3, {"training/rollout_probs_diff_max": 1e-5}, golden, None).passed


def test_only_finite_mismatch_metrics_are_read() -> None:
    row = {
        "training/rollout_probs_diff_max": 1e-5,
        "training/rollout_probs_diff_mean": float("nan"),
        "rollout_corr/kl": -1e-4,  # signed: not a mismatch a bound above can judge
        "training/rollout_probs_diff_valid": True,
    }
    assert fresh_steps.mismatch_values(row) == {"training/rollout_probs_diff_max": 1e-5}


@pytest.mark.parametrize(
    ("golden", "run", "line"),
    [
        ({"vllm": "0.10.1"}, {"vllm": "0.11.0"}, "rollout engine vllm: vllm 0.10.1 -> 0.11.0 since the golden"),
        ({"vllm": "0.11.0"}, {"vllm": "0.11.0"}, "rollout engine vllm: vllm 0.11.0, unchanged since the golden"),
        ({}, {}, "rollout engine vllm: no version of vllm, vllm-ascend, sglang in the run's stack"),
        (
            {"vllm": "0.11.0", "vllm-ascend": "0.11.0rc1"},
            {"vllm": "0.11.0", "vllm-ascend": "0.11.0rc3"},
            "rollout engine vllm: vllm-ascend 0.11.0rc1 -> 0.11.0rc3 since the golden",
        ),
    ],
    ids=["upgrade", "unchanged", "none", "plugin"],
)
def test_the_engine_line_leads_with_its_version_change(golden: dict, run: dict, line: str) -> None:
    assert rollout_engine_line(EnvironmentDiff.between(golden, run), run, "vllm") == line
