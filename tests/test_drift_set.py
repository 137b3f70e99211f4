"""A failing verdict keeps a rank's first and largest drifts as objects and counts every other one exactly
(check.drift_set): the headline, the first divergence, the largest drift and the per-API profile say what the
full list of drifts would have said."""

from __future__ import annotations

import copy

from harness_testing import tensor

from precision_harness.check.compare import drift_set
from precision_harness.check.compare import rank as compare
from precision_harness.check.compare.drift_set import KEPT, Drift, api_kind, kept
from precision_harness.check.compare.stage_verdict import RankVerdict, StageVerdict
from precision_harness.check.tolerance.policy import Tol, TolerancePolicy
from precision_harness.check.verdicts import verdict_text
from precision_harness.check.verdicts.items import Outcome, OutcomeKind
from precision_harness.report.item_record import ItemRecord
from precision_harness.report.precision_report import PrecisionReport
from precision_harness.schemas import validate

CALLS = 3 * KEPT  # more drifting rows than a rank keeps from either end


def dumps(bumps: list[float]) -> tuple[dict, dict]:
    """``(run, golden)`` data: one ``Functional.linear.<i>.forward`` per bump, its output's Max moved by it."""
    golden = {f"Functional.linear.{i}.forward": {"output": [tensor(Max=1.0)]} for i in range(len(bumps))}
    run = copy.deepcopy(golden)
    for i, bump in enumerate(bumps):
        run[f"Functional.linear.{i}.forward"]["output"][0]["Max"] = 1.0 + bump
    return {"data": run}, {"data": golden}


def every_drift(bumps: list[float]) -> list[Drift]:
    """The drifts of :func:`dumps` built one by one, as the compare did before it kept a bounded set."""
    run, golden = dumps(bumps)
    v = RankVerdict("rank0")
    for order, name in enumerate(run["data"]):
        row = compare._Row(f"{name}.output.0", order, run["data"][name]["output"][0], golden["data"][name]["output"][0])
        compare._compare_row(v, row, policy=TolerancePolicy(), stage="actor_update")
    return v.drifts


def drift(order: int, ratio: float, stat: str = "Max") -> Drift:
    return Drift(f"Functional.linear.{order}.forward.output.0", stat, 1.0, 2.0, ratio, 1.0, Tol(0, 1), order)


def test_kept_is_the_first_and_the_largest_in_call_order() -> None:
    ratios = [float(10 + (i * 37) % CALLS) for i in range(CALLS)]
    drifts = [drift(i, r) for i, r in enumerate(ratios)]
    chosen = kept(drifts)
    largest = sorted(range(CALLS), key=lambda i: -ratios[i])[:KEPT]
    assert [d.order for d in chosen] == sorted(set(range(KEPT)) | set(largest))
    assert len(chosen) < len(drifts)


def test_kept_breaks_a_tie_of_ratios_by_call_order_then_statistic() -> None:
    drifts = [drift(i, 5.0, stat) for i in range(CALLS) for stat in ("Max", "Min")]
    chosen = kept(drifts)
    assert chosen == drifts[:KEPT]  # the largest are the earliest: nothing past the first KEPT
    assert max(chosen, key=lambda d: (d.ratio, -d.order)) is drifts[0]


def test_a_rank_keeps_its_bounded_set_and_counts_every_drift() -> None:
    bumps = [1e-3 * (1 + (i * 7) % CALLS) for i in range(CALLS)]  # every row beyond tolerance
    run, golden = dumps(bumps)
    v = compare.compare_rank(run, golden, policy=TolerancePolicy(), stage="actor_update", rank="rank0")
    full = every_drift(bumps)
    assert len(full) == CALLS
    assert v.drifts == kept(full)
    assert len(v.drifts) + v.drift_set.dropped == CALLS
    assert v.drift_set.by_api == {("Functional.linear.forward.output", "Max"): [CALLS, max(d.ratio for d in full)]}


def two_ranks(bumps: list[float]) -> StageVerdict:
    run, golden = dumps(bumps)
    stage = StageVerdict("s", 1, "actor_update", ranks=["rank0", "rank1"])
    for rank in ("rank0", "rank1"):
        stage.add(compare.compare_rank(run, golden, policy=TolerancePolicy(), stage="actor_update", rank=rank))
    return stage


