"""The msprobe (mindstudio-probe) behaviours the harness relies on, checked against the installed version.

Each test is named in docs/msprobe.md beside the behaviour it checks; when an msprobe upgrade changes
one, the test that fails says which part of the harness must change with it. Tests that need torch
run it in a subprocess (msprobe's debugger is a process-wide singleton), so collection stays torch-free.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testing import base_data, write_dump

#: the debugger lifecycle as precision_harness/runs/stage_api.py drives it, on a tiny model, reported as JSON
LIFECYCLE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch
    from msprobe.pytorch import PrecisionDebugger

    root, level, rank_id = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    rank_id = None if rank_id == "none" else int(rank_id)
    cfg = root / "config.json"
    section = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}
    config = {"task": "statistics", "level": level, "rank": [], "step": [], "async_dump": False, "statistics": section}
    cfg.write_text(json.dumps(config))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)

    def loss_and_grads():
        model.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return [loss.item()] + [p.grad.flatten().tolist() for p in model.parameters()]

    plain = loss_and_grads()
    dbg = PrecisionDebugger(config_path=str(cfg), dump_path=str(root / "_unused"))
    again = PrecisionDebugger(config_path=str(cfg), dump_path=str(root / "elsewhere"), level="L0")

    def stage(name, reset=True):
        dbg.service.config.dump_path = str(root / name)
        PrecisionDebugger.start(model, rank_id=rank_id) if rank_id is not None else PrecisionDebugger.start(model)
        out = loss_and_grads()
        PrecisionDebugger.stop()
        if reset:
            dbg.service.reset_status()
        return out

    dumped = stage("a")
    stage("b", reset=False)
    stage("c")
    print(json.dumps({
        "singleton": again is dbg,
        "elsewhere_exists": (root / "elsewhere").exists(),
        "dirs": {n: sorted(p.name for p in (root / n / "step0").iterdir()) for n in "abc"},
        "entries": {n: len(json.loads(next((root / n / "step0").glob("*/dump.json")).read_text())["data"])
                    for n in "abc"},
        "same_results": dumped == plain,
        "pid": os.getpid(),
    }))
    """
)


def _lifecycle(tmp_path: Path, *, level: str = "L1", rank_id: str = "0") -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", LIFECYCLE, str(tmp_path), level, rank_id],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_debugger_lifecycle_one_debugger_repointed_per_stage(tmp_path: Path) -> None:
    """Singleton; dump_path re-pointed per stage; rank_id=0 gives rank0; reset_status separates stages;
    without it entries accumulate; at L1 the debugger leaves loss and gradients bit-identical."""
    got = _lifecycle(tmp_path)
    assert got["singleton"] is True and got["elsewhere_exists"] is False  # the second constructor is ignored
    assert got["dirs"] == {"a": ["rank0"], "b": ["rank0"], "c": ["rank0"]}
    assert got["entries"]["a"] == got["entries"]["b"] > 0  # a reset stage starts from an empty cache
    assert got["entries"]["c"] == 2 * got["entries"]["a"]  # no reset after b: c holds b's entries too
    assert got["same_results"] is True


@pytest.mark.slow
def test_debugger_without_rank_id_or_process_group_writes_proc_pid(tmp_path: Path) -> None:
    """Without rank_id and without a process group msprobe names the folder proc<pid> (so the probe passes rank_id)."""
    got = _lifecycle(tmp_path, rank_id="none")
    assert got["dirs"]["a"] == [f"proc{got['pid']}"]


def test_dump_path_pattern_is_the_probes() -> None:
    """The probe checks dump paths against msprobe's own path rule before msprobe rejects them mid-run."""
    from msprobe.core.common.const import FileCheckConst

    from precision_harness.runs.stage_api import MSPROBE_PATH_RE

    assert MSPROBE_PATH_RE.pattern == FileCheckConst.FILE_VALID_PATTERN
    assert not MSPROBE_PATH_RE.match("/tmp/test_x[L1]/run") and not MSPROBE_PATH_RE.match("/tmp/a b")


def _table(tmp_path: Path, mutate=None, golden_mutate=None):
    from precision_harness.check.localize.msprobe_tools import msprobe_table

    golden, target = base_data(), copy.deepcopy(base_data())
    if mutate:
        mutate(target)
    if golden_mutate:
        golden_mutate(golden)
    g = write_dump(tmp_path / "golden", golden)
    t = write_dump(tmp_path / "target", target)
    return msprobe_table(t, g)


def _result(df, prefix: str) -> set[str]:
    return set(df[df["NPU Name"].str.startswith(prefix)]["Result"])


def test_compare_drops_golden_only_rows(tmp_path: Path) -> None:
    """An API only in the golden leaves no row in msprobe's table: the gate checks key sets itself."""
    df = _table(tmp_path, mutate=lambda d: d.pop("Functional.softmax.0.forward"))
    assert not any("softmax" in str(name) for name in list(df["NPU Name"]) + list(df["Bench Name"]))


def test_compare_passes_target_only_rows(tmp_path: Path) -> None:
    """An API only in the new run is a row with Bench N/A and Result pass."""
    extra = copy.deepcopy(base_data()["Functional.softmax.0.forward"])
    df = _table(tmp_path, mutate=lambda d: d.update({"Functional.gelu.0.forward": extra}))
    rows = df[df["NPU Name"].str.startswith("Functional.gelu.0.forward")]
    assert len(rows) > 0 and set(rows["Bench Name"]) == {"N/A"} and set(rows["Result"]) == {"pass"}


