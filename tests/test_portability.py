"""CPU portability: the portable kernels make every dump independent of MKL/oneDNN dispatch, and the
portability check names the (step, stage) that a dispatch-dependent kernel moves.

The pytest process never imports torch: kernel tests run a snippet in a fresh interpreter.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testing import base_data, write_dump

from precision_harness import cli
from precision_harness.errors import RunFailedError
from precision_harness.goldens.store import GoldenStore
from precision_harness.portability import (
    METRICS,
    SETTINGS,
    DispatchSetting,
    PortabilityRun,
    check_scenario,
    diff_runs,
    exported_golden,
)
from precision_harness.runs.host.machine import cpu_fingerprint
from precision_harness.runs.kind_runners import run_scenario
from precision_harness.runs.launch import RunOptions
from precision_harness.runs.numerics.devices import determinism_env
from precision_harness.scenarios.scenario import Scenario

REPO = Path(__file__).resolve().parent.parent
BF16 = REPO / "scenarios" / "grpo_bf16_actor.yaml"
#: MKL's dispatcher capped at SSE4.2 (which moved exp and log under the pin before, MKL_CBWR=AVX2) and the two
#: settings that move oneDNN where a kernel still reaches it: a fast subset for every CI run
FAST = tuple(
    s for s in SETTINGS if s.name in ("MKL_ENABLE_INSTRUCTIONS=SSE4_2", "ONEDNN_MAX_CPU_ISA=ALL", "PRECISION_MKLDNN=0")
)
#: not one of the check's settings: MKL's branch for this processor, which a run without the gate's pin
#: (``devices.MKL_BRANCH``) takes; on an Intel processor and on an AMD one it differs from COMPATIBLE in MKL's sgemm
MKL_OWN_BRANCH = DispatchSetting(env=(("MKL_CBWR", "AUTO"),), emulates="MKL's own branch for this processor")


# ------------------------------------------------------------------------------------- the diff
def _run_dir(root: Path, data: dict, metrics: list[dict]) -> Path:
    write_dump(root / "step_1" / "actor_update", data)
    write_dump(root / "step_1" / "actor_compute_log_prob", base_data())
    (root / METRICS).write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return root


def test_diff_names_the_first_differing_row_and_stage(tmp_path: Path) -> None:
    metrics = [{"training/global_step": 1, "actor/pg_loss": 0.25}]
    base = _run_dir(tmp_path / "base", base_data(), metrics)
    moved = copy.deepcopy(base_data())
    moved["Functional.linear.0.forward"]["output"][0]["Mean"] = 0.010000001
    moved["Functional.softmax.0.forward"]["output"][0]["Max"] = 0.91
    other = _run_dir(tmp_path / "other", moved, [{"training/global_step": 1, "actor/pg_loss": 0.2500001}])
    changes = diff_runs(base, other, "MKL_CBWR=COMPATIBLE")
    assert [c.where for c in changes] == ["actor_update @ step_1", METRICS]
    assert changes[0].first == "Functional.linear.0.forward.output.0 Mean 0.01 -> 0.010000001"
    assert changes[1].first == "step_1 actor/pg_loss 0.25 -> 0.2500001"
    assert all(c.setting == "MKL_CBWR=COMPATIBLE" for c in changes)


def test_identical_runs_have_no_change(tmp_path: Path) -> None:
    metrics = [{"training/global_step": 1, "actor/pg_loss": 0.25}]
    base = _run_dir(tmp_path / "base", base_data(), metrics)
    other = _run_dir(tmp_path / "other", base_data(), metrics)
    assert diff_runs(base, other, "x") == []


def test_stage_missing_from_a_run_is_a_change(tmp_path: Path) -> None:
    base = _run_dir(tmp_path / "base", base_data(), [])
    other = tmp_path / "other"
    write_dump(other / "step_1" / "actor_update", base_data())
    (other / METRICS).write_text("")
    changes = diff_runs(base, other, "x")
    assert [(c.where, c.first) for c in changes] == [("actor_compute_log_prob @ step_1", "missing from this run")]


def test_report_lines_group_settings_by_stage() -> None:
    from precision_harness.portability import Change, ScenarioPortability

    result = ScenarioPortability(scenario="s", settings=["A=1", "B=2"], files=6)
    assert result.lines() == [
        "s: dispatch-independent: 6 stage dumps and metrics.jsonl byte-identical under 2 settings (3 runs)"
    ]
    result.changes = [
        Change("A=1", "actor_update @ step_2", "row2"),
        Change("A=1", "actor_update @ step_1", "row1"),
        Change("B=2", "actor_update @ step_1", "row1b"),
    ]
    assert result.lines() == [
        "s: 2 of 6 stage dumps change with the CPU dispatch",
        "  actor_update @ step_1: first differing row row1",
        "    under A=1; B=2",
        "  actor_update @ step_2: first differing row row2",
        "    under A=1",
    ]


def test_every_setting_has_a_distinct_name_and_says_what_it_emulates() -> None:
    names = [s.name for s in SETTINGS]
    assert len(set(names)) == len(names) and all(s.emulates for s in SETTINGS)
    assert DispatchSetting(env=(("A", "1"), ("B", "2")), emulates="x").name == "A=1 B=2"


# ------------------------------------------------------------------------------------- the CLI
def test_cli_unknown_setting_is_one_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["portability", str(BF16), "--setting", "MKL_CBWR=AVX512"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "--setting 'MKL_CBWR=AVX512': not one of: MKL_ENABLE_INSTRUCTIONS=SSE4_2" in err


def test_cli_bad_scenario_is_one_line_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {hidden_size: -1}\n")
    code = cli.main(["portability", str(BF16), str(bad), "--work-dir", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "bad.yaml" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_cli_against_a_missing_golden_is_one_line_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["portability", str(BF16), "--against-golden", "--golden-dir", str(tmp_path / "none")]
    code = cli.main([*argv, "--work-dir", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "grpo_bf16_actor" in err
    assert not (tmp_path / "w" / "grpo_bf16_actor" / "setting_0").exists()


# ------------------------------------------------------------------------------ the kernels
KERNEL_SNIPPET = textwrap.dedent(
    """
    import json, sys, torch
    from precision_harness.runs.numerics import cpu_kernels
    torch.manual_seed(0)
    a, b = torch.randn(37, 70), torch.randn(70, 29)
    c, v = torch.randn(37, 29), torch.randn(70)
    A, B, C = torch.randn(3, 9, 70), torch.randn(3, 70, 11), torch.randn(3, 9, 11)
    ai, bi = torch.randint(-1000, 1000, (5, 7)), torch.randint(-1000, 1000, (7, 3))
    cases = {
        "mm": lambda: torch.mm(a, b),
        "mm_int64": lambda: torch.mm(ai, bi),
        "addmm": lambda: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
        "bmm": lambda: torch.bmm(A, B),
        "baddbmm": lambda: torch.baddbmm(C, A, B, beta=0.0, alpha=1.5),
        "mv": lambda: torch.mv(a, v),
        "addmv": lambda: torch.addmv(c[:, 0], a, v),
        "dot": lambda: torch.dot(v, v),
        "linear_bf16": lambda: torch.nn.functional.linear(a.bfloat16(), b.T.bfloat16(), c[0].bfloat16()),
        "matmul_out": lambda: torch.matmul(a, b, out=torch.empty(0)),
        "addmm_": lambda: c.clone().addmm_(a, b),
    }
    ref = {k: f().double() for k, f in cases.items()}
    ref["linear_bf16"] = torch.nn.functional.linear(
        a.bfloat16().double(), b.T.bfloat16().double(), c[0].bfloat16().double()
    )
    cpu_kernels.install()
    out = {}
    for k, f in cases.items():
        y = f()
        rel = ((y.double() - ref[k]).abs().max() / ref[k].abs().max()).item()
        out[k] = {"bytes": y.float().numpy().tobytes().hex(), "rel": rel, "dtype": str(y.dtype), "shape": list(y.shape)}
    x = torch.randn(5, 70, requires_grad=True)
    torch.nn.functional.linear(x, b.T).sum().backward()
    out["grad_err"] = (x.grad.double() - b.double().sum(1).expand(5, 70)).abs().max().item()
    out["mkldnn"] = torch.backends.mkldnn.enabled
    json.dump(out, sys.stdout)
    """
)


def _snippet(code: str, env: dict[str, str], *, threads: int) -> dict:
    """What ``code`` prints as JSON, run in a fresh interpreter under the gate's cpu environment, then ``env``."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **determinism_env("cpu", threads), **env, "PYTHONPATH": str(REPO)},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _kernels(env: dict[str, str]) -> dict:
    return _snippet(KERNEL_SNIPPET, env, threads=2)


