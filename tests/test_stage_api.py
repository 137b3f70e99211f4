"""precision_harness.stage: one probe for loops without verl, in verl's layout, rank<r> folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import precision_harness
from precision_harness.runs.stage_api import StageError

ROOT = Path(__file__).resolve().parents[1]

LOOP = textwrap.dedent(
    """
    import os, sys
    import torch
    import precision_harness

    if os.environ.get("INIT_GROUP"):
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/pg", rank=0, world_size=1)
    model = torch.nn.Linear(3, 2)
    for step in (1, 2, 3):
        for name in ("actor_compute_log_prob", "actor_update"):
            with precision_harness.stage(name, step=step, model=model) as where:
                model(torch.ones(2, 3)).sum()
            print(step, name, where)
    """
)


def test_unknown_stage_is_refused_in_and_outside_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRECISION_DUMP_DIR", raising=False)
    expected = r"stage 'train_batch': not a verl precision_debugger stage; expected one of"
    with pytest.raises(StageError, match=expected), precision_harness.stage("train_batch", step=1):
        pass
    monkeypatch.setenv("PRECISION_DUMP_DIR", "/nonexistent")
    with pytest.raises(StageError, match="train_batch"), precision_harness.stage("train_batch", step=1):
        pass


def test_outside_the_gate_the_stage_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRECISION_DUMP_DIR", raising=False)
    ran = []
    with precision_harness.stage("actor_update", step=1) as where:
        ran.append(where)
    assert ran == [None]
    # a fresh process: outside the gate the stage imports neither torch nor msprobe
    code = (
        "import sys, precision_harness\n"
        "with precision_harness.stage('actor_update', step=1): pass\n"
        "print(sorted(m for m in ('torch', 'msprobe') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRECISION_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _run_loop(tmp_path: Path, **extra_env: str) -> tuple[subprocess.CompletedProcess, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    dump = tmp_path / "run"
    config = tmp_path / "msprobe.json"
    section = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}
    config.write_text(json.dumps({"task": "statistics", "level": "L1", "rank": [], "step": [], "statistics": section}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRECISION_") and k != "RANK"}
    env.update(
        PRECISION_DUMP_DIR=str(dump),
        PRECISION_MSPROBE_CONFIG=str(config),
        PRECISION_STEPS="1,2",
        PRECISION_STAGES="actor_update",
        **extra_env,
    )
    proc = subprocess.run(
        [sys.executable, "-c", LOOP, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, dump


@pytest.mark.slow
def test_layout_steps_stages_and_rank_without_a_process_group(tmp_path: Path) -> None:
    proc, dump = _run_loop(tmp_path / "a")
    dumps = sorted(p.relative_to(dump).as_posix() for p in dump.rglob("dump.json"))
    assert dumps == ["step_1/actor_update/step0/rank0/dump.json", "step_2/actor_update/step0/rank0/dump.json"]
    assert "3 actor_update None" in proc.stdout and "1 actor_compute_log_prob None" in proc.stdout
    _, dump_r1 = _run_loop(tmp_path / "b", RANK="1")
    assert sorted(p.parent.name for p in dump_r1.rglob("dump.json")) == ["rank1", "rank1"]
    _, dump_pg = _run_loop(tmp_path / "c", INIT_GROUP="1")
    assert sorted(p.parent.name for p in dump_pg.rglob("dump.json")) == ["rank0", "rank0"]
    assert not list(dump.rglob("proc*")) and not list(dump_r1.rglob("proc*"))


def _stage_loop_project(pytester: pytest.Pytester) -> Path:
    """examples/stage_api_loop copied into a project of its own; returns its train.py."""
    train = pytester.path / "train.py"
    shutil.copy(ROOT / "examples" / "stage_api_loop" / "train.py", train)
    (pytester.path / "scenarios").mkdir()
    text = (ROOT / "examples" / "stage_api_loop" / "scenarios" / "stage_loop.yaml").read_text()
    (pytester.path / "scenarios" / "stage_loop.yaml").write_text(
        text.replace("[python, ", f"[{json.dumps(sys.executable)}, ")
    )
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return train


@pytest.mark.slow
def test_stage_api_loop_example_behind_the_gate(pytester: pytest.Pytester) -> None:
    """examples/stage_api_loop: a loop without verl recorded and then passing, from another project."""
    _stage_loop_project(pytester)
    pytester.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=5)
    check = pytester.runpytest_subprocess()
    check.assert_outcomes(passed=5)
    check.stdout.fnmatch_lines(["5 precision items: 4 identical to golden, 1 within tolerance or compared, 0 failed"])


@pytest.mark.slow
def test_an_edit_to_the_loops_code_is_drift_not_a_stale_golden(pytester: pytest.Pytester) -> None:
    """A regression must never look like a stale golden: the learning rate edited in train.py fails
    actor_update with a statistics verdict, at both steps, and step 2's log-probs, computed from the weights step
    1 updated (their atol scales with the tensor, so a change of order 1e-7 is gated), and nothing asks for a
    re-record."""
    train = _stage_loop_project(pytester)
    pytester.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=5)
    assert "lr=1e-2," in train.read_text()
    train.write_text(train.read_text().replace("lr=1e-2,", "lr=1.0001e-2,"))
    check = pytester.runpytest_subprocess("-rA")
    assert "golden is stale" not in check.stdout.str()
    check.assert_outcomes(passed=2, failed=3)
    check.stdout.fnmatch_lines(
        [
            "actor_update @ step_1, rank0: * of * statistics beyond tolerance (fp32: *)",
            # AdamW's decay factor 1 - lr * weight_decay, a Python scalar L1 records: it moves by 1e-8
            "  first divergence  Tensor.mul_.0.forward.input.1  "
            "Max 0.9999 -> 0.99989999 (rel 1.0e-08, must match exactly)",
            "actor_update @ step_2, rank0: * of * statistics beyond tolerance (fp32: *)",
            "FAILED scenarios/stage_loop.yaml::actor_update[[]step_1[]]*",
            "FAILED scenarios/stage_loop.yaml::actor_update[[]step_2[]]*",
        ]
    )


class _Service:
    @staticmethod
    def _get_current_rank() -> int | None:
        return None  # msprobe's: torch.distributed's rank; no process group here


class _Debugger:
    """A PrecisionDebugger's start as one release declares it; ``started`` records what it was given."""

    def __init__(self) -> None:
        self.service, self.started = _Service(), None

    def start(self, model=None, token_range=None, rank_id=None):  # 26.x
        self.started = (model, rank_id, self.service._get_current_rank())


