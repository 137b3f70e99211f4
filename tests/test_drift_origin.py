"""Where a drifted stage's change entered (check/localize/drift_origin.py), and how the verdict orders what explains it.

Synthetic dumps in msprobe's layout (harness_testing.base_data: embedding -> linear -> softmax); each
test moves one value and reads the classification the verdict leads with.
"""

from __future__ import annotations

from pathlib import Path

from harness_testing import api, tensor, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.environment import Change, EnvironmentDiff
from precision_harness.check.localize.drift_origin import DriftOrigin, OriginKind, classify
from precision_harness.check.localize.msprobe_tools import MsprobeAnswer
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.verdict_text import Reading, stage_text, with_judgement
from precision_harness.dumps.stage import DirStage

SETTINGS = CheckSettings(scenario="s", policy=TolerancePolicy())


def _origin(dumps, tmp_path: Path, mutate) -> DriftOrigin | None:
    target, golden = dumps(tmp_path, mutate)
    verdict = compare_stage(DirStage(target), DirStage(golden), SETTINGS)
    assert not verdict.passed
    return classify(verdict, DirStage(target))


def test_an_api_whose_inputs_match_computes_differently(dumps, tmp_path: Path) -> None:
    origin = _origin(dumps, tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.5))
    assert origin is not None and origin.kind is OriginKind.API
    assert origin.api == "Functional.linear.0.forward" and origin.row == "Functional.linear.0.forward.output.0"
    assert origin.summary.startswith("this API computes differently now: Functional.linear.0.forward gives")


def test_an_api_origin_says_equal_statistics_never_matching_inputs(dumps, tmp_path: Path) -> None:
    """Issue 36: "inputs that match" read as bit-identical; the golden keeps statistics, so the line says that much,
    and "within tolerance of the golden's (max rel X)" where an input row differs (a pairing that let it through)."""
    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.5))
    verdict = compare_stage(DirStage(target), DirStage(golden), SETTINGS)
    origin = classify(verdict, DirStage(target), DirStage(golden))
    assert origin is not None and origin.inputs_rel == 0.0
    assert origin.summary == (
        "this API computes differently now: Functional.linear.0.forward gives other outputs from inputs whose "
        "statistics equal the golden's"
    )
    assert "match" not in origin.summary
    near = DriftOrigin(OriginKind.API, origin.row, origin.api, "rank0", "s", origin.row, inputs_rel=1.2e-5)
    assert near.summary.endswith("from inputs within tolerance of the golden's (max rel 1.2e-05)")


def test_data_no_api_of_the_stage_computed_is_upstream(dumps, tmp_path: Path) -> None:
    """The linear's activation input moves while the embedding that fed it in the golden did not: it came from
    outside the recorded stage (it needs no gradient: data)."""
    origin = _origin(dumps, tmp_path, lambda d: d["Functional.linear.0.forward"]["input_args"][0].update(Max=1.5))
    assert origin is not None and origin.kind is OriginKind.UPSTREAM
    assert origin.summary.startswith(
        "the change is upstream of actor_update: its input Functional.linear.0.forward.input.0 is the first value"
    )


def test_an_input_of_another_dtype_is_where_the_change_entered(dumps, tmp_path: Path) -> None:
    """The linear's data input arrives as int64 with the golden's statistics (a mask where the golden had weights
    of 1.0): the API did not compute differently, its input changed; msprobe's statistics alone cannot tell."""

    def as_int(d):  # an int64 mask carries Max/Min only (msprobe records no Mean/Norm of an integer tensor)
        d["Functional.linear.0.forward"]["input_args"][0].update(
            dtype="torch.int64", Max=1, Min=1, Mean=None, Norm=None
        )
        d["Functional.linear.0.forward"]["output"][0].update(Max=3.5)

    origin = _origin(dumps, tmp_path, as_int)
    assert origin is not None and origin.kind is OriginKind.UPSTREAM
    assert origin.row == "Functional.linear.0.forward.input.0" and origin.structural
    assert origin.summary.endswith("; its dtype or shape differs from the golden's")