def test_portable_kernels_are_accurate_and_independent_of_mkl_and_onednn() -> None:
    pinned = _kernels({})
    for name, case in pinned.items():
        if not isinstance(case, dict):
            continue
        bound = 2**-8 if name == "linear_bf16" else 1e-6  # bf16: one rounding of the output, half an ulp
        assert case["rel"] < bound, (name, case["rel"])
    assert pinned["linear_bf16"]["dtype"] == "torch.bfloat16" and pinned["mm"]["shape"] == [37, 29]
    assert pinned["mm_int64"]["rel"] == 0 and pinned["mm_int64"]["dtype"] == "torch.int64"
    assert pinned["grad_err"] < 1e-4 and pinned["mkldnn"] is False
    for env in ({"MKL_CBWR": "AUTO"}, {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}):
        other = _kernels(env)
        changed = [k for k in pinned if isinstance(pinned[k], dict) and pinned[k]["bytes"] != other[k]["bytes"]]
        assert changed == [], (env, changed)


#: ATen's element-wise functions that call MKL's vector math on fp32 tensors (torch's ATen/cpu/vml.h), and the
#: backward that reaches one of them (a logsumexp's: its exp): bytes, hex
VECTOR_MATH_SNIPPET = textwrap.dedent(
    """
    import json, sys, torch
    torch.manual_seed(0)
    x = torch.randn(4096) * 3
    y = x.view(64, 64).clone().requires_grad_()
    torch.logsumexp(y, -1).sum().backward()
    out = {name: getattr(torch, name)(x).numpy().tobytes().hex() for name in ("exp", "sin", "cos", "erf", "tanh")}
    out |= {"log": torch.log(x.abs() + 1e-3), "sqrt": torch.sqrt(x.abs())} | {"logsumexp_backward": y.grad}
    out = {k: v if isinstance(v, str) else v.numpy().tobytes().hex() for k, v in out.items()}
    json.dump(out, sys.stdout)
    """
)


