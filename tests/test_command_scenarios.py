"""Command scenarios: any process that writes verl's dump layout under $PRECISION_DUMP_DIR is gated.

Most tests drive a fake training command (a few lines of Python writing msprobe-shaped dump.json
files: no torch, fast). The end-to-end test runs ``examples/verl_profiler_loop/train.py``, a loop
instrumented with verl 0.9.1's own ``PrecisionDebuggerProfiler``, from a project folder that is not
this repository.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testing import base_data

from precision_harness.errors import ScenarioError
from precision_harness.scenarios.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]

#: a fake training command: writes every declared (step, stage) dump, steered by FAKE_* variables
FAKE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    data = json.loads(Path(__file__).with_name("dump_data.json").read_text())
    root = Path(os.environ["PRECISION_DUMP_DIR"])
    config = json.loads(Path(os.environ["PRECISION_MSPROBE_CONFIG"]).read_text())
    scale = float(os.environ.get("FAKE_SCALE", "1"))
    skip = os.environ.get("FAKE_SKIP", "")
    stages = os.environ["PRECISION_STAGES"].split(",") + [s for s in [os.environ.get("FAKE_EXTRA_STAGE")] if s]
    print("fake training run, level", config["level"], "ray", os.environ.get("RAY_ADDRESS"))
    for step in map(int, os.environ["PRECISION_STEPS"].split(",")):
        for stage in stages:
            if f"step_{step}/{stage}" == skip:
                continue
            out = root / f"step_{step}" / stage / "step0" / "rank0"
            out.mkdir(parents=True, exist_ok=True)
            dump = json.loads(json.dumps(data))
            if step == 2 and stage == "actor_update":
                dump["Functional.linear.0.forward"]["output"][0]["Norm"] *= scale
            doc = {"task": "statistics", "level": config["level"], "data": dump}
            out.joinpath("dump.json").write_text(json.dumps(doc))
            out.joinpath("construct.json").write_text("{}")
    with open(os.environ["PRECISION_METRICS"], "w") as fh:
        for step in (1, 2):
            row = {"step": step, "data": {"actor/pg_loss": 0.5 * step, "timing_s/gen": 1.0 * step}}
            fh.write(json.dumps(row) + "\\n")
    if os.environ.get("FAKE_EXIT"):
        print("Traceback (most recent call last):\\nRuntimeError: out of memory on device 0")
        sys.exit(int(os.environ["FAKE_EXIT"]))
    """
)

STAGES = "[actor_compute_log_prob, actor_update]"


def scenario_text(extra: str = "", stages: str = STAGES, command: str | None = None) -> str:
    command = command or f"[{json.dumps(sys.executable)}, fake_train.py]"
    return (
        f"command: {command}\n"
        "inputs: [dump_data.json]\n"
        "metrics: true\n"
        "global_profiler:\n"
        "  steps: [1, 2]\n"
        "  global_tool_config:\n"
        "    precision_debugger:\n"
        f"      stages: {stages}\n"
        "      strict: true\n" + extra
    )