def test_a_python_value_passed_to_an_api_is_upstream(dumps, tmp_path: Path) -> None:
    def lr(d):
        d["Tensor.add_.0.forward"] = api([tensor(), {"type": "float", "value": -0.11}], [tensor()])

    def golden(d):
        d["Tensor.add_.0.forward"] = api([tensor(), {"type": "float", "value": -0.1}], [tensor()])

    target, golden_dir = dumps(tmp_path, lr, golden)
    verdict = compare_stage(DirStage(target), DirStage(golden_dir), SETTINGS)
    origin = classify(verdict, DirStage(target))
    assert origin is not None and origin.kind is OriginKind.UPSTREAM and origin.row == "Tensor.add_.0.forward.input.1"


def test_a_weight_the_stage_starts_from_means_an_earlier_update(dumps, tmp_path: Path) -> None:
    def weight(d):
        d["Functional.linear.0.forward"]["input_args"][1].update(Norm=2.5, requires_grad=True)

    origin = _origin(dumps, tmp_path, weight)
    assert origin is not None and origin.kind is OriginKind.WEIGHTS
    assert origin.summary.startswith("an earlier update moved the weights: Functional.linear.0.forward.input.1")


def test_where_it_entered_below_tolerance_comes_before_the_first_divergence(dumps, tmp_path: Path) -> None:
    """The embedding's weight moves by 1e-9 (within tolerance); the softmax's output moves past it later."""

    def change(d):
        d["Functional.embedding.0.forward"]["input_args"][1].update(Norm=2.000000002, requires_grad=True)
        d["Functional.softmax.0.forward"]["output"][0].update(Max=0.95)

    origin = _origin(dumps, tmp_path, change)
    assert origin is not None and origin.kind is OriginKind.WEIGHTS
    assert origin.row == "Functional.embedding.0.forward.input.1"
    assert origin.first_divergence == "Functional.softmax.0.forward.output.0" and origin.below_tolerance
    assert origin.summary.endswith("; within tolerance there, it passes tolerance at the first divergence below")


def test_a_gradient_no_recorded_api_produced_is_unrecorded(dumps, tmp_path: Path) -> None:
    def backward(d, scale=1.0):
        d["Functional.linear.0.backward"] = {"input": [tensor(Max=scale)], "output": [tensor(), tensor()]}

    target, golden = dumps(tmp_path, lambda d: backward(d, 2.0), backward)
    verdict = compare_stage(DirStage(target), DirStage(golden), SETTINGS)
    origin = classify(verdict, DirStage(target))
    assert origin is not None and origin.kind is OriginKind.UNRECORDED
    assert origin.row == "Functional.linear.0.backward.input.0"


def test_level_auto_rows_stage_inputs_upstream_module_parameters_weights(tmp_path: Path) -> None:
    def stage_dump(root: Path, advantages: float, weight: float) -> DirStage:
        data = {
            "Stage.advantages.0.forward": {"input_args": [tensor(Max=advantages)], "input_kwargs": {}, "output": []},
            "Module.lm_head.Linear.forward.0": {
                "input_args": [tensor()],
                "input_kwargs": {},
                "output": [tensor()],
                "parameters": {"weight": tensor(Norm=weight)},
            },
        }
        write_dump(root / "step_1" / "actor_update", data)
        return DirStage(root / "step_1" / "actor_update")

    golden = stage_dump(tmp_path / "g", 1.0, 2.0)
    for name, (adv, weight), kind in (
        ("adv", (1.5, 2.0), OriginKind.UPSTREAM),
        ("weight", (1.0, 2.5), OriginKind.WEIGHTS),
    ):
        target = stage_dump(tmp_path / name, adv, weight)
        origin = classify(compare_stage(target, golden, SETTINGS), target)
        assert origin is not None and origin.kind is kind, name


