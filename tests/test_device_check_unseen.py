"""A passing device check says what of the stack it did not exercise (issue 40).

Check runs on a device load the golden's pinned rollouts, and ``rollout_generate``/``weight_sync``
are refused off the CPU: a vLLM or vllm-ascend upgrade passes unseen. The environment line must
say so rather than only "checked, the goldens held". Records are built directly (no run).
"""

from __future__ import annotations

from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.report.item_record import ItemRecord
from precision_harness.report.precision_report import PrecisionReport

GOLDEN_ENV = {"torch": "2.5.1", "torch_npu": "2.5.1", "vllm-ascend": "0.9.0", "device": "npu"}
RUN_ENV = {**GOLDEN_ENV, "vllm-ascend": "0.9.1"}


def _record(run: dict, *, passed: bool = True) -> ItemRecord:
    return ItemRecord(
        nodeid="scenarios/qwen.yaml::actor_update[step_1]",
        scenario="qwen",
        step=1,
        stage="actor_update",
        kind=OutcomeKind.COMPARED,
        passed=passed,
        text="actor_update @ step_1: within tolerance",
        run={"wall_s": 1.0, "timing": "", "timings": {}, "run_dir": "r", **run},
        environment_diff=EnvironmentDiff.between(GOLDEN_ENV, RUN_ENV).to_json(),
    )


def _environment_line(*records: ItemRecord) -> str:
    report = PrecisionReport(mode="check")
    report.records.extend(records)
    return next(line for line in report.lines if line.startswith("environment differs"))


def test_a_passing_device_check_with_pinned_rollouts_names_the_unseen_engine_upgrade() -> None:
    line = _environment_line(_record({"device": "npu", "rollouts_pinned": True}))
    assert "checked, the goldens held; not exercised: the rollout engine (rollouts pinned: " in line
    assert "vllm-ascend 0.9.0 -> 0.9.1 unseen" in line
    assert "rollout_generate and weight_sync (refused off the CPU)" in line


def test_a_device_check_without_pinning_still_names_the_stages_refused_off_the_cpu() -> None:
    line = _environment_line(_record({"device": "cuda", "rollouts_pinned": False}))
    assert line.endswith(
        "checked, the goldens held; not exercised: rollout_generate and weight_sync (refused off the CPU)"
    )


def test_a_cpu_check_that_ran_its_rollouts_claims_nothing_unseen() -> None:
    line = _environment_line(_record({"device": "cpu", "rollouts_pinned": False}))
    assert line.endswith("checked, the goldens held"), line


def test_a_failing_check_names_its_failures_not_what_it_did_not_see() -> None:
    line = _environment_line(_record({"device": "npu", "rollouts_pinned": True}, passed=False))
    assert line.endswith("1 failed item(s) name it") and "not exercised" not in line


def test_a_pinned_check_whose_engine_scored_the_responses_does_not_list_the_engine_as_unseen() -> None:
    """Issue 56: the rollout engine scored the pinned responses (``rollout_compute_log_prob``), so it was exercised;
    the same record without the scoring still lists it."""
    scored = _environment_line(_record({"device": "cpu", "rollouts_pinned": True, "engine_scored": True}))
    assert scored.endswith("checked, the goldens held"), scored
    unscored = _environment_line(_record({"device": "cpu", "rollouts_pinned": True, "engine_scored": False}))
    assert "not exercised: the rollout engine (rollouts pinned" in unscored


def test_a_pinned_check_whose_engine_sampled_gated_fresh_steps_does_not_list_the_engine_as_unseen() -> None:
    """``verl.fresh_steps``: the engine sampled the fresh steps and their rollout-training mismatch was gated."""
    sampled = _environment_line(_record({"device": "npu", "rollouts_pinned": True, "engine_sampled": True}))
    assert "the rollout engine" not in sampled and "not exercised: rollout_generate and weight_sync" in sampled
