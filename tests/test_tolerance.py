"""TolerancePolicy: dtype defaults, override precedence, ratios."""

from __future__ import annotations

import math

import pytest

from precision_harness.check.tolerance.policy import EXACT, Tol, TolerancePolicy, tolerance_ratio
from precision_harness.dumps.statistics import relative_change


def test_dtype_defaults_are_assert_close_rtols_with_msprobes_atol_floor() -> None:
    p = TolerancePolicy()

    def tol(dtype: str) -> Tol:
        return p.for_tensor(dtype=f"torch.{dtype}", stage="actor_update", statistic="Max", api="x")

    assert tol("float32") == Tol(1.3e-6, 2**-30)
    assert tol("bfloat16") == Tol(1.6e-2, 1e-16)
    assert tol("float16") == Tol(1e-3, 2**-16)
    assert tol("float64") == Tol(1e-7, 2**-30)
    assert tol("int64") == EXACT


def test_precedence_api_over_statistic_over_stage_over_dtype() -> None:
    p = TolerancePolicy.from_config(
        {
            "dtypes": {"float32": {"rtol": 1e-5}},
            "stages": {"actor_update": {"rtol": 1e-4}},
            "statistics": {"Mean": {"atol": 1e-3}},
            "apis": {"Functional.softmax.*": {"rtol": 1e-2}},
        }
    )
    kw = dict(dtype="torch.float32")
    assert p.for_tensor(
        stage="critic_update", statistic="Max", api="Functional.linear.0.forward.output.0", rms=2.0, **kw
    ) == Tol(1e-5, 2e-5)  # the atol scales with the overridden rtol
    assert p.for_tensor(
        stage="actor_update", statistic="Max", api="Functional.linear.0.forward.output.0", rms=2.0, **kw
    ) == Tol(1e-4, 2e-4)
    assert p.for_tensor(
        stage="actor_update", statistic="Mean", api="Functional.linear.0.forward.output.0", **kw
    ) == Tol(1e-4, 1e-3)
    assert p.for_tensor(
        stage="actor_update", statistic="Mean", api="Functional.softmax.1.forward.output.0", **kw
    ) == Tol(1e-2, 1e-3)


def test_exact_mode() -> None:
    p = TolerancePolicy.from_config({"mode": "exact", "stages": {"actor_update": {"rtol": 1.0}}})
    assert p.for_tensor(dtype="torch.float32", stage="actor_update", statistic="Max", api="x") == EXACT
    assert p.for_metric("actor/pg_loss") == EXACT
    assert math.isinf(tolerance_ratio(1.0 + 1e-12, 1.0, EXACT))
    assert tolerance_ratio(1.0, 1.0, EXACT) == 0.0


def test_metric_glob() -> None:
    p = TolerancePolicy.from_config({"metrics": {"critic/*": {"rtol": 0.1}}})
    assert p.for_metric("critic/vf_loss").rtol == 0.1
    assert p.for_metric("actor/pg_loss") == Tol(1.3e-6, 2**-30)


@pytest.mark.parametrize(
    ("target", "golden", "scale", "expected"),
    [
        (1.0, 1.0, None, 0.0),
        (1.0 + 1e-6, 1.0, None, 1e-6 / (1e-5 + 1.3e-6)),
        (101.0, 100.0, None, 1.0 / (1e-5 + 1.3e-4)),
        # Mean near zero: judged against the RMS scale, not |golden|
        (2e-7, 1e-7, 10.0, 1e-7 / (1e-5 + 1.3e-5)),
    ],
)
def test_ratio(target: float, golden: float, scale: float | None, expected: float) -> None:
    assert tolerance_ratio(target, golden, Tol(1.3e-6, 1e-5), scale=scale) == pytest.approx(expected)


def test_ratio_non_finite() -> None:
    tol = Tol(1.0, 1.0)
    assert math.isinf(tolerance_ratio(math.nan, 1.0, tol))
    assert math.isinf(tolerance_ratio(math.inf, 1.0, tol))
    assert math.isinf(tolerance_ratio(1.0, math.nan, tol))
    assert tolerance_ratio(math.nan, math.nan, tol) == 0.0
    assert tolerance_ratio(math.inf, math.inf, tol) == 0.0


def test_relative_change() -> None:
    assert relative_change(1.1, 1.0) == pytest.approx(0.1)
    assert math.isinf(relative_change(1.0, 0.0))
    assert relative_change(0.0, 0.0) == 0.0


def test_describe() -> None:
    assert TolerancePolicy().describe() == "fp32: rtol 1.3e-06, atol rtol x RMS"
    assert TolerancePolicy.from_config({"dtypes": {"float32": {"atol": 1e-5}}}).describe() == (
        "fp32: rtol 1.3e-06, atol 1e-05"
    )
    assert TolerancePolicy(mode="exact").describe() == "exact"