@pytest.fixture
def command_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with one command scenario (the fake training run) beside its script."""
    scenarios = pytester.path / "scenarios"
    scenarios.mkdir()
    (scenarios / "fake_train.py").write_text(FAKE)
    (scenarios / "dump_data.json").write_text(json.dumps(base_data()))
    (scenarios / "fake.yaml").write_text(scenario_text())
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return pytester


def test_command_scenario_update_check_and_drift(command_project: pytest.Pytester, monkeypatch) -> None:
    rec = command_project.runpytest_subprocess("--precision-golden", "update")
    rec.assert_outcomes(passed=5)
    rec.stdout.fnmatch_lines(["golden recorded: golden/fake/cpu (* MB stored, +* MB)"])
    golden = command_project.path / "golden" / "fake" / "cpu"
    manifest = json.loads((golden / "manifest.json").read_text())
    # the golden names no path of the recording machine: the interpreter is "python"
    assert manifest["env"]["command"] == "python fake_train.py"
    assert "timing_s/gen" not in (golden / "manifest.json").read_text()
    check = command_project.runpytest_subprocess()
    check.assert_outcomes(passed=5)
    check.stdout.fnmatch_lines(["5 precision items: 4 identical to golden, 1 within tolerance or compared, 0 failed"])
    monkeypatch.setenv("FAKE_SCALE", "1.0001")
    drift = command_project.runpytest_subprocess("-rA")
    drift.assert_outcomes(passed=4, failed=1)
    drift.stdout.fnmatch_lines(
        [
            "*actor_update @ step_2, rank0: 1 of * statistics beyond tolerance*",
            "*first divergence  Functional.linear.0.forward.output.0  Norm 12.5 -> 12.50125*",
            "FAILED scenarios/fake.yaml::actor_update[[]step_2[]]*",
        ]
    )


def test_a_ray_address_that_does_not_answer_fails_each_item_in_one_line_and_the_command_never_runs(
    command_project: pytest.Pytester,
) -> None:
    """--precision-ray-address: the command would join that cluster (``RAY_ADDRESS``; tests/test_verl_cluster.py runs
    verl's trainer on one), so a cluster that does not answer is one line before the command starts, not a run
    that waits for it."""
    command_project.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=5)
    log = command_project.path / ".precision" / "artifacts" / "fake" / "run" / "worker.log"
    assert "ray None" in log.read_text()
    log.unlink()
    check = command_project.runpytest_subprocess("--precision-ray-address", "ray://head.invalid:10001")
    check.assert_outcomes(failed=5)
    check.stdout.fnmatch_lines(
        ["*--precision-ray-address ray://head.invalid:10001: the Ray cluster does not answer (*)*"]
    )
    assert not log.exists()


def test_changed_input_file_makes_the_golden_stale(command_project: pytest.Pytester) -> None:
    """The data the command reads is an input: another file is another experiment, and the verdict names it."""
    command_project.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=5)
    data = command_project.path / "scenarios" / "dump_data.json"
    old = hashlib.sha256(data.read_bytes()).hexdigest()[:8]
    data.write_text(json.dumps(base_data(), indent=1))
    new = hashlib.sha256(data.read_bytes()).hexdigest()[:8]
    result = command_project.runpytest_subprocess("-k", "step_1 and actor_update")
    result.assert_outcomes(failed=1, deselected=4)
    named = f"input dump_data.json changed (sha256 {old} -> {new})"
    result.stdout.fnmatch_lines([f"*golden is stale, recorded under scenario hash * (now *: {named}); re-record*"])


def test_declared_stage_not_dumped_fails_and_writes_no_golden(command_project: pytest.Pytester, monkeypatch) -> None:
    """verl's silent no-dump case: the item names the stage and step, and no golden is written from it."""
    monkeypatch.setenv("FAKE_SKIP", "step_2/actor_update")
    rec = command_project.runpytest_subprocess("--precision-golden", "update")
    rec.assert_outcomes(failed=5)
    rec.stdout.fnmatch_lines(["*fake.yaml: no golden written: the run dumped no step_2/actor_update (1 declared*"])
    assert not (command_project.path / "golden").exists()
    monkeypatch.delenv("FAKE_SKIP")
    command_project.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=5)
    monkeypatch.setenv("FAKE_SKIP", "step_2/actor_update")
    check = command_project.runpytest_subprocess("-k", "actor_update")
    check.assert_outcomes(passed=1, failed=1, deselected=3)
    check.stdout.fnmatch_lines(
        ["actor_update @ step_2, rank0: 1 structural difference(s) from the golden", "*no dump.json under *"]
    )


def test_undeclared_stage_is_listed_in_the_summary(command_project: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_EXTRA_STAGE", "critic_update")
    result = command_project.runpytest_subprocess("--precision-golden", "update")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "fake: dumped but not declared in precision_debugger.stages (not gated): "
            "step_1/critic_update, step_2/critic_update"
        ]
    )