def _vector_math(env: dict[str, str]) -> dict[str, str]:
    return _snippet(VECTOR_MATH_SNIPPET, env, threads=1)


def test_mkls_vector_math_under_the_pinned_branch_ignores_what_the_processor_has() -> None:
    """Under the gate's MKL_CBWR=COMPATIBLE, exp, log, sqrt, sin, cos, erf, tanh and a logsumexp's backward give the
    same bytes whatever MKL's dispatcher is told the processor has (SSE4.2 up to AVX-512): one code path. Under the
    pin before (MKL_CBWR=AVX2) an Intel processor with AVX2 took another path than one capped at SSE4.2 (MKL runs a
    branch other than AUTO and COMPATIBLE on Intel only, so there the AVX2 branch is this machine's own)."""
    pinned = _vector_math({})
    for isa in ("SSE4_2", "AVX2", "AVX512"):
        assert _vector_math({"MKL_ENABLE_INSTRUCTIONS": isa}) == pinned, isa
    cpu = cpu_fingerprint()
    if cpu["cpu_vendor"] == "GenuineIntel" and "avx2" in cpu["cpu_flags"].split():
        before = {"MKL_CBWR": "AVX2"}
        low, high = _vector_math({**before, "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}), _vector_math(before)
        assert [k for k in low if low[k] != high[k]], "the AVX2 branch did not move MKL's vector math"


# ------------------------------------------------------------------------------ the scenarios
def _golden_run_dir(scenario: Scenario, work_dir: Path) -> Path:
    """The committed golden exported as ``precision-harness portability --against-golden`` does, into the folder the
    check's runs then go to (which the check clears scenario by scenario)."""
    return exported_golden(GoldenStore(REPO / "golden"), scenario, "cpu", work_dir)


def _vendor(tmp_path: Path) -> Scenario:
    return Scenario.load(BF16).with_overrides(
        {"trainer.cpu_kernels": "vendor"}, directory=tmp_path / "variant", name="grpo_bf16_actor", tag="vendor"
    )


def test_bf16_scenario_is_dispatch_independent(tmp_path: Path) -> None:
    scenario = Scenario.load(BF16)
    golden = _golden_run_dir(scenario, tmp_path)
    result = check_scenario(scenario, PortabilityRun(device="cpu", work_dir=tmp_path, settings=FAST, baseline=golden))
    assert result.independent, "\n".join(result.lines())
    assert result.files == 6 and result.settings == [s.name for s in FAST]


def test_check_names_the_bf16_stage_a_dispatch_dependent_kernel_moves(tmp_path: Path) -> None:
    """With the portable kernels undone (torch's MKL kernels), MKL's own branch for this processor (not the pinned
    COMPATIBLE one) moves step 1: the fp32 rollout's log-probs (sgemm), which the bf16 actor's update reads, and on
    an Intel processor also MKL's vector math in the actor's log-prob stage, which comes first."""
    own = (MKL_OWN_BRANCH,)
    result = check_scenario(_vendor(tmp_path), PortabilityRun(device="cpu", work_dir=tmp_path / "w", settings=own))
    assert not result.independent
    first = result.changes[0]
    assert first.where in ("actor_compute_log_prob @ step_1", "actor_update @ step_1"), result.lines()
    assert first.setting == "MKL_CBWR=AUTO"
    assert " -> " in first.first
    assert result.lines()[0].startswith("grpo_bf16_actor: ")


def test_cpu_without_avx2_kernels_is_refused_in_one_line(tmp_path: Path) -> None:
    """ATEN_CPU_CAPABILITY=default is what a CPU without AVX2 runs: its dumps could never match."""
    with pytest.raises(RunFailedError) as info:
        run_scenario(
            Scenario.load(BF16),
            out_dir=tmp_path / "run",
            device="cpu",
            options=RunOptions(dispatch_env={"ATEN_CPU_CAPABILITY": "default"}),
        )
    message = str(info.value)
    assert "CPU goldens are recorded with ATen's AVX2 kernels, but this CPU runs DEFAULT" in message
    assert len(message.splitlines()) == 1


#: committed single-rank scenarios but grpo_bf16_actor (above, under :data:`FAST`), one under each dispatch setting,
#: compared with its committed golden (which the gate holds bitwise on x86). The settings move MKL's dispatcher and
#: oneDNN, and a committed scenario's matrix products touch neither, so a further scenario under them would only
#: repeat the gate's own check of it; the two-rank ppo_dp2_tiny (a Ray instance of its own under another environment)
#: is left to the gate.
COMMITTED = sorted(p for p in (REPO / "scenarios").glob("*.yaml") if p != BF16 and p.stem != "ppo_dp2_tiny")
ROTATION = list(zip(COMMITTED, SETTINGS, strict=False))


@pytest.mark.parametrize(("path", "setting"), ROTATION, ids=[f"{p.stem}-{s.name}" for p, s in ROTATION])
def test_a_committed_scenario_holds_its_golden_under_each_setting(
    path: Path, setting: DispatchSetting, tmp_path: Path
) -> None:
    scenario = Scenario.load(path)
    how = PortabilityRun(
        device="cpu", work_dir=tmp_path, settings=(setting,), baseline=_golden_run_dir(scenario, tmp_path)
    )
    result = check_scenario(scenario, how)
    assert result.independent, "\n".join(result.lines())
    assert result.files > 0 and result.settings == [setting.name] and result.against == "golden"
    assert "byte-identical to the golden under 1 settings (1 runs)" in result.lines()[0]


def test_a_setting_run_against_a_golden_names_the_stage_that_differs_from_it(tmp_path: Path) -> None:
    """The golden baseline is read, not assumed: a golden whose actor_update differs from the run is a change."""
    scenario = Scenario.load(REPO / "scenarios" / "grpo_tiny.yaml")
    golden = _golden_run_dir(scenario, tmp_path)
    dump = next((golden / "step_1" / "actor_update").rglob("dump.json"))
    data = json.loads(dump.read_text())
    row = next(k for k, v in data["data"].items() if v.get("output"))
    data["data"][row]["output"][0]["Max"] += 1.0
    dump.write_text(json.dumps(data))
    how = PortabilityRun(device="cpu", work_dir=tmp_path, settings=SETTINGS[:1], baseline=golden)
    result = check_scenario(scenario, how)
    assert [c.where for c in result.changes] == ["actor_update @ step_1"]
    assert result.changes[0].first.startswith(f"{row}.output.0 Max ")
    assert not (tmp_path / scenario.name / "baseline").exists()


def test_the_rotation_runs_every_setting() -> None:
    assert len(COMMITTED) >= len(SETTINGS) == len(ROTATION)
    assert {s.name for _, s in ROTATION} == {s.name for s in SETTINGS}
