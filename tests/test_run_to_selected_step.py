"""A check runs a scenario only as far as its selected items need: ``-k step_1`` (or a pasted rerun line of a
step-1 item) runs the tiny 2-step scenario to step 1, says so in the summary, and still gates those items
against the whole golden. Items that need the whole run (``metrics``), a later step, a test that takes the
``precision_run`` fixture, and a recording each run every step."""

from __future__ import annotations

from pathlib import Path

import pytest

from precision_harness.check.item_key import METRICS_ITEM, ItemKey
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session_plan import last_step_needed

NOTE = "tiny_ppo: run to step 1 of 2, as selected"


def _steps_run(root: Path) -> list[str]:
    run = root / ".precision" / "artifacts" / "tiny_ppo" / "run"
    return sorted(p.name for p in run.glob("step_*"))


def test_last_step_needed_is_the_selected_items_last_or_none_for_the_whole_run() -> None:
    assert last_step_needed([ItemKey(1, "actor_update"), ItemKey(1, "critic_update")]) == 1
    assert last_step_needed([ItemKey(1, "actor_update"), ItemKey(3, "weight_sync")]) == 3
    assert last_step_needed([ItemKey(1, "actor_update"), METRICS_ITEM]) is None
    assert last_step_needed([]) is None


def _scenario(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return Scenario.load(path)


def test_run_to_ends_builtin_and_verl_runs_but_not_a_command(tmp_path: Path) -> None:
    from harness_testing import TINY

    builtin = _scenario(tmp_path, TINY.read_text())
    assert builtin.run_to(1) == {"trainer.total_training_steps": 1, "global_profiler.steps": [1]}
    assert builtin.run_to(2) is None and builtin.run_to(None) is None  # the run ends there anyway
    command = _scenario(
        tmp_path,
        "command: [python, train.py]\nglobal_profiler:\n  steps: [1, 2]\n"
        "  global_tool_config:\n    precision_debugger: {stages: [actor_update]}\n",
    )
    assert command.run_to(1) is None  # the gate does not end a command's own process


VERL = """engine: verl
verl:
  overrides: {algorithm.adv_estimator: grpo%s}
global_profiler:
  steps: [1, 2, 3]
  global_tool_config:
    precision_debugger: {stages: [actor_update]}
"""


@pytest.mark.parametrize(
    "more",
    [
        ", actor_rollout_ref.actor.optim.lr_warmup_steps_ratio: 0.1",
        ", critic.optim.lr_scheduler_type: cosine",
        ", actor_rollout_ref.actor.optim: automodel",
    ],
)
def test_verl_runs_are_not_ended_early_where_the_lr_schedule_reads_the_total_steps(tmp_path: Path, more: str) -> None:
    """verl's lr warmup ratio and cosine decay are computed over trainer.total_training_steps, which the gate sets
    to the last profiled step: stopping such a run early, as a check of step 1's items or a rerun to step 1
    would, changes step 1's learning rate."""
    plain, scheduled = _scenario(tmp_path, VERL % ""), _scenario(tmp_path, VERL % more)
    assert plain.run_to(1) == {"global_profiler.steps": [1]}
    assert scheduled.run_to(1) is None
    entrypoint = VERL.replace("verl:\n", "verl:\n  entrypoint: [python, my_main_ppo.py]\n") % ""
    assert _scenario(tmp_path, entrypoint).run_to(1) is None  # its own config may schedule the rate
    # level auto's L1 rerun and the judgement's capture rerun of step 1 keep the check's total steps there
    assert plain.localize_overrides(1, "actor_update")["global_profiler.steps"] == [1]
    assert scheduled.localize_overrides(1, "actor_update")["global_profiler.steps"] == [1, 3]
    capture = scheduled.capture_overrides(2, "actor_update", ["Functional.linear.0.forward"])
    assert capture["global_profiler.steps"] == [2, 3]


def test_selecting_step_1_runs_to_step_1_and_gates_it(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-k", "step_1")
    result.assert_outcomes(passed=5)
    assert NOTE in result.stdout.str()
    assert _steps_run(project.path) == ["step_1"]


def test_a_drift_at_step_1_still_fails_when_run_to_step_1(project: pytest.Pytester) -> None:
    scenario = project.path / "scenarios" / "tiny_ppo.yaml"
    old = "critic:\n  ppo_mini_batch_size: 1\n  ppo_micro_batch_size_per_gpu: 2\n  optim:\n    lr: 1.0e-3"
    assert old in scenario.read_text()
    scenario.write_text(scenario.read_text().replace(old, old.replace("lr: 1.0e-3", "lr: 3.0e-3")))
    result = project.runpytest_subprocess("-k", "critic_update and step_1")
    result.assert_outcomes(failed=1)
    assert NOTE in result.stdout.str()


@pytest.mark.parametrize("selection", ["step_2", "metrics or step_1"])
def test_a_later_step_or_the_metrics_run_every_step(project: pytest.Pytester, selection: str) -> None:
    result = project.runpytest_subprocess("-k", selection)
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert "run to step" not in result.stdout.str()
    assert _steps_run(project.path) == ["step_1", "step_2"]


def test_a_test_taking_precision_run_gets_the_whole_run(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_uses_run="""
        def test_both_steps(precision_run):
            run = precision_run("tiny_ppo")
            assert (run.run_dir / "step_2").is_dir()
        """
    )
    result = project.runpytest_subprocess("-k", "step_1 or both_steps")
    result.assert_outcomes(passed=6)
    assert "run to step" not in result.stdout.str()
