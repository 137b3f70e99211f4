"""trainer.world_size 2: ranks as Ray actors with gloo, every rank gated, a rank-1-only change named as rank1."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harness_testing import hooks_env

pytest.importorskip("ray", reason="multi-rank scenarios run on Ray: pip install -c constraints/cpu.txt 'ray[default]'")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def dp2_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project holding the committed world_size 2 scenario and its golden (both ranks)."""
    (pytester.path / "scenarios").mkdir()
    shutil.copy(ROOT / "scenarios/ppo_dp2_tiny.yaml", pytester.path / "scenarios")
    shutil.copytree(ROOT / "golden/ppo_dp2_tiny", pytester.path / "golden/ppo_dp2_tiny")
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return pytester


def test_golden_keeps_every_rank() -> None:
    golden = ROOT / "golden/ppo_dp2_tiny/cpu"
    files = [p.relative_to(golden) for p in golden.rglob("dump.json.zst")]
    assert {p.parts[3] for p in files} == {"rank0", "rank1"} and len(files) == 2 * 2 * 5


def test_change_to_rank1_data_fails_naming_rank1(dp2_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only rank 1's shard of the advantages moves (x1.001): actor_update @ step_1 names rank1 as first divergence."""
    for name, value in hooks_env(PRECISION_TEST_PERTURB_RANK="1").items():
        monkeypatch.setenv(name, value)
    result = dp2_project.runpytest_subprocess("-rA")
    out = result.stdout.str()
    for stage in ("actor_compute_log_prob", "ref_compute_log_prob", "compute_values", "critic_update"):
        assert (
            f"PASSED scenarios/ppo_dp2_tiny.yaml::{stage}[step_1]" in out
        )  # the advantages are not used before actor_update
    result.stdout.fnmatch_lines(
        [
            "*actor_update @ step_1, rank1 (differs on rank0, rank1 of 2 ranks): * statistics beyond tolerance*",
            "  first divergence  rank1 *",
        ]
    )
    assert "FAILED scenarios/ppo_dp2_tiny.yaml::actor_update[step_1]" in out
    assert "Traceback" not in out
