"""Issue 52: where FSDP2's all-gather buffer ran without the zero-fill (a torch whose allocation patch 6 does not
know), the run proceeds, records so in its env, and the compare leaves the buffer's Tensor.narrow rows out: found by
the run's stack.json (the calls made in torch's all_gather_copy_in), counted in the coverage ledger under a declared
reason and named in the verdict's one line, with not_filled()'s reason. A filled run compares them as every row; a
Tensor.narrow made elsewhere is compared either way.

Synthetic two-rank dumps through check_items (the path the pytest items and `precision-harness compare` take); no
verl run, torch is not imported."""

from __future__ import annotations

import copy
import json
import runpy
from pathlib import Path
from typing import Any

import pytest
from harness_testing import api, tensor, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.coverage import UNFILLED
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import Outcome, check_items, items_of
from precision_harness.dumps.call_site import calls_made_in
from precision_harness.goldens.golden import Golden
from precision_harness.runs.host import rank_env
from precision_harness.runs.verl import fsdp2_buffers

STAGE = "actor_update"
MODULE = fsdp2_buffers.MODULES[0]
TORCH_2_4 = "2.4.1"
UNFILLED_ENV = {
    "torch": TORCH_2_4,
    fsdp2_buffers.ENV_MODULE: MODULE,
    fsdp2_buffers.ENV_FILL: fsdp2_buffers.NOT_FILLED,
}
FILLED_ENV = {"torch": "2.13.0", fsdp2_buffers.ENV_MODULE: MODULE, fsdp2_buffers.ENV_FILL: fsdp2_buffers.ALLOC_MIXIN}
COLLECTIVES = f"/venv/lib/python3.11/site-packages/{MODULE.replace('.', '/')}.py"
#: where each call was made, innermost frame first, as msprobe's stack.json has it
FRAMES = {
    "Tensor.narrow.0.forward": [
        f"File {COLLECTIVES}, line 330, in all_gather_copy_in_cuda, \n all_gather_input = all_gather_output.narrow(",
        f"File {COLLECTIVES}, line 250, in foreach_all_gather, \n all_gather_input, all_gather_output = ...",
    ],
    "Tensor.narrow.1.forward": [
        "File /venv/lib/python3.11/site-packages/transformers/models/qwen2/modeling_qwen2.py, line 90, in forward, \n"
        " half = hidden.narrow(-1, 0, 4)",
    ],
}


