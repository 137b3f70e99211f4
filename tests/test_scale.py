"""Scale and devices, without running a scenario: world_size in the scenario, rank naming in verdicts,
cross-device tolerance, concurrent golden writes, and the clear errors when ray / a device is missing."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testing import HOOKS, TINY, base_data, write_dump
from test_golden import fake_run

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare import stage as compare
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts import verdict_text
from precision_harness.dumps.stage import DirStage
from precision_harness.errors import RunFailedError, ScenarioError
from precision_harness.goldens.store import GoldenStore
from precision_harness.runs import kind_runners, launch
from precision_harness.runs.host import device_availability
from precision_harness.runs.runner import ray_launch
from precision_harness.scenarios.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent


#: tiny_ppo on 2 ranks: 4 sequences, mini-batch 2 sequences -> 1 per rank, so micro-batches of 1
DP2 = """
trainer: {total_training_steps: 2, world_size: 2}
actor_rollout_ref:
  actor: {ppo_mini_batch_size: 1, ppo_micro_batch_size_per_gpu: 1, optim: {lr: 1.0e-3}}
  rollout: {n: 2}
critic: {ppo_mini_batch_size: 1, ppo_micro_batch_size_per_gpu: 1, optim: {lr: 1.0e-3}}
"""


def load_with(tmp_path: Path, extra: str, name: str = "s") -> Scenario:
    path = tmp_path / f"{name}.yaml"
    path.write_text(TINY.read_text() + "\n" + textwrap.dedent(extra))
    return Scenario.load(path)


# --------------------------------------------------------------------------------- scenario
def test_world_size_one_keeps_the_recorded_hashes() -> None:
    """Adding trainer.world_size (default 1) must not make every existing golden stale."""
    for name in ("grpo_tiny", "ppo_gae_tiny"):
        manifest = json.loads((ROOT / "golden" / name / "cpu" / "manifest.json").read_text())
        assert Scenario.load(ROOT / "scenarios" / f"{name}.yaml").hash == manifest["scenario_hash"]


def test_world_size_is_structural_ray_resources_are_not(tmp_path: Path) -> None:
    base = Scenario.load(TINY)
    two = load_with(tmp_path, DP2, "two")
    npu = load_with(tmp_path, "trainer: {ray: {resources: {NPU: 1}, num_cpus: 2}}", "npu")
    assert two.world_size == 2 and two.hash != base.hash
    assert npu.hash == base.hash
    assert npu.ray_resources("npu") == {"num_cpus": 2, "resources": {"NPU": 1}}
    assert base.ray_resources("npu")["resources"] == {"NPU": 1}
    assert base.ray_resources("cuda")["num_gpus"] == 1


def test_world_size_must_split_the_mini_batch(tmp_path: Path) -> None:
    # tiny: 4 prompts x n=1, actor mini-batch 2 prompts, micro 2 -> 1 sequence per rank cannot hold a micro-batch of 2
    with pytest.raises(
        ScenarioError,
        match=r"s\.yaml: actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu: 2 "
        r"must divide the per-rank mini-batch of 2/2 sequences",
    ):
        load_with(tmp_path, "trainer: {world_size: 2}")
    with pytest.raises(ScenarioError, match=r"trainer\.world_size: 3 must divide the batch of 4 sequences"):
        load_with(tmp_path, "trainer: {world_size: 3}")


def test_ray_resources_schema_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"trainer\.ray\.resources\.NPU: -1 is less than the minimum of 0"):
        load_with(tmp_path, "trainer: {ray: {resources: {NPU: -1}}}")


# ---------------------------------------------------------------------------------- verdicts
def _two_rank_dumps(root: Path, *, rank1_early: bool) -> tuple[Path, Path]:
    """Golden and target with 2 ranks; target rank1 drifts at its first API, rank0 only at its last."""
    for side in ("golden", "target"):
        for rank in ("rank0", "rank1"):
            data = base_data()
            if side == "target" and rank == "rank1" and rank1_early:
                data["Functional.embedding.0.forward"]["output"][0]["Norm"] = 2.5
            if side == "target" and rank == "rank0":
                data["Functional.softmax.0.forward"]["output"][0]["Norm"] = 2.6
            write_dump(root / side / "step_1" / "actor_update", data, rank)
    return root / "target" / "step_1" / "actor_update", root / "golden" / "step_1" / "actor_update"


def test_verdict_names_the_rank_that_diverged_first(tmp_path: Path) -> None:
    target, golden = _two_rank_dumps(tmp_path, rank1_early=True)
    v = compare.compare_stage(DirStage(target), DirStage(golden), CheckSettings(scenario="s", policy=TolerancePolicy()))
    assert v.first_divergence is not None and v.first_divergence.rank == "rank1"
    assert v.failing_ranks == ["rank0", "rank1"]
    text = verdict_text.stage_text(v)
    assert text.splitlines()[0].startswith("actor_update @ step_1, rank1 (differs on rank0, rank1 of 2 ranks)")
    assert "first divergence  rank1 Functional.embedding.0.forward.output.0" in text


def test_verdict_names_only_the_drifting_rank(tmp_path: Path) -> None:
    target, golden = _two_rank_dumps(tmp_path, rank1_early=False)
    v = compare.compare_stage(DirStage(target), DirStage(golden), CheckSettings(scenario="s", policy=TolerancePolicy()))
    assert verdict_text.stage_text(v).startswith("actor_update @ step_1, rank0 (differs on rank0 of 2 ranks)")


# ------------------------------------------------------------------------------ cross-device
def test_cross_device_policy_replaces_same_device_rules() -> None:
    section = {
        "mode": "exact",
        "stages": {"actor_update": {"rtol": 0.0}},
        "cross_device": {"apis": {"Functional.softmax.*": {"rtol": 0.05}}},
    }
    same = TolerancePolicy.from_config(section)
    cross = TolerancePolicy.cross_device_from_config(section)
    kw = {"stage": "actor_update", "statistic": "Norm"}
    assert same.for_tensor(dtype="torch.float32", api="Functional.linear.0.forward.output.0", **kw).rtol == 0.0
    assert cross.for_tensor(dtype="torch.float32", api="Functional.linear.0.forward.output.0", **kw).rtol == 1e-3
    assert cross.for_tensor(dtype="torch.bfloat16", api="Functional.linear.0.forward.output.0", **kw).rtol == 3.2e-2
    assert cross.for_tensor(dtype="torch.float32", api="Functional.softmax.0.forward.output.0", **kw).rtol == 0.05
    assert cross.for_metric("actor/pg_loss").rtol == 1e-3 and not cross.exact


def test_cross_device_key_is_validated(tmp_path: Path) -> None:
    with pytest.raises(
        ScenarioError, match=r"tolerance\.cross_device: Additional properties are not allowed \('rtl' was unexpected\)"
    ):
        load_with(tmp_path, "tolerance: {cross_device: {rtl: 1}}")


# ------------------------------------------------------------------------- concurrent goldens
def _promote(args: tuple[str, str, str]) -> bool:
    run_dir, golden_root, scenario_path = args
    return GoldenStore(Path(golden_root)).promote(Path(run_dir), Scenario.load(scenario_path), "cpu")


def test_two_workers_recording_the_same_golden_leave_one_valid_golden(tmp_path: Path) -> None:
    """Two xdist workers (processes) promoting at once: the lock serialises them; no temp or backup folder remains."""
    scenario = Scenario.load(TINY)
    runs = [str(fake_run(tmp_path / f"run{i}", scenario, norm=12.5 + i)) for i in range(4)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_promote, [(r, str(tmp_path / "golden"), str(TINY)) for r in runs])
    assert all(results)  # each run differs, so each promote rewrote the golden
    store = GoldenStore(tmp_path / "golden")
    golden = store.load(scenario, "cpu")
    for rel in golden.manifest["files"]:
        golden.verify_file(rel)
    assert sorted(p.name for p in (tmp_path / "golden" / scenario.name).iterdir()) == [".cpu.lock", "cpu"]


# ------------------------------------------------------------------------ missing ray / device
def test_multi_rank_without_ray_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_launch, "ray_available", lambda: False)
    scenario = load_with(tmp_path, DP2)
    with pytest.raises(
        RunFailedError,
        match=r"s\.yaml: trainer\.world_size: 2 runs ranks as Ray actors, but ray is not installed; "
        r"pip install 'ray\[default\]>=2\.40' \(a dependency of pytest-precision",
    ):
        kind_runners.run_scenario(scenario, out_dir=tmp_path / "run", device="cpu")
    with pytest.raises(RunFailedError, match=r"--precision-ray-address 127\.0\.0\.1:1, but ray is not installed"):
        kind_runners.run_scenario(
            Scenario.load(TINY),
            out_dir=tmp_path / "run",
            device="cpu",
            options=launch.RunOptions(ray_address="127.0.0.1:1"),
        )


def test_device_check_without_torch_npu_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    device_availability.unavailable_reason.cache_clear()
    monkeypatch.setattr(device_availability, "_has_module", lambda name: False)
    assert (
        device_availability.unavailable_reason("npu")
        == f"device npu: torch_npu is not installed; {device_availability.NPU_FIX}"
    )
    assert device_availability.unavailable_reason("cpu") is None
    device_availability.unavailable_reason.cache_clear()


def test_data_parallel_helpers_on_two_gloo_ranks(tmp_path: Path) -> None:
    """shard / gather / gradient mean / metric mean / the rank perturbation hook, on 2 real gloo processes."""
    script = tmp_path / "dp.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys, torch
        import precision_test_hooks as hooks
        from precision_harness.runs.runner import distributed as dp
        rank = int(sys.argv[1])
        os.environ[hooks.PERTURB_ENV] = "1"
        port = int(sys.argv[2])
        dp.init_process_group(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, device="cpu")
        batch = {"x": torch.arange(8.0).reshape(4, 2), "advantages": torch.ones(4, 1)}
        part = dp.shard(hooks.perturb(batch))
        gathered = dp.dp_compute(lambda model, b: (b["x"] * 2, None))(None, batch)
        p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.full((2,), float(rank + 1))
        dp.average_gradients([p])
        m = dp.reduce_metrics({"loss": float(rank), "same": 0.1, "step": 1})
        print(json.dumps({"x": part["x"].tolist(), "adv": part["advantages"].flatten().tolist(),
                          "gathered": gathered[0].tolist(), "grad": p.grad.tolist(), "metrics": m,
                          "per_rank": dp.per_rank(4)}))
        dp.destroy_process_group()
    """)
    )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {"PYTHONPATH": os.pathsep.join((str(HOOKS), str(ROOT))), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    r0, r1 = outs
    assert r0["x"] == [[0, 1], [2, 3]] and r1["x"] == [[4, 5], [6, 7]]
    assert r0["adv"] == [1.0, 1.0] and r1["adv"] == [pytest.approx(1.001)] * 2  # only rank 1's shard is perturbed
    assert r0["gathered"] == r1["gathered"] == [[2 * v for v in row] for row in [[0, 1], [2, 3], [4, 5], [6, 7]]]
    assert r0["grad"] == r1["grad"] == [1.5, 1.5]
    assert r0["metrics"] == r1["metrics"] == {"loss": 0.5, "same": 0.1, "step": 1}
    assert r0["per_rank"] == 2