class _Debugger8x(_Debugger):
    def start(self, model=None, token_range=None):  # 8.x: no rank_id
        self.started = (model, None, self.service._get_current_rank())


def _msprobe(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: version if name == "mindstudio-probe" else real(name))


@pytest.mark.parametrize(
    ("debugger", "version", "started"),
    [(_Debugger, "26.2.0", ("model", 3, None)), (_Debugger8x, "8.3.3", ("model", None, 3))],
    ids=["26.x-rank_id", "8.x-current-rank"],
)
def test_the_debugger_starts_on_the_probes_rank_as_each_release_takes_it(
    monkeypatch: pytest.MonkeyPatch, debugger, version: str, started: tuple
) -> None:
    """26.x takes ``rank_id``; 8.x's start takes none (a TypeError in every run) and reads its service's
    ``_get_current_rank()`` instead, which the guard makes give the probe's rank: ``rank3`` either way."""
    from precision_harness.runs import msprobe_debugger

    _msprobe(monkeypatch, version)
    probe = debugger()
    msprobe_debugger.start(probe, "model", 3)
    assert probe.started == started


def test_a_debugger_without_rank_id_outside_the_8x_line_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from precision_harness.errors import ProbeUnavailableError
    from precision_harness.runs import msprobe_debugger

    _msprobe(monkeypatch, "27.0.0")
    refused = r"^mindstudio-probe 27.0.0: its PrecisionDebugger.start\(\) takes no rank_id .*: pip install '"
    with pytest.raises(ProbeUnavailableError, match=refused):
        msprobe_debugger.start(_Debugger8x(), "model", 3)