def test_the_rank_that_changed_first_is_named(tmp_path: Path) -> None:
    from harness_testing import base_data

    for side, ranks in (("golden", {}), ("target", {"rank1": 1.5})):
        for rank in ("rank0", "rank1"):
            data = base_data()
            data["Functional.linear.0.forward"]["output"][0].update(Max=ranks.get(rank, 3.0))
            data["Functional.softmax.0.forward"]["output"][0].update(Max=0.95 if side == "target" else 0.9)
            write_dump(tmp_path / side / "step_1" / "actor_update", data, rank)
    target = DirStage(tmp_path / "target" / "step_1" / "actor_update")
    verdict = compare_stage(target, DirStage(tmp_path / "golden" / "step_1" / "actor_update"), SETTINGS)
    origin = classify(verdict, target)
    assert origin is not None and origin.rank == "rank1" and origin.kind is OriginKind.API


# --- the verdict's order: what explains the drift first ------------------------------------------------------

CPU = EnvironmentDiff((Change("CPU", "AMD EPYC", "Intel Xeon (amx_bf16)"),))


def _text(dumps, tmp_path: Path, mutate, **reading) -> list[str]:
    target, golden = dumps(tmp_path, mutate)
    verdict = compare_stage(DirStage(target), DirStage(golden), SETTINGS)
    origin = classify(verdict, DirStage(target))
    return stage_text(verdict, Reading(origin=origin, **reading)).splitlines()


def _upstream(d):
    d["Functional.linear.0.forward"]["input_args"][0].update(Max=1.5)


def test_upstream_drift_on_a_machine_whose_other_stages_held_names_the_environment_first(dumps, tmp_path) -> None:
    """The environment's line comes first in every failing verdict; where other stages held, it says it alone
    does not explain the drift, and where the change entered follows it."""
    lines = _text(dumps, tmp_path, _upstream, environment=CPU, identical_elsewhere=9)
    assert lines[1].startswith("  environment differs from the golden's: CPU AMD EPYC -> Intel Xeon (amx_bf16)")
    assert lines[1].endswith(
        "alone it does not explain this drift: 9 other stage dump(s) of this run are identical to their goldens on "
        "this machine"
    )
    assert lines[2].startswith("  change entered    the change is upstream of actor_update")
    assert sum("environment differs" in line for line in lines) == 1


def test_an_api_computing_differently_on_a_changed_machine_names_the_environment_first(dumps, tmp_path) -> None:
    lines = _text(
        dumps, tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.5), environment=CPU
    )
    assert lines[1] == "  environment differs from the golden's: CPU AMD EPYC -> Intel Xeon (amx_bf16)"
    assert lines[2].startswith("  change entered    this API computes differently now")


def test_a_changed_setting_explains_before_anything_else_but_the_environment(dumps, tmp_path) -> None:
    changed = ("actor_rollout_ref.actor.optim.lr: 0.001 -> 0.002",)
    lines = _text(dumps, tmp_path, _upstream, changed=changed)
    assert lines[1] == "  setting changed   actor_rollout_ref.actor.optim.lr: 0.001 -> 0.002"
    assert lines[2].startswith("  change entered ")
    lines = _text(dumps, tmp_path / "env", _upstream, changed=changed, environment=CPU)
    assert lines[1] == "  environment differs from the golden's: CPU AMD EPYC -> Intel Xeon (amx_bf16)"
    assert lines[2] == "  setting changed   actor_rollout_ref.actor.optim.lr: 0.001 -> 0.002"


def test_the_judgement_line_follows_the_classification(dumps, tmp_path) -> None:
    answer = MsprobeAnswer(first_diff={"rank0": "Functional.softmax.0.forward"})
    lines = _text(
        dumps, tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.5), msprobe=answer
    )
    text = with_judgement("\n".join(lines), "regression at API Functional.linear.0.forward: error = 9 x ...")
    out = text.splitlines()
    assert out[1].startswith("  change entered ")
    assert out[2] == "  judgement         regression at API Functional.linear.0.forward: error = 9 x ..."
    assert any(
        line.startswith("  msprobe 1st diff  Functional.softmax.0.forward: the first output past") for line in out
    )
    nested = with_judgement("head\n  change entered    a\n  localized at L1:\n    change entered    b", "j", last=True)
    assert nested.splitlines()[-1] == "    judgement         j"
