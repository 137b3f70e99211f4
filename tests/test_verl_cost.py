"""benchmarks/verl_cost.py (issue 55, item 8): its plain run is the gate's verl command without the gate's
instrumentation and nothing else, its command line, and its ratios. No verl run: the benchmark itself measures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from precision_harness.runs import kind_runners
from precision_harness.runs.stage_api import ENV_MSPROBE_CONFIG, ENV_STAGES, ENV_STEPS
from precision_harness.runs.verl import engine as verl_engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import verl_cost  # noqa: E402

#: the specs are verl 0.9.1's (found, not imported: importing verl imports torch)
needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="the [verl] extra installs verl 0.9.1")

#: the overrides the gate adds for its profiler and debugger on a scenario without pinned rollouts
PROFILER_KEYS = {
    "global_profiler.tool",
    "global_profiler.steps",
    "global_profiler.save_path",
    "global_profiler.global_tool_config.precision_debugger.config_path",
    "global_profiler.global_tool_config.precision_debugger.stages",
    "global_profiler.global_tool_config.precision_debugger.strict",
    "actor_rollout_ref.actor.profiler.enable",
    "actor_rollout_ref.actor.profiler.all_ranks",
}


def _specs(tmp_path: Path, **config):
    from precision_harness.scenarios.scenario import Scenario

    scenario = Scenario.load(verl_cost.SCENARIO)
    scenario.config["verl"].update(config)
    gate = kind_runners.command_spec(scenario, tmp_path, device="cpu")
    return gate, verl_cost.plain_spec(gate)


def _keys(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if "=" in a]


@needs_verl
def test_the_plain_run_is_the_gates_command_without_its_profiler(tmp_path: Path) -> None:
    gate, plain = _specs(tmp_path)
    assert plain.argv[:3] == gate.argv[:3] and plain.argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert set(_keys(gate.argv)) - set(_keys(plain.argv)) == PROFILER_KEYS
    assert [a for a in gate.argv if a.split("=", 1)[0] not in PROFILER_KEYS] == plain.argv
    assert not any(k.startswith(("global_profiler.", "actor_rollout_ref.actor.profiler.")) for k in _keys(plain.argv))
    # the CPU support stays: verl does not run on a CPU without it
    assert f"actor_rollout_ref.rollout.name={verl_engine.CPU_PLATFORM}" in plain.argv
    assert plain.env["VERL_PLATFORM"] == verl_engine.CPU_PLATFORM


@needs_verl
def test_the_plain_run_loads_no_stage_window_and_no_msprobe_config(tmp_path: Path) -> None:
    gate, plain = _specs(tmp_path)
    assert gate.env[verl_engine.STAGE_OUTPUTS_ENV] == "1"  # the committed scenario gates at level: auto
    modules = plain.env["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert modules == [verl_engine.CPU_MODULE, verl_engine.FSDP2_BUFFERS_MODULE]
    gone = {ENV_MSPROBE_CONFIG, ENV_STEPS, ENV_STAGES, verl_engine.STAGE_OUTPUTS_ENV}
    assert not gone & set(plain.env)
    assert {k: v for k, v in gate.env.items() if k not in gone | {"VERL_USE_EXTERNAL_MODULES"}} == {
        k: v for k, v in plain.env.items() if k != "VERL_USE_EXTERNAL_MODULES"
    }


@needs_verl
def test_pinned_rollouts_are_sampled_in_the_plain_run(tmp_path: Path) -> None:
    gate, plain = _specs(tmp_path, pin_rollouts=True)
    assert "skip.rollout_tq.enable" in _keys(gate.argv)
    assert not any(k.startswith("skip.rollout_tq.") for k in _keys(plain.argv))


def test_the_command_line() -> None:
    args = verl_cost.parse_args([])
    assert (args.scenario, args.device, args.repeat, args.warm_up, args.json) == (verl_cost.SCENARIO, "cpu", 3, 1, None)
    assert verl_cost.parse_args(["--repeat", "1", "--warm-up", "0", "--device", "npu"]).device == "npu"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--repeat", "0"], "expected a positive integer, got 0"),
        (["--warm-up", "-1"], "expected 0 or more, got -1"),
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["--scenario", "missing.yaml"], "--scenario missing.yaml: no such file"),
        (["--scenario", str(ROOT / "scenarios" / "grpo_tiny.yaml")], "expected an engine: verl scenario"),
    ],
)
def test_bad_arguments_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        verl_cost.parse_args(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def _run(wall: float, cpu: float) -> verl_cost.Measured:
    return verl_cost.Measured(wall_s=wall, cpu_s=cpu, profile={})


def test_the_ratios_are_gate_over_plain_with_their_median_against_the_target() -> None:
    pairs = [(_run(130, 200), _run(100, 100)), (_run(150, 300), _run(100, 100)), (_run(120, 150), _run(100, 100))]
    figures = verl_cost.summary(pairs)
    assert figures["wall_ratio"] == [1.3, 1.5, 1.2] and figures["median_wall_ratio"] == 1.3
    assert figures["median_cpu_ratio"] == 2.0 and figures["met"] is True
    assert verl_cost.summary(pairs[1:2])["met"] is False


def test_the_gates_breakdown_splits_its_wall_into_the_run_the_compare_and_pytest() -> None:
    profile = {
        "start_up": [{"name": "driver import", "s": 5.0}, {"name": "config and Ray start", "s": 3.0}],
        "steps_s": 12.0,
        "steps": {"1": {"dumped_stages_s": 2.0, "dump_s": 0.5}, "2": {"dumped_stages_s": 1.0, "dump_s": 0.25}},
        "shut_down_s": 4.0,
        "wall_s": 24.0,
    }
    gate = verl_cost.Measured(40.0, 0.0, profile, {"verl_command_s": 24.0, "compare_s": 6.0})
    rows = verl_cost.breakdown(gate)
    assert rows["verl start-up"] == 8.0 and rows["  of them dumped stages (rank 0)"] == 3.0
    assert rows["  of them msprobe (rank 0)"] == 0.75 and rows["compare"] == 6.0
    assert rows["the rest of pytest"] == 10.0 and rows["wall"] == 40.0
    assert "compare" not in verl_cost.breakdown(verl_cost.Measured(24.0, 0.0, profile))


@pytest.mark.parametrize(
    ("cmdline", "name", "expected"),
    [
        (["ray::TaskRunnerV1.run"], "ray::TaskRunner", "ray::TaskRunnerV1"),
        (["ray::precision_cpu_server_0:PolicyServer.__init__"], "ray::precision_c", "ray::PolicyServer"),
        (["/venv/bin/python", "-m", "verl.trainer.main_ppo", "trainer.nnodes=1"], "python", "verl.trainer.main_ppo"),
        (["/site-packages/ray/core/src/ray/raylet/raylet", "--node_ip_address=127.0.0.1"], "raylet", "raylet"),
        ([], "gcs_server", "gcs_server"),
    ],
)
def test_each_process_is_counted_under_its_role(cmdline: list[str], name: str, expected: str) -> None:
    assert verl_cost.role(cmdline, name) == expected
