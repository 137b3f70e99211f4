"""Churn of a re-record against the previous golden (synthetic dumps)."""

from __future__ import annotations

import math
from pathlib import Path

from harness_testing import base_data, tensor, write_dump

from precision_harness.dumps.stage import DirStage
from precision_harness.goldens.churn import churn_table, stage_churn


def _stage(path: Path) -> DirStage:
    return DirStage(path, step=1, name="actor_update")


def test_unchanged_by_sha256_without_parsing(tmp_path: Path) -> None:
    write_dump(tmp_path / "new", base_data())
    write_dump(tmp_path / "old", base_data())
    row = stage_churn("s", _stage(tmp_path / "new"), _stage(tmp_path / "old"))
    assert row.status == "unchanged" and row.changed_apis == 0


def test_changed_statistics_and_api_sets(tmp_path: Path) -> None:
    data = base_data()
    data["Functional.linear.0.forward"]["output"][0]["Norm"] = 12.5 * 1.01  # +1 %
    data["Functional.linear.0.forward"]["output"][0]["Mean"] = 0.01 + 0.5  # RMS = 12.5 / 8: 0.32 of it
    del data["Functional.softmax.0.forward"]
    data["Functional.gelu.0.forward"] = {"input_args": [tensor()], "input_kwargs": {}, "output": [tensor()]}
    write_dump(tmp_path / "new", data)
    write_dump(tmp_path / "old", base_data())
    row = stage_churn("s", _stage(tmp_path / "new"), _stage(tmp_path / "old"))
    assert row.status == "changed"
    assert math.isclose(row.max_rel["Norm"], 0.01, rel_tol=1e-9)
    assert math.isclose(row.max_rel["Mean"], 0.5 / (12.5 / 8), rel_tol=1e-9)
    assert row.max_rel["Max"] == 0 and row.changed_apis == 1 and row.apis == 3
    assert row.new_apis == ["Functional.gelu.0.forward"] and row.removed_apis == ["Functional.softmax.0.forward"]
    table = churn_table([row])
    assert table[0].split() == ["step", "stage", "Max", "Min", "Mean", "Norm", "changed", "APIs", "new", "removed"]
    assert table[1].split() == ["step_1", "actor_update", "0", "0", "3.2e-01", "1.0e-02", "1/3", "1", "1"]
    assert churn_table([row], markdown=True)[2].startswith("| step_1 | actor_update | 0 |")


def test_new_golden(tmp_path: Path) -> None:
    write_dump(tmp_path / "new", base_data())
    row = stage_churn("s", _stage(tmp_path / "new"), None)
    assert row.status == "new" and row.apis == 3