def test_failing_command_is_one_line_with_its_log(command_project: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_EXIT", "3")
    result = command_project.runpytest_subprocess("-k", "actor_update and step_1", "--precision-golden", "update")
    result.assert_outcomes(failed=1, deselected=4)
    result.stdout.fnmatch_lines(
        [
            "*fake.yaml: command exited with 3; last lines: * | "
            "RuntimeError: out of memory on device 0 (log: *worker.log)"
        ]
    )


def test_command_not_found_and_timeout(command_project: pytest.Pytester) -> None:
    scenario = command_project.path / "scenarios" / "fake.yaml"
    scenario.write_text(scenario_text(command="[no-such-trainer-binary, --steps, '2']"))
    missing = command_project.runpytest_subprocess("-k", "metrics", "--precision-golden", "update")
    missing.stdout.fnmatch_lines(["*fake.yaml: command: 'no-such-trainer-binary' not found (run from *scenarios)"])
    scenario.write_text(scenario_text(command=f"[{json.dumps(sys.executable)}, -c, 'import time; time.sleep(30)']"))
    (command_project.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\nprecision_timeout = 2\n")
    slow = command_project.runpytest_subprocess("-k", "metrics", "--precision-golden", "update")
    slow.stdout.fnmatch_lines(
        ["*fake.yaml: command timed out after 2 s; no stage was reached; last lines: no output (log: *worker.log)"]
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("command: python train.py\nglobal_profiler: {steps: [1]}\n", "command: expected a list of strings (the argv"),
        (
            "command: [python, t.py]\nmodel: {hidden_size: 8}\nglobal_profiler: {steps: [1]}\n",
            "model: a built-in scenario key",
        ),
        ("command: [python, t.py]\n", "global_profiler.steps: a command scenario must list the steps"),
        (
            "command: [python, t.py]\ntrainer: {total_training_steps: 2}\nglobal_profiler: {steps: [1]}\n",
            "trainer.total_training_steps: a command scenario sets only",
        ),
        (
            "command: [python, t.py]\ninputs: [missing.py]\nglobal_profiler: {steps: [1]}\n",
            "inputs: 'missing.py' not found",
        ),
        (
            "command: [python, t.py]\ninputs: ['${oc.env:PRECISION_TEST_UNSET_DIR}/d.bin']\n"
            "global_profiler: {steps: [1]}\n",
            "inputs: '${oc.env:PRECISION_TEST_UNSET_DIR}/d.bin' reads ${oc.env:PRECISION_TEST_UNSET_DIR} but "
            "PRECISION_TEST_UNSET_DIR is not set",
        ),
        (
            "command: [python, t.py]\nglobal_profiler:\n  steps: [1]\n  global_tool_config:\n"
            "    precision_debugger: {stages: [train_batch], strict: true}\n",
            "unknown stage 'train_batch' (strict: true)",
        ),
    ],
)
def test_bad_command_scenario_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        Scenario.load(path)
    assert message in str(err.value) and str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_identity_of_a_command_scenario(tmp_path: Path) -> None:
    """argv, env, declared settings and inputs make it; numeric settings are compared by value, not hashed."""
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1 + 1"}\n')

    def load(extra: str) -> Scenario:
        path = tmp_path / "s.yaml"
        path.write_text("command: [python, t.py]\ninputs: [prompts.jsonl]\nglobal_profiler: {steps: [1, 2]}\n" + extra)
        return Scenario.load(path)

    base = load("settings: {actor_rollout_ref: {actor: {optim: {lr: 1.0e-6}}}, model: {path: qwen}}\n")
    assert base.kind == "command" and base.steps == (1, 2) and base.total_steps == 2 and not base.gates_metrics
    assert base.numeric_settings == {"actor_rollout_ref.actor.optim.lr": 1e-06}
    lr = load("settings: {actor_rollout_ref: {actor: {optim: {lr: 2.0e-6}}}, model: {path: qwen}}\n")
    assert lr.hash == base.hash and lr.numeric_settings != base.numeric_settings
    for other in (
        "settings: {actor_rollout_ref: {actor: {optim: {lr: 1.0e-6}}}, model: {path: llama}}\n",
        "settings: {actor_rollout_ref: {actor: {optim: {lr: 1.0e-6}}}, model: {path: qwen}}\nenv: {X: 1}\n",
    ):
        assert load(other).hash != base.hash
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "2 + 2"}\n')
    assert (
        load("settings: {actor_rollout_ref: {actor: {optim: {lr: 1.0e-6}}}, model: {path: qwen}}\n").hash != base.hash
    )


@pytest.mark.slow
def test_loop_with_verls_own_profiler_from_another_project(pytester: pytest.Pytester, monkeypatch) -> None:
    """examples/verl_profiler_loop: verl 0.9.1's PrecisionDebuggerProfiler under the gate: record, pass, drift.

    The numeric change is 1e-4 on step 2's advantages: only actor_update @ step_2 and the metrics move.
    """
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    shutil.copy(ROOT / "examples" / "verl_profiler_loop" / "train.py", pytester.path / "train.py")
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "loop.yaml").write_text(
        (ROOT / "examples" / "verl_profiler_loop" / "scenarios" / "verl_loop.yaml")
        .read_text()
        .replace("[python, ", f"[{json.dumps(sys.executable)}, ")
    )
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=7)
    check = pytester.runpytest_subprocess()
    check.assert_outcomes(passed=7)
    check.stdout.fnmatch_lines(["7 precision items: 6 identical to golden, 1 within tolerance or compared, 0 failed"])
    monkeypatch.setenv("EXAMPLE_ADVANTAGE_SCALE", "1.0001")
    drift = pytester.runpytest_subprocess("-rA")
    drift.assert_outcomes(passed=5, failed=2)
    drift.stdout.fnmatch_lines(
        [
            "*actor_update @ step_2, rank0: * statistics beyond tolerance (fp32: rtol 1.3e-06, atol rtol x RMS)",
            '*rerun             pytest scenarios/loop.yaml -k "actor_update and step_2"',
        ]
    )
    out = drift.stdout.str()
    assert "FAILED scenarios/loop.yaml::actor_update[step_2]" in out and "FAILED scenarios/loop.yaml::metrics" in out
    assert "PASSED scenarios/loop.yaml::actor_compute_log_prob[step_2]" in out


def test_recorded_command_names_no_machine_path(tmp_path: Path) -> None:
    from precision_harness.runs.command.run import shown_command
    from precision_harness.runs.verl import engine as verl_engine

    run = tmp_path / "artifacts" / "run"
    argv = [sys.executable, "-m", "verl.trainer.main_ppo", f"global_profiler.save_path={run}", f"x={run}/rollouts"]
    argv.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={verl_engine.CPU_AGENT_LOOP_FILE}")
    assert shown_command(argv, run) == (
        "python -m verl.trainer.main_ppo global_profiler.save_path=$RUN_DIR x=$RUN_DIR/rollouts "
        "actor_rollout_ref.rollout.agent.agent_loop_config_path=$PRECISION_HARNESS/runs/verl/cpu/agent_loops.yaml"
    )