def test_compare_result_column_only_looks_at_norm(tmp_path: Path) -> None:
    """Max x3 on an output passes msprobe's Result; Norm x1.6 is an error: msprobe's Result is not the gate."""

    def scale(stat: str, factor: float):
        def mutate(d):
            out = d["Functional.softmax.0.forward"]["output"][0]
            out[stat] *= factor

        return mutate

    out = "Functional.softmax.0.forward.output.0"
    assert _result(_table(tmp_path / "max", scale("Max", 3.0)), out) == {"pass"}
    assert _result(_table(tmp_path / "norm", scale("Norm", 1.6)), out) == {"error"}


def test_compare_nan_where_golden_is_finite_is_an_error(tmp_path: Path) -> None:
    def mutate(d):
        d["Functional.linear.0.forward"]["output"][0]["Max"] = math.nan

    assert "error" in _result(_table(tmp_path, mutate), "Functional.linear.0.forward")


def test_in_memory_compare_imports_no_torch(tmp_path: Path) -> None:
    """The torch-free compare (msprobe.core.compare pieces) keeps the pytest process light."""
    golden, target = write_dump(tmp_path / "g", base_data()), write_dump(tmp_path / "t", base_data())
    code = (
        "import sys; from pathlib import Path; "
        "from precision_harness.check.localize.msprobe_tools import msprobe_table; "
        f"df = msprobe_table(Path({str(target)!r}), Path({str(golden)!r})); "
        "print(len(df), sorted(m for m in ('torch', 'msprobe.pytorch') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "[]" and int(proc.stdout.split()[0]) > 0


def test_diff_analyzer_needs_rank_folders(tmp_path: Path) -> None:
    """DiffAnalyzer names the first diff in rank<r> folders; in proc<pid> folders the same drift goes unreported."""
    from precision_harness.check.localize.msprobe_tools import first_diff

    def drift(d):
        d["Functional.linear.0.forward"]["output"][0]["Norm"] *= 3

    found = {}
    for rank in ("rank0", "proc123"):
        g, t = copy.deepcopy(base_data()), copy.deepcopy(base_data())
        drift(t)
        write_dump(tmp_path / rank / "golden", g, rank=rank)
        write_dump(tmp_path / rank / "target", t, rank=rank)
        found[rank] = first_diff(tmp_path / rank / "target", tmp_path / rank / "golden", tmp_path / rank / "out")
    assert found == {"rank0": {"rank0": "Functional.linear.0.forward"}, "proc123": {}}


def test_graph_builder_needs_a_module_tree(tmp_path: Path) -> None:
    """At L1 construct.json is {}: GraphBuilder cannot build a graph, so graphs are built for L0/mix only."""
    from precision_harness.check.localize.msprobe_tools import GRAPH_LEVELS, build_graphs

    write_dump(tmp_path / "stage", base_data())
    with pytest.raises(Exception):  # noqa: B017 - msprobe raises its own RuntimeError subclass or RuntimeError
        build_graphs(tmp_path / "stage", tmp_path / "graph")
    assert "L1" not in GRAPH_LEVELS


FAILED_START = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    from msprobe.core.common.runtime import Runtime
    from msprobe.pytorch import PrecisionDebugger

    root = Path(sys.argv[1])
    cfg = root / "config.json"
    section = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}
    cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "rank": [], "step": [], "statistics": section}))
    dbg = PrecisionDebugger(config_path=str(cfg), dump_path=str(root / "ok"))
    dbg.service.config.dump_path = str(root / "bad[L1]")
    model = torch.nn.Linear(2, 2)
    try:
        PrecisionDebugger.start(model, rank_id=0)
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    running_after_failure = Runtime.is_running
    PrecisionDebugger.stop()
    print(json.dumps({"raised": raised, "running": running_after_failure, "after_stop": Runtime.is_running}))
    """
)


@pytest.mark.slow
def test_failed_start_leaves_the_runtime_running_until_stop(tmp_path: Path) -> None:
    """A start() that fails (here: a dump path msprobe rejects) leaves msprobe marked as running; stop() clears it.

    The probe therefore stops in a ``finally`` whatever happened.
    """
    proc = subprocess.run(
        [sys.executable, "-c", FAILED_START, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["raised"] is not None and got["running"] is True and got["after_stop"] is False


THREAD_MEAN = textwrap.dedent(
    """
    import json, torch
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(1))
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out[threads] = [x.mean().item(), x.norm().item(), x.max().item()]
    print(json.dumps(out))
    """
)


def test_torch_mean_of_large_tensors_depends_on_the_thread_count() -> None:
    """msprobe's Mean is torch.mean: on 2**20 elements 1 and 2 threads sum in another order; Norm and Max do not.

    This is why scenarios pin ``trainer.num_threads`` and Mean is judged against the RMS.
    """
    proc = subprocess.run([sys.executable, "-c", THREAD_MEAN], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    (mean1, norm1, max1), (mean2, norm2, max2) = got["1"], got["2"]
    rms = norm1 / (1 << 20) ** 0.5
    assert mean1 != mean2 and abs(mean1 - mean2) < 1e-6 * rms  # far below any relative tolerance on the RMS
    assert (norm1, max1) == (norm2, max2)