def _narrow(buffer: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    scalars = [{"type": "int", "value": 0}, {"type": "int", "value": 8}, {"type": "int", "value": 8}]
    return api([buffer, *scalars], [out])


def _data(garbage: bool = False, model_narrow: float = 0.5) -> dict[str, Any]:
    """A rank's L1 dump: FSDP2's copy-in narrow of its all-gather buffer (zeros where filled, leftovers where not),
    the linear that reads the gathered weight, and a narrow of the model's own."""
    zeros = tensor(shape=(16,), Max=0.0, Min=0.0, Mean=0.0, Norm=0.0)
    leftovers = tensor(shape=(16,), Max=3.1e38, Min=-2.2e38, Mean=float("nan"), Norm=float("inf"))
    return {
        "Tensor.narrow.0.forward": _narrow(leftovers if garbage else zeros, tensor(shape=(8,), Max=0.0, Min=0.0)),
        "Functional.linear.0.forward": api(
            [tensor(shape=(2, 8)), tensor(shape=(8, 8))], [tensor(shape=(2, 8), Max=3.0, Min=-2.5, Norm=12.5)]
        ),
        "Tensor.narrow.1.forward": api([tensor(shape=(2, 8))], [tensor(shape=(2, 4), Max=model_narrow)]),
    }


def _side(root: Path, data: dict[str, Any], env: dict[str, Any] | None) -> Path:
    """A run folder of two ranks (each with msprobe's stack.json) and its run.json's env."""
    for rank in ("rank0", "rank1"):
        dump = write_dump(root / "step_1" / STAGE, copy.deepcopy(data), rank)
        stack = {str(i): [[call], frames] for i, (call, frames) in enumerate(FRAMES.items())}
        (dump.parent / "stack.json").write_text(json.dumps(stack), encoding="utf-8")
    (root / "run.json").write_text(json.dumps({"scenario": "fsdp2", "level": "L1", "env": env}), encoding="utf-8")
    return root


def _check(tmp_path: Path, run: tuple[dict, dict | None], golden: tuple[dict, dict | None]) -> Outcome:
    target = _side(tmp_path / "run", *run)
    recorded = Golden.from_run_dir(_side(tmp_path / "golden", *golden))
    assert not any(name.endswith("stack.json") for name in recorded.manifest["files"])  # goldens keep none
    settings = CheckSettings(scenario="fsdp2", policy=TolerancePolicy(), msprobe=False)
    [(_, out)] = check_items(target, recorded, [k for k in items_of(target, recorded) if not k.is_metrics], settings)
    return out


def test_an_unfilled_run_leaves_the_buffers_rows_out_names_them_and_passes(tmp_path: Path) -> None:
    out = _check(tmp_path, (_data(garbage=True), UNFILLED_ENV), (_data(), FILLED_ENV))
    assert out.passed, out.text
    reason = fsdp2_buffers.not_filled(TORCH_2_4, MODULE)
    line = (
        "  unfilled          10 Tensor.narrow row(s) not compared (rank0 Tensor.narrow.0.forward.input.0, "
        f"rank0 Tensor.narrow.0.forward.input.1, rank0 Tensor.narrow.0.forward.input.2, ... and 7 more): {reason}"
    )
    assert line in out.text.splitlines()
    assert out.text.startswith(f"{STAGE} @ step_1, rank0, rank1: 40 statistics within tolerance")  # the other calls'
    # per rank: the buffer, three scalar arguments and the narrowed output, four statistics each as msprobe's rows
    # hold them; half of what the golden holds
    ledger = out.ledger.to_json()
    assert ledger["rows"] == {"held": 20, "compared": 10, "not_compared": {UNFILLED: 10}}
    assert ledger["statistics"] == {"held": 80, "compared": 40, "not_compared": {UNFILLED: 40}}
    assert not out.ledger.dropped  # a declared reason: shown, the gate stays green
    assert out.ledger.line("fsdp2").endswith(f"not compared: rows: 10 {UNFILLED}; statistics: 40 {UNFILLED}")


def test_the_same_dumps_from_a_filled_run_compare_the_buffers_rows(tmp_path: Path) -> None:
    out = _check(tmp_path, (_data(garbage=True), FILLED_ENV), (_data(), FILLED_ENV))
    assert not out.passed
    assert "Tensor.narrow.0.forward.input.0" in out.text and "unfilled" not in out.text
    assert out.ledger is not None and UNFILLED not in out.ledger.to_json()["rows"]["not_compared"]


def test_a_golden_recorded_unfilled_leaves_the_rows_out_for_its_run_too(tmp_path: Path) -> None:
    out = _check(tmp_path, (_data(), FILLED_ENV), (_data(garbage=True), UNFILLED_ENV))
    assert out.passed, out.text
    assert f"the golden's run: {fsdp2_buffers.not_filled(TORCH_2_4, MODULE)}" in out.text


def test_a_narrow_made_outside_the_all_gather_copy_in_is_compared_in_an_unfilled_run(tmp_path: Path) -> None:
    out = _check(tmp_path, (_data(garbage=True, model_narrow=0.9), UNFILLED_ENV), (_data(), FILLED_ENV))
    assert not out.passed
    assert {d.tensor for d in out.verdict.drifts} == {"Tensor.narrow.1.forward.output.0"}
    assert out.ledger.to_json()["rows"]["not_compared"] == {UNFILLED: 10}
    assert "10 Tensor.narrow row(s) not compared" in out.text


def test_a_changed_code_path_leaves_the_buffers_rows_out_too(tmp_path: Path) -> None:
    """The calls differ (a call inserted): the rank is compared row by row, and leaves the same rows out. The inserted
    call is not one of msprobe 26.x's low-risk APIs (a ``clone`` would be a recording difference, not a code path)."""
    run = _data(garbage=True)
    run = {"Tensor.__mul__.0.forward": api([tensor(shape=(2, 8))], [tensor(shape=(2, 8))]), **run}
    out = _check(tmp_path, (run, UNFILLED_ENV), (_data(), FILLED_ENV))
    assert out.passed and out.verdict.code_paths, out.text
    assert out.verdict.unfilled[:1] == [("rank0", "Tensor.narrow.0.forward.input.0")]
    ledger = out.ledger.to_json()
    assert ledger["rows"]["not_compared"] == {UNFILLED: 10} and ledger["statistics"]["not_compared"] == {UNFILLED: 40}


@pytest.mark.parametrize(
    ("function", "found"),
    [
        ("all_gather_copy_in_cuda", True),  # torch 2.5 to 2.14's kernel
        ("all_gather_copy_in_npu", True),  # torch_npu's
        ("_all_gather_copy_in_zeroed", True),  # the gate's, in a filled run beside an unfilled golden
        ("foreach_all_gather", True),  # torch 2.4 narrows the buffer inline
        ("foreach_all_gather_copy_out", False),
        ("forward", False),
    ],
)
def test_the_buffers_narrows_are_read_from_the_innermost_frame_outside_msprobe(
    tmp_path: Path, function: str, found: bool
) -> None:
    from precision_harness.check.compare.unfilled import API, FUNCTIONS

    frames = [
        "File /venv/lib/python3.11/site-packages/msprobe/pytorch/hook_module/wrap.py, line 80, in forward, \n x",
        f"File {COLLECTIVES}, line 330, in {function}, \n out = buffer.narrow(0, 0, 8)",
    ]
    (tmp_path / "stack.json").write_text(json.dumps({"0": [["Tensor.narrow.3.forward"], frames]}))
    assert calls_made_in(tmp_path, API, FUNCTIONS) == ({"Tensor.narrow.3.forward"} if found else set())


def test_each_verl_rank_records_its_fill_and_the_environment_diff_does_not_show_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECISION_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(fsdp2_buffers, "installed_layout", lambda: (MODULE, None))  # torch 2.4's layout
    runpy.run_module("precision_harness.runs.verl.rank_stack")  # as verl imports it in each process
    record = rank_env.read(tmp_path)[1]
    assert {k: record[k] for k in (fsdp2_buffers.ENV_MODULE, fsdp2_buffers.ENV_FILL)} == {
        fsdp2_buffers.ENV_MODULE: MODULE,
        fsdp2_buffers.ENV_FILL: fsdp2_buffers.NOT_FILLED,
    }
    assert fsdp2_buffers.unfilled_reason(record) == fsdp2_buffers.not_filled(record["torch"], MODULE)
    monkeypatch.setattr(fsdp2_buffers, "installed_layout", lambda: (MODULE, fsdp2_buffers.ALLOC_MIXIN))
    assert fsdp2_buffers.fill_record()[fsdp2_buffers.ENV_FILL] == fsdp2_buffers.ALLOC_MIXIN
    assert fsdp2_buffers.unfilled_reason(FILLED_ENV) is None and fsdp2_buffers.unfilled_reason({}) is None
    # a golden recorded before the record was kept: nothing differs
    assert not EnvironmentDiff.between({"torch": "2.13.0"}, FILLED_ENV)
