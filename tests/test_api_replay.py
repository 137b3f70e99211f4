"""The replay (runs/api_replay) and what check/rerun/replay.py decides before it runs.

- which APIs can be replayed, from their names (torch-free);
- the worker on a real ``task: tensor`` capture written by msprobe in a subprocess: a linear replayed, a
  dropout refused with its reason, a fused NPU op through msprobe's own CPU bench function;
- msprobe's internals behind one version guard;
- the calls picked for a capture, and a capture that cannot be judged: not reproduced, or other inputs.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness_testing import base_data, patching_site, tensor, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.localize.drift_origin import classify
from precision_harness.check.rerun import replay
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps.rows import rows
from precision_harness.dumps.stage import DirStage
from precision_harness.runs import isolated
from precision_harness.runs.api_replay import launch, msprobe_acc, names
from precision_harness.runs.warm import shared as warm_shared
from precision_harness.runs.warm import workers as warm


@pytest.mark.parametrize(
    ("api", "why"),
    [
        ("Functional.linear.0.forward", None),
        ("Tensor.__mul__.23.forward", None),
        ("Torch.matmul.3.forward", None),
        ("Aten.mm.default.0.forward", None),
        ("NPU.npu_rms_norm.0.forward", None),
        ("Distributed.all_reduce.0.forward", "a collective: its result is made of the other ranks' data"),
        ("Functional.dropout.2.forward", "dropout draws random numbers"),
        ("Torch.multinomial.0.forward", "multinomial draws random numbers"),
        ("Tensor.to.0.forward", "to allocates or copies: nothing to recompute"),
        ("Functional.linear.0.backward", "a backward call: msprobe's dump does not say which"),
        ("Module.lm_head.Linear.forward.0", "a module, not an API"),
        ("Stage.loss.0.forward", "a value the runner computes for level: auto"),
        ("MindSpeed.npu_rotary.0.forward", "MindSpeed APIs have no CPU replay"),
    ],
)
def test_what_can_be_replayed_is_read_from_the_name(api: str, why: str | None) -> None:
    found = names.why_not_replayable(api)
    assert (found is None) if why is None else (found is not None and found.startswith(why)), found


def test_another_msprobe_version_is_refused_with_the_module_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    assert msprobe_acc.version_problem() is None  # the installed one is one of those read
    for read in ("26.0.0", "26.1.0.post1", "26.2.0"):
        monkeypatch.setattr(msprobe_acc.metadata, "version", lambda name, v=read: v)
        assert msprobe_acc.version_problem() is None, read
    for other in ("27.0.0", "26.3.0", "8.3.3"):
        monkeypatch.setattr(msprobe_acc.metadata, "version", lambda name, v=other: v)
        problem = msprobe_acc.version_problem()
        assert problem is not None
        assert problem.startswith(f"mindstudio-probe {other}: the replay reads msprobe's acc_check")
        assert "of 26.0.0 to 26.2.x (precision_harness/runs/api_replay/msprobe_acc.py)" in problem
        assert "pip install 'mindstudio-probe>=26.0.0,<26.3'" in problem and "\n" not in problem


CAPTURE = r"""
import json, os, sys, torch
from msprobe.pytorch import PrecisionDebugger
out = sys.argv[1]
calls = ["Functional.linear.1.forward", "Functional.dropout.0.forward"]
cfg = {"task": "tensor", "dump_path": out, "rank": [], "step": [], "level": "L1", "async_dump": False,
       "tensor": {"scope": [], "list": calls, "data_mode": ["all"], "summary_mode": "statistics"}}
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "config.json"), "w") as fh:
    json.dump(cfg, fh)
