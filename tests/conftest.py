"""Fixtures for the harness's own tests (plain helpers live in harness_testing.py)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
from harness_testing import base_data, make_project, run_pytest, write_dump


@pytest.fixture
def dumps():
    """Factory for (target, golden) synthetic stage dirs: ``dumps(tmp_path, mutate)``."""

    def make(root: Path, mutate=None, golden_mutate=None, rank: str = "rank0") -> tuple[Path, Path]:
        golden = copy.deepcopy(base_data())
        target = copy.deepcopy(base_data())
        if golden_mutate:
            golden_mutate(golden)
        if mutate:
            mutate(target)
        write_dump(root / "golden" / "step_1" / "actor_update", golden, rank)
        write_dump(root / "target" / "step_1" / "actor_update", target, rank)
        return root / "target" / "step_1" / "actor_update", root / "golden" / "step_1" / "actor_update"

    return make


@pytest.fixture(scope="session")
def recorded_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose tiny scenario's golden was recorded once per test session (one real run)."""
    root = make_project(tmp_path_factory.mktemp("recorded"))
    proc = run_pytest(root, "--precision-golden", "update")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.fixture
def project(recorded_project: Path, pytester: pytest.Pytester) -> pytest.Pytester:
    """pytester whose directory holds a copy of the recorded project (golden included)."""
    shutil.copytree(recorded_project, pytester.path, ignore=shutil.ignore_patterns(".precision"), dirs_exist_ok=True)
    return pytester
