"""check/compare/stat_table.py: one rule for judging a row, in two forms. The table's arrays (the regular rows of a
rank) and ``judge_statistics``'s floats (a row the table leaves out, a row of a changed code path) give the same
tolerance and the same ratio, float for float, on the cells where a vectorised form could part from the scalar one.
"""

from __future__ import annotations

import math

import pytest

from precision_harness.check.compare.stat_table import RowRule, StatTable, judge_statistics
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps.rows import rms, row_statistics
from precision_harness.dumps.statistics import STATISTICS

STAGE = "actor_update"
NAN, INF = math.nan, math.inf

#: (golden, run) values of one statistic: equal, within and beyond an fp32 rtol, zero, NaN and infinities appearing,
#: disappearing or equal, a sign flip, a subnormal
CELLS = [
    (1.0, 1.0),
    (1.0, 1.0 + 1e-7),
    (1.0, 1.001),
    (0.0, 0.0),
    (0.0, 1e-30),
    (0.0, 1e-3),
    (NAN, NAN),
    (1.0, NAN),
    (NAN, 1.0),
    (INF, INF),
    (-INF, INF),
    (1.0, INF),
    (-2.5, 2.5),
    (5e-324, 0.0),
]


def _item(dtype: str, values: tuple[float, ...]) -> dict:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": [4, 8], **dict(zip(STATISTICS, values, strict=True))}


def _pairs(dtype: str) -> list[tuple[str, dict, dict]]:
    """Every cell in every statistic's column, a row per four cells (Norm kept finite where Mean's scale needs it)."""
    cells = [*CELLS, *CELLS[3:], *CELLS[:5]]
    pairs = []
    for i, chunk in enumerate(cells[at : at + 4] for at in range(0, len(cells), 4)):
        golden = tuple(g for g, _ in chunk) + (2.0,) * (4 - len(chunk))
        run = tuple(t for _, t in chunk) + (2.0,) * (4 - len(chunk))
        name = f"Functional.softmax.{i}.forward.output.0" if i % 2 else f"Tensor.__mul__.{i}.forward.output.0"
        pairs.append((name, _item(dtype, run), _item(dtype, golden)))
    return pairs


POLICIES = {
    "fp32-defaults": TolerancePolicy.from_config({}),
    "api-globs-and-a-statistic-rule": TolerancePolicy.from_config(
        {"apis": {"Functional.softmax.*": {"rtol": 1e-3}}, "statistics": {"Mean": {"atol": 1e-4}}}
    ),
    "calibrated-per-row": TolerancePolicy.from_config({}).with_noise(
        {"runs": 2, "k": 3.0, "stages": {}, "rows": {STAGE: {"Tensor.__mul__.0.forward.output.0": {"Max": 0.25}}}}
    ),
    "exact": TolerancePolicy.from_config({"mode": "exact"}),
}


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16", "torch.int64"])
@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
def test_the_tables_ratios_are_judge_statistics_float_for_float(policy: TolerancePolicy, dtype: str) -> None:
    pairs = _pairs(dtype)
    table = StatTable(pairs, policy, STAGE)
    assert table.regular.all()
    for i, (name, run, golden) in enumerate(pairs):
        stats = row_statistics(golden)
        rule = RowRule(policy, STAGE, dtype, name, rms(stats.get("Norm"), golden["shape"]))
        judged = list(judge_statistics(row_statistics(run), stats, rule))
        assert [j.statistic for j in judged] == list(STATISTICS)
        for k, j in enumerate(judged):
            assert j.tol == table.tol(i, k), (name, j.statistic)
            assert j.ratio == table.ratio[i, k] or (math.isnan(j.ratio) and math.isnan(table.ratio[i, k])), (
                name,
                j.statistic,
                j.ratio,
                table.ratio[i, k],
            )
    # the cells part as they should: something beyond tolerance, something identical, something non-finite
    assert (table.ratio > 1).any() and (table.ratio == 0).any() and math.inf in table.ratio


def test_a_statistic_one_side_holds_has_no_ratio_and_one_neither_holds_is_left_out() -> None:
    rule = RowRule(POLICIES["fp32-defaults"], STAGE, "torch.float32", "Tensor.__mul__.0.forward.output.0", 1.0)
    run, golden = {"Max": 1.0, "Min": None, "Mean": 0.5}, {"Max": 1.0, "Min": 0.0, "Norm": None}
    judged = list(judge_statistics(run, golden, rule))
    assert [(j.statistic, j.ratio, j.tol is None) for j in judged] == [("Max", 0.0, False), ("Min", None, True)]
