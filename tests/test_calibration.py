"""Calibrated noise: rtol = max(k x observed, dtype floor), kept across re-records, schema-valid."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness_testing import TINY
from test_golden import fake_run

from precision_harness.check.tolerance.calibrate import DEFAULT_K, proposed_tolerance, variant, variations
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.errors import SchemaError
from precision_harness.goldens.store import GoldenStore
from precision_harness.scenarios.scenario import Scenario

NOISE = {
    "runs": 4,
    "k": 3.0,
    "variations": ["num_threads=1"],
    "stages": {"actor_update": {"Max": 1e-5, "Min": 0.0, "Mean": 0.0, "Norm": 2e-7}},
}


def test_noise_only_widens() -> None:
    policy = TolerancePolicy().with_noise(NOISE)

    def tol(stat: str, stage: str = "actor_update") -> float:
        return policy.for_tensor(dtype="torch.float32", stage=stage, statistic=stat, api="x").rtol

    assert tol("Max") == pytest.approx(3e-5)  # 3 x 1e-5 above the fp32 floor
    assert tol("Norm") == 1.3e-6  # 3 x 2e-7 = 6e-7 is below the floor: the floor stays
    assert tol("Min") == 1.3e-6 and tol("Max", stage="critic_update") == 1.3e-6
    assert "calibrated k=3" in policy.describe()
    assert (
        TolerancePolicy(mode="exact")
        .with_noise(NOISE)
        .for_tensor(dtype="torch.float32", stage="actor_update", statistic="Max", api="x")
        .rtol
        == 0
    )


def test_set_noise_validates_and_survives_rerecord(tmp_path: Path) -> None:
    scenario = Scenario.load(TINY)
    store = GoldenStore(tmp_path / "golden")
    run = fake_run(tmp_path / "run", scenario)
    store.promote(run, scenario, "cpu")
    assert store.set_noise("tiny_ppo", "cpu", NOISE) is True
    assert store.set_noise("tiny_ppo", "cpu", NOISE) is False
    manifest = store.path("tiny_ppo", "cpu") / "manifest.json"
    before = manifest.read_bytes()
    assert store.promote(run, scenario, "cpu") is False  # same run: noise carried over, nothing rewritten
    assert manifest.read_bytes() == before
    assert store.load(scenario, "cpu").manifest["noise"] == NOISE
    with pytest.raises(SchemaError, match=r"manifest.json: noise.runs: 1 is less than the minimum of 2"):
        store.set_noise("tiny_ppo", "cpu", {**NOISE, "runs": 1})


def test_variations_cycle_thread_counts(tmp_path: Path) -> None:
    scenario = Scenario.load(TINY)
    assert [v.num_threads for v in variations(scenario, 5)] == [1, 2, 4, 3, 1]
    rerun = variant(scenario, variations(scenario, 2)[1], tmp_path)
    assert rerun.name == "tiny_ppo" and rerun.config["trainer"]["num_threads"] == 2
    assert rerun.path == tmp_path / "tiny_ppo.2threads.yaml"
    assert DEFAULT_K == 3.0


def test_on_a_device_the_reruns_keep_the_scenarios_settings() -> None:
    """On a GPU or NPU the spread to measure is the device's own (collectives, kernels): plain reruns."""
    scenario = Scenario.load(TINY)
    assert [v.num_threads for v in variations(scenario, 4, "npu")] == [1, 1, 1, 1]
    assert [v.num_threads for v in variations(scenario, 4, "cuda")] == [1, 1, 1, 1]


def test_the_proposed_tolerance_is_k_times_the_largest_spread_of_each_stage_that_moved() -> None:
    noise = {
        "runs": 3,
        "k": 1.5,
        "stages": {
            "actor_update": {"Max": 2.0e-4, "Min": 1.0e-4, "Mean": 3.0e-4, "Norm": 0.0},
            "actor_compute_log_prob": {"Max": 0.0, "Min": 0.0, "Mean": 0.0, "Norm": 0.0},
        },
    }
    assert proposed_tolerance(noise) == {"stages": {"actor_update": {"rtol": 4.5e-4}}}
    still = {**noise, "stages": {"actor_update": {"Max": 0.0, "Min": 0.0, "Mean": 0.0, "Norm": 0.0}}}
    assert proposed_tolerance(still) == {"stages": {}}


def test_noise_never_loosens_integer_tensors() -> None:
    """Integer and bool tensors must match exactly, calibrated noise or not."""
    policy = TolerancePolicy().with_noise(NOISE)
    tol = policy.for_tensor(dtype="torch.int64", stage="actor_update", statistic="Max", api="x")
    assert (tol.rtol, tol.atol) == (0.0, 0.0)
    assert policy.for_tensor(dtype="torch.float32", stage="actor_update", statistic="Max", api="x").rtol > 1.3e-6
