"""The stack matrix's torch rows (issue 52), without building a torch release: what each row runs with, which rows
verl's scenario gets, and which rows a run reads from an earlier one.

The rows themselves (a 3 GB venv per release, verl's run for minutes) run from ``benchmarks/stack_matrix.py``;
docs/stacks.md holds their figures. Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import stack_matrix  # noqa: E402
import torch_matrix  # noqa: E402

#: the rows read verl's installed metadata; verl itself (and torch) is never imported here
pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="the [verl] extra installs verl 0.9.1")


def _rows(version: str, monkeypatch, how=lambda name: "run") -> tuple[list[stack_matrix.Row], list[tuple]]:
    """``version``'s rows with the release's venv and each gate run replaced by a record of what would run."""
    ran: list[tuple] = []
    monkeypatch.setattr(torch_matrix.torch_releases, "venv_python", lambda v: Path(f"/venv-{v}/bin/python"))
    monkeypatch.setattr(torch_matrix.torch_releases, "overlay", lambda python: Path("/overlay"))

    def run_gate(stack, settings):
        ran.append((stack.name, stack.paths, settings.gate, stack_matrix.environment(stack)["PYTHONPATH"]))
        return stack_matrix.Row(stack.name, stack.kind, stack.version, "ran", passed=1)

    monkeypatch.setattr(stack_matrix, "run_gate", run_gate)
    return torch_matrix.run_torch_rows(version, stack_matrix.MatrixSettings(gate=("g",)), how), ran


def test_torch_2_6_runs_with_the_transformers_a_team_on_it_runs(monkeypatch) -> None:
    """transformers 5.10.4 does not import under torch 2.6: its row puts transformers 4.57.6 (and the hub 4.x needs)
    after the torch folder, and says so; verl 0.9.1 needs transformers 5.x, so its scenario is not run there."""
    rows, ran = _rows("2.6.0", monkeypatch)
    folder = stack_matrix.TARGETS / "transformers-4.57"
    assert ran == [("torch-2.6.0", (Path("/overlay"), folder), ("g",), ran[0][3])]
    assert ran[0][3].startswith(f"/overlay:{folder}")
    gate, verl = rows
    assert (gate.status, verl.status) == ("ran", "not run")
    assert verl.reason == (
        "verl 0.9.1's own requirements do not allow this stack: transformers!=5.6.0,<5.11,>=5.5.3 "
        "(transformers 4.57.6 here)"
    )
    text = stack_matrix.table(rows)
    assert "| torch 2.6.0 with transformers 4.57.6, huggingface-hub 0.36.2 | ran | 1 |" in text, text
    described = torch_matrix.describe("2.6.0")
    assert "then transformers 4.57.6, huggingface-hub 0.36.2 (`.venv/stacks/transformers-4.57`)" in described
    assert "torch.float8_e8m0fnu" in described


@pytest.mark.parametrize("version", ["2.8.0", "2.14.1"])
def test_verl_runs_where_its_own_requirements_allow_the_stack(version: str, monkeypatch) -> None:
    rows, ran = _rows(version, monkeypatch)
    assert [(name, paths, gate) for name, paths, gate, _ in ran] == [
        (f"torch-{version}", (Path("/overlay"),), ("g",)),
        (f"torch-{version}-verl", (Path("/overlay"),), ("examples/verl_cpu/scenarios/grpo_dp2_bf16_cpu.yaml",)),
    ]
    assert [stack_matrix._label(row) for row in rows] == [
        f"torch {version}",
        f"torch {version}, verl grpo_dp2_bf16_cpu (2 ranks, bf16)",
    ]


def test_verls_requirements_are_read_from_its_metadata_without_extras() -> None:
    assert torch_matrix.verl_conflicts({"torch": "2.6.0", "transformers": "5.10.4"}) == []
    assert torch_matrix.verl_conflicts({"numpy": "1.26.4"}) == ["numpy>=2.0.0 (numpy 1.26.4 here)"]
    # verl's extras pin torch 2.11.0 (fsdp, vllm, cpu ...): a requirement of an extra is not the stack's
    assert torch_matrix.verl_conflicts({"torch": "2.14.1", "flash-attn": "1.0"}) == []


def test_a_reused_row_is_read_without_building_its_release(tmp_path: Path, monkeypatch) -> None:
    """``--reuse``: the rows ``--rows`` does not name come from the report.json an earlier run left under ``--out``;
    the release's venv is not built for them."""
    monkeypatch.setattr(torch_matrix.torch_releases, "venv_python", lambda v: pytest.fail("built a venv"))
    settings = stack_matrix.MatrixSettings(out=tmp_path)
    report = tmp_path / "torch-2.8.0-verl" / "report"
    report.mkdir(parents=True)
    item = {"kind": "identical", "passed": True, "text": "", "stage": "actor_update", "nodeid": "x"}
    report.joinpath("report.json").write_text(json.dumps({"items": [item]}))
    rows = torch_matrix.run_torch_rows("2.8.0", settings, lambda name: stack_matrix.how(name, ["pinned"], True))
    assert [(r.stack, r.status, r.identical, r.gate) for r in rows] == [
        ("torch-2.8.0", "not run", 0, ""),
        ("torch-2.8.0-verl", "ran", 1, torch_matrix.VERL_LABEL),
    ]


def test_rows_named_run_and_the_rest_are_reused_or_left_out() -> None:
    how = stack_matrix.how
    assert [how("pinned", None, False), how("pinned", None, True)] == ["run", "reuse"]
    assert [how("torch-2.8.0-verl", ["torch"], True), how("pinned", ["torch"], True)] == ["run", "reuse"]
    assert [how("torch-2.8.0", ["torch-2.8.0-verl"], False), how("torch-2.8.0-verl", ["torch-2.8.0-verl"], False)] == [
        None,
        "run",
    ]


def test_the_docs_page_names_each_torch_rows_stack() -> None:
    """docs/stacks.md (generated) has each torch release's rows and says what each ran with."""
    text = (ROOT / "docs" / "stacks.md").read_text()
    for version in torch_matrix.TORCH_VERSIONS:
        assert f"- **torch-{version}**: {torch_matrix.describe(version)}" in text, "run stack_matrix.py --write-docs"
        labels = [line.split(" | ")[0] for line in text.splitlines() if line.startswith(f"| torch {version}")]
        assert len(labels) == 2 and labels[1] == f"{labels[0]}, {torch_matrix.VERL_LABEL}", labels


def test_a_release_is_proved_only_where_each_of_its_rows_passed() -> None:
    """torch 2.8.0's gate row passed and its verl row failed: the supported range leaves 2.8.0 out and names why."""
    Row = stack_matrix.Row
    rows = [
        Row("torch-2.8.0", "torch", "2.8.0", "ran", passed=3),
        Row("torch-2.8.0-verl", "torch", "2.8.0", "ran", passed=1, failed=1, verdicts=[(1, "bad"), (0, "")]),
        Row("torch-2.14.1", "torch", "2.14.1", "ran", passed=3),
    ]
    rows[1].gate = torch_matrix.VERL_LABEL
    proved, notes = stack_matrix.supported(rows)["torch"]
    assert "2.8.0" not in proved and "2.14.1" in proved, proved
    assert notes == [f"not proved: 2.8.0, {torch_matrix.VERL_LABEL} (ran, 1 failed: bad)"]