def test_a_stage_verdict_says_the_exact_count_first_and_largest() -> None:
    bumps = [1e-3 * (1 + (i * 7) % CALLS) for i in range(CALLS)]
    stage, full = two_ranks(bumps), every_drift(bumps)
    assert stage.beyond == 2 * CALLS
    assert stage.drift_set.by_api[("Functional.linear.forward.output", "Max")][0] == 2 * CALLS
    assert stage.first_divergence == full[0]
    assert stage.largest == max(full, key=lambda d: (d.ratio, -d.order))
    text = verdict_text.stage_text(stage, verdict_text.Reading())
    assert f": {2 * CALLS} of " in text.splitlines()[0]


def test_api_kind_drops_call_indices_only() -> None:
    assert api_kind("Functional.linear.7.forward.output.0") == "Functional.linear.forward.output"
    assert api_kind("Module.model.layers.12.mlp.Linear.forward.0.input.0") == (
        "Module.model.layers.mlp.Linear.forward.input"
    )
    assert drift_set.api_kind("Tensor.__add__.3.backward.input.1") == "Tensor.__add__.backward.input"


def test_api_kinds_of_many_rows_at_once_are_each_rows_api_kind() -> None:
    names = [
        "Functional.linear.7.forward.output.0",
        "Module.model.layers.12.mlp.Linear.forward.0.input.0",
        "Tensor.__add__.3.backward.input.1",
        "Functional.linear.7.forward.output.10",
        "Module.layers.1",
        "noindex",
        "",
        "Functional.odd.1\n2.forward.output.0",  # a newline in a name: read one by one
    ]
    assert drift_set.api_kinds(names) == [api_kind(n) for n in names]
    assert drift_set.api_kinds(names[:-1]) == [api_kind(n) for n in names[:-1]]
    assert drift_set.api_kinds([]) == [] and drift_set.api_kinds([""]) == [""]


def test_report_json_keeps_the_exact_count_and_the_drifts_by_api() -> None:
    bumps = [1e-3 * (1 + (i * 7) % CALLS) for i in range(CALLS)]
    stage, full = two_ranks(bumps), every_drift(bumps)
    outcome = Outcome(False, verdict_text.stage_text(stage, verdict_text.Reading()), OutcomeKind.COMPARED, stage)
    record = ItemRecord.from_outcome(outcome, nodeid="s.yaml::actor_update[step_1]", scenario="s", step=1,
                                     stage="actor_update")  # fmt: skip
    assert record.beyond == 2 * CALLS
    worst = max(d.ratio for d in full)
    assert record.beyond_by_api == [
        {"api": "Functional.linear.forward.output", "statistic": "Max", "count": 2 * CALLS, "worst_ratio": worst}
    ]
    validate(PrecisionReport(mode="check", records=[record]).to_document(), "report", source="report.json")


def test_by_api_counts_and_maxes_every_drift_of_every_api_and_statistic() -> None:
    """The table's count per (API, statistic) is what the drifts built one by one add up to, over several APIs,
    statistics moved on some rows only, and rows with no drift between drifting ones."""
    apis = ("linear", "softmax", "matmul", "gelu")
    golden = {f"Functional.{apis[i % 4]}.{i}.forward": {"output": [tensor(Max=1.0, Norm=4.0)]} for i in range(CALLS)}
    run = copy.deepcopy(golden)
    for i, name in enumerate(run):
        out = run[name]["output"][0]
        out["Max"] = 1.0 + 1e-3 * (1 + (i * 7) % 11) * (i % 5 != 0)  # every fifth row unmoved
        if i % 3 == 0:
            out["Norm"] = 4.0 * (1 + 1e-4 * (1 + i % 13))
    v = compare.compare_rank({"data": run}, {"data": golden}, policy=TolerancePolicy(), stage="s", rank="rank0")
    one_by_one = RankVerdict("rank0")
    for order, name in enumerate(run):
        row = compare._Row(f"{name}.output.0", order, run[name]["output"][0], golden[name]["output"][0])
        compare._compare_row(one_by_one, row, policy=TolerancePolicy(), stage="s")
    expected: dict = {}
    for d in one_by_one.drifts:
        entry = expected.setdefault((api_kind(d.tensor), d.statistic), [0, 0.0])
        entry[0], entry[1] = entry[0] + 1, max(entry[1], d.ratio)
    assert len(expected) == 8 and v.drift_set.by_api == expected