debugger = PrecisionDebugger(config_path=os.path.join(out, "config.json"))
torch.manual_seed(0)
x, w, b = torch.randn(8, 18, 32), torch.randn(16, 32) * 0.2, torch.randn(16)
debugger.start(None, rank_id=0)
x = torch.nn.functional.linear(x, torch.eye(32))  # Functional.linear.0: counted, not listed, not collected
y = torch.nn.functional.linear(x, w, b)
z = torch.nn.functional.dropout(y, 0.1, training=True)
debugger.stop()
debugger.service.reset_status()
"""

NPU_CALL = r"""
import json, sys, torch
from pathlib import Path
from precision_harness.runs.api_replay import msprobe_acc
rank = Path(sys.argv[1]); (rank / "dump_tensor_data").mkdir(parents=True)
torch.manual_seed(0)
x, gamma = torch.randn(4, 64).bfloat16(), torch.rand(64).bfloat16() + 0.5
out = msprobe_acc.bench_function("npu_rms_norm")(x, gamma, epsilon=1e-6)[0]
def entry(t, name):
    torch.save(t, rank / "dump_tensor_data" / name)
    return {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape), "Max": float(t.max()),
            "Min": float(t.min()), "Mean": float(t.float().mean()), "Norm": float(t.float().norm()),
            "requires_grad": False, "data_name": name}
api = "NPU.npu_rms_norm.0.forward"
data = {api: {"input_args": [entry(x, api + ".input.0.pt"), entry(gamma, api + ".input.1.pt")],
              "input_kwargs": {"epsilon": {"type": "float", "value": 1e-6}},
              "output": [entry(out, api + ".output.0.pt")]}}
(rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": data}))
"""


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rank folder msprobe wrote with ``task: tensor`` for the second linear and a dropout."""
    out = tmp_path_factory.mktemp("capture")
    proc = subprocess.run([sys.executable, "-c", CAPTURE, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "step0" / "rank0"


def test_the_worker_replays_a_captured_linear_and_says_why_not_a_dropout(capture: Path, tmp_path: Path) -> None:
    # only the listed calls, numbered as a full dump numbers them (the unlisted first linear counts)
    assert list(json.loads((capture / "dump.json").read_text())["data"]) == [
        "Functional.linear.1.forward",
        "Functional.dropout.0.forward",
    ]
    assert {p.name.rsplit(".", 4)[0] for p in (capture / "dump_tensor_data").iterdir()} == {
        "Functional.linear.1",
        "Functional.dropout.0",
    }
    calls = [
        {"api": "Functional.linear.1.forward", "output": "Functional.linear.1.forward.output.0"},
        {"api": "Functional.dropout.0.forward", "output": "Functional.dropout.0.forward.output.0"},
        {"api": "Functional.softmax.0.forward", "output": "Functional.softmax.0.forward.output.0"},
    ]
    linear, dropout, missing = launch.replay_calls(capture, calls, out_dir=tmp_path, timeout=300)
    assert linear["replayable"] and linear["dtype"] == "torch.float32" and linear["numel"] == 8 * 18 * 16
    # the captured output is the CPU's own fp32 linear, replayed by the same kernel: the standard holds
    assert linear["standard"]["passed"] and linear["standard"]["msprobe"] == {"benchmark": "pass", "ulp": "pass"}
    assert 0 < linear["new"]["max_abs"] < 1e-5 and linear["reference"]["Norm"] > 0
    assert not dropout["replayable"] and dropout["reason"].startswith("dropout draws random numbers")
    assert missing == {
        **calls[2],
        "api": calls[2]["api"],
        "replayable": False,
        "reason": f"the capture holds no {calls[2]['api']}",
    }
    assert (tmp_path / launch.ANSWER).is_file() and (tmp_path / launch.LOG).is_file()


def test_the_reference_is_torchs_own_where_the_run_patched_the_api(
    capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's PYTHONPATH holds a sitecustomize that patches ``torch.nn.functional.linear`` to compute 1e-4 off:
    the float64 replay, asked for warm where this test session's shared warm servers are up, is torch's own linear,
    so the captured output, which torch's own linear computed, meets its standard. Before: the replay was forked
    from a server that had loaded the patch (a fresh one inherited it too), and held torch's output 1e-4 away from
    its reference."""
    monkeypatch.setenv("PYTHONPATH", str(patching_site(tmp_path / "site", "linear")))
    call = {"api": "Functional.linear.1.forward", "output": "Functional.linear.1.forward.output.0"}
    (linear,) = launch.replay_calls(capture, [call], out_dir=tmp_path / "replay", timeout=300, warm=True)
    assert linear["replayable"] and linear["standard"]["passed"], linear
    assert 0 < linear["new"]["max_abs"] < 1e-5


def test_a_fused_npu_op_is_replayed_through_msprobes_cpu_bench_function(tmp_path: Path) -> None:
    """npu_rms_norm's output (here msprobe's own bench function in bf16) against its float64 replay."""
    rank = tmp_path / "step0" / "rank0"
    proc = subprocess.run([sys.executable, "-c", NPU_CALL, str(rank)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    call = {"api": "NPU.npu_rms_norm.0.forward", "output": "NPU.npu_rms_norm.0.forward.output.0"}
    (result,) = launch.replay_calls(rank, [call], out_dir=tmp_path / "replay", timeout=300)
    assert result["replayable"], result.get("reason")
    assert result["dtype"] == "torch.bfloat16" and result["standard"]["passed"], result["standard"]


def test_no_warm_server_that_loaded_start_up_code_serves_the_replay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The session's own warm server (no shared ones) started from an environment with a PYTHONPATH imported what is
    there at start-up: the replay is not forked from it."""
    monkeypatch.delenv(warm_shared.DIR_ENV, raising=False)
    monkeypatch.setattr(warm, "_server_env", {"OMP_NUM_THREADS": "1"})
    monkeypatch.setattr(warm, "_server_start_up", isolated.start_up_code({"PYTHONPATH": "/somewhere/patches"}))
    assert warm._server_start_up == "PYTHONPATH=/somewhere/patches" and warm.started() is None
    monkeypatch.setattr(warm, "_server_start_up", isolated.start_up_code({}))
    assert warm.started() is not None
    monkeypatch.setenv(warm_shared.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(warm_shared.OWNER_ENV, str(os.getpid()))
    assert warm.started() == warm_shared.SharedServers(tmp_path.resolve(), os.getpid())
    monkeypatch.setenv("PYTHONPATH", "/somewhere/patches")
    assert warm.started() is None  # shared servers: one for this environment would load it too


def test_a_failing_worker_is_one_line_naming_its_log(tmp_path: Path) -> None:
    from precision_harness.errors import RunFailedError

    with pytest.raises(RunFailedError, match=r"^the replay worker exited with 1 \(log: .*replay\.log\)$"):
        launch.replay_calls(tmp_path / "no_such_rank", [], out_dir=tmp_path, timeout=300)


# --- what check/rerun/replay.py decides before and after the capture ------------------------------------------------

SETTINGS = CheckSettings(scenario="s", policy=TolerancePolicy())


def test_the_calls_captured_are_the_api_then_the_next_ones_whose_inputs_match(tmp_path: Path) -> None:
    """linear's output moves (its inputs match): judged first. softmax reads it (its input moved): not a call.
    A later gelu whose input matches and whose output moved: the next call."""

    def make(side: str, moved: bool) -> DirStage:
        data = base_data()
        data["Functional.gelu.0.forward"] = {
            "input_args": [tensor(Max=2.0)],
            "input_kwargs": {},
            "output": [tensor(Max=1.9 if moved else 1.8)],
        }
        if moved:
            data["Functional.linear.0.forward"]["output"][0].update(Max=3.5)
            data["Functional.softmax.0.forward"]["input_args"][0].update(Max=3.5)
            data["Functional.softmax.0.forward"]["output"][0].update(Max=0.95)
        write_dump(tmp_path / side / "step_1" / "actor_update", data)
        return DirStage(tmp_path / side / "step_1" / "actor_update")

    golden, target = make("golden", False), make("target", True)
    verdict = compare_stage(target, golden, SETTINGS)
    origin = classify(verdict, target)
    assert origin is not None
    calls = replay.calls_to_judge(verdict, origin, target)
    assert calls == [
        replay.Call("Functional.linear.0.forward", "Functional.linear.0.forward.output.0"),
        replay.Call("Functional.gelu.0.forward", "Functional.gelu.0.forward.output.0"),
    ]


def _rows(mutate=None) -> dict:
    data = copy.deepcopy(base_data())
    if mutate:
        mutate(data)
    return rows({"data": data})


def test_a_capture_that_did_not_reproduce_the_checked_run_is_not_deterministic() -> None:
    checked = _rows(lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.5))
    rerun = _rows(lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.6))
    why = replay._unconfirmed("Functional.linear.0.forward", rerun, checked, _rows())
    assert why == (
        "not deterministic: the capture rerun's Functional.linear.0.forward.output.0 differs from the checked run's"
    )


def test_a_call_whose_inputs_are_not_the_goldens_has_no_common_reference() -> None:
    moved = _rows(lambda d: d["Functional.linear.0.forward"]["input_args"][1].update(Norm=2.5))
    why = replay._unconfirmed("Functional.linear.0.forward", moved, moved, _rows())
    assert why == (
        "its inputs differ from the golden's (first: Functional.linear.0.forward.input.1): no common float64 reference"
    )
    same = _rows(lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.5))
    assert replay._unconfirmed("Functional.linear.0.forward", same, same, _rows()) is None
    assert json.dumps(replay._unconfirmed("Functional.gelu.0.forward", same, same, _rows())).startswith(
        '"the capture rerun did not call'
    )


def _gather(index: dict, dim: dict | None = None, kwarg: str = "input_kwargs") -> dict:
    """A ``Torch.gather`` call, its int64 ``index`` a keyword argument (as the log-prob gather passes it)."""
    call = {"input_args": [tensor(shape=(2, 4, 8))], "input_kwargs": {}, "output": [tensor(shape=(2, 4, 1))]}
    call[kwarg] = {"dim": dim or {"type": "int", "value": -1}, "index": index}
    return {"Torch.gather.0.forward": call}


INDEX = tensor("torch.int64", (2, 4, 1), 9, 0, None, None)


def test_an_integer_input_matched_by_max_and_min_is_named_unproven() -> None:
    """Issue 36: each row's labels rotated by one position keep the index's Max and Min, all msprobe records of an
    int64 tensor. Confirmed (nothing differs), but not proven: the judgement names that input."""
    golden = rows({"data": _gather(INDEX)})
    assert replay._unconfirmed("Torch.gather.0.forward", golden, golden, golden) is None
    assert replay._unproven("Torch.gather.0.forward", golden, golden) == (
        "Torch.gather.0.forward.input.index",
        "torch.int64",
    )
    proven = {**INDEX, "md5": "1a2b3c4d"}  # summary_mode: md5 on both sides: the CRC-32 proves it
    both = rows({"data": _gather(proven)})
    assert replay._unproven("Torch.gather.0.forward", both, both) is None
    other = rows({"data": _gather({**INDEX, "md5": "99999999"})})
    assert replay._unconfirmed("Torch.gather.0.forward", other, other, both).startswith(
        "its inputs differ from the golden's (first: Torch.gather.0.forward.input.index)"
    )
    assert replay._unproven("Functional.linear.0.forward", _rows(), _rows()) is None  # float inputs: statistics


def test_a_tensor_capture_of_an_integer_input_is_not_read_as_nondeterminism() -> None:
    """msprobe's task: tensor capture names a tensor keyword argument ``kwargs.index`` and records Mean and Norm
    of an int64 tensor, which a statistics dump names ``input.index`` and leaves out. Before: "not deterministic"."""
    checked = rows({"data": _gather(INDEX)})
    captured_index = {**INDEX, "Mean": 4.5, "Norm": 30.0, "data_name": "Torch.gather.0.forward.kwargs.index.pt"}
    captured = rows({"data": _gather(captured_index)})
    renamed = {name.replace(".input.index", ".kwargs.index"): row for name, row in captured.items()}
    assert replay._unconfirmed("Torch.gather.0.forward", renamed, checked, checked) is None


def test_arguments_msprobe_records_by_value_are_compared_by_value() -> None:
    """Integers, text and dtypes: a ``dim`` of 1 for -1, or ``dtype=torch.float16`` for ``torch.float32`` (whose
    statistics msprobe leaves empty) are other calls."""
    golden = rows({"data": _gather(INDEX)})
    for dim in ({"type": "int", "value": 1}, {"type": "str", "value": "-1"}):
        moved = rows({"data": _gather(INDEX, dim)})
        why = replay._unconfirmed("Torch.gather.0.forward", moved, moved, golden)
        assert why is not None and why.startswith(
            "its inputs differ from the golden's (first: Torch.gather.0.forward.input.dim)"
        )

    def softmax(dtype: str) -> dict:
        call = {"input_args": [tensor()], "input_kwargs": {"dtype": {"type": "torch.dtype", "value": dtype}}}
        return rows({"data": {"Functional.softmax.0.forward": {**call, "output": [tensor()]}}})

    why = replay._unconfirmed(
        "Functional.softmax.0.forward", softmax("torch.float16"), softmax("torch.float16"), softmax("torch.float32")
    )
    assert why is not None and "Functional.softmax.0.forward.input.dtype" in why


def test_an_output_of_another_shape_holds_back_the_side_by_side_verdict() -> None:
    """Issue 36: an output whose shape differs from the golden's has no common standard: never equivalent."""
    golden = _rows()
    reshaped = _rows(lambda d: d["Functional.linear.0.forward"]["output"][0].update(shape=[8, 8]))
    call = replay.Call("Functional.linear.0.forward", "Functional.linear.0.forward.output.0")
    why = replay._not_proven(call, reshaped, golden)
    assert why == "Functional.linear.0.forward.output.0 has shape [8, 8], the golden's [2, 4, 8]: no common standard"
    assert replay._not_proven(call, golden, golden) is None


def test_a_golden_input_missing_from_the_capture_is_noticed() -> None:
    golden = rows({"data": _gather(INDEX)})
    captured = {name: row for name, row in golden.items() if not name.endswith(".index")}
    why = replay._unconfirmed("Torch.gather.0.forward", captured, captured, golden)
    assert why == (
        "the golden's call has Torch.gather.0.forward.input.index, which the capture does not: not the golden's call"
    )


def test_a_second_stage_of_the_run_is_not_rerun_and_says_which_stage_was(dumps, tmp_path: Path) -> None:
    """One capture rerun per scenario and run: a later stage whose API could be replayed points to the first."""
    from precision_harness.check.item_key import ItemKey
    from precision_harness.check.verdicts.items import check_stage

    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=3.5))
    out = check_stage(DirStage(target), DirStage(golden), SETTINGS)

    def never_run(*args, **kwargs):
        raise AssertionError("no capture rerun for a stage that is not the run's first")

    settings = replay.ReplaySettings(tmp_path / "judge", never_run)
    request = replay.JudgeRequest(
        None, ItemKey(2, "actor_update"), replay.StagePair(DirStage(target), DirStage(golden)), settings
    )  # type: ignore[arg-type]
    judged = replay.judge_outcome(out, request, claim=lambda: ItemKey(1, "actor_compute_log_prob"))
    assert judged.judgement is not None and judged.judgement.verdict.value == "undecided"
    assert judged.judgement.reason == (
        "not replayed: actor_compute_log_prob @ step_1 was this run's replayed stage "
        "(rerun this item alone to judge it)"
    )
    assert judged.text.splitlines()[2].startswith("  judgement         undecided at API Functional.linear.0.forward")


def test_a_tensor_task_must_name_its_apis_in_one_line(tmp_path: Path) -> None:
    from harness_testing import TINY

    from precision_harness.errors import ScenarioError
    from precision_harness.scenarios.scenario import Scenario

    scenario = Scenario.load(TINY)
    task = "global_profiler.global_tool_config.precision_debugger.task"
    with pytest.raises(ScenarioError) as err:
        scenario.with_overrides({task: "tensor"}, directory=tmp_path)
    assert "\n" not in str(err.value) and str(err.value).endswith(
        f"{task}: tensor saves every tensor it collects; name the APIs in "
        "global_profiler.global_tool_config.precision_debugger.list (e.g. [Functional.linear.0.forward]) "
        "or use task: statistics"
    )
    capture = scenario.with_overrides(
        scenario.capture_overrides(2, "actor_update", ["Functional.linear.3.forward"]), directory=tmp_path, tag="c"
    )
    config = capture.msprobe_config()
    assert config["task"] == "tensor" and config["tensor"]["list"] == ["Functional.linear.3.forward"]
    assert capture.steps == (2,) and capture.stages == ("actor_update",) and capture.total_steps == 2
    assert capture.folder == TINY.parent  # a variant reads its relative paths where its original lies
