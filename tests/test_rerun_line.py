"""The ``rerun`` line of a failing verdict works when pasted where pytest was started (issue 28).

A project of its own inside a repository (``outer/example/`` with its own ``pytest.ini``, as
``examples/verl_cpu/`` is): run from inside it, from the repository above it, and with
``-o precision_golden_dir=...`` pointing elsewhere, each failing verdict prints a rerun line; pasted
as printed in the same folder, it runs the same item against the same golden (the drift again, not
"no golden" or "file or directory not found").
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SELECTED = "critic_update and step_1"


def _pytest(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]  # the planted drift, nothing else
    return proc.stdout


def _rerun_line(out: str) -> list[str]:
    match = re.search(r"^\s*rerun\s+(pytest .*)$", out, re.M)
    assert match, out[-3000:]
    return shlex.split(match.group(1))[1:]


def _pasted(cwd: Path, out: str) -> str:
    """Run the printed rerun line in ``cwd``; it must select the one item and fail it on the drift."""
    args = _rerun_line(out)
    again = _pytest(cwd, *args)
    assert "1 failed" in again and "critic_update[step_1]" in again, again[-3000:]
    assert "tiny_ppo: run to step 1 of 2, as selected" in again, again[-3000:]  # the one step the item needs
    assert "no golden" not in again and "not found" not in again, again[-3000:]
    return again


@pytest.fixture
def outer(recorded_project: Path, tmp_path: Path) -> Path:
    """``outer/example``: the recorded tiny project (its pytest.ini, scenario, golden), its critic lr doubled."""
    example = tmp_path / "outer" / "example"
    shutil.copytree(recorded_project, example, ignore=shutil.ignore_patterns(".precision"))
    scenario = example / "scenarios" / "tiny_ppo.yaml"
    old = "critic:\n  ppo_mini_batch_size: 1\n  ppo_micro_batch_size_per_gpu: 2\n  optim:\n    lr: 1.0e-3"
    assert old in scenario.read_text()
    scenario.write_text(scenario.read_text().replace(old, old.replace("lr: 1.0e-3", "lr: 3.0e-3")))
    return tmp_path / "outer"


def test_pasted_inside_the_project(outer: Path) -> None:
    out = _pytest(outer / "example", "scenarios/tiny_ppo.yaml", "-k", SELECTED)
    assert _rerun_line(out)[0] == "scenarios/tiny_ppo.yaml"
    _pasted(outer / "example", out)


def test_pasted_in_the_folder_above_it(outer: Path) -> None:
    """From the repository above: the path starts from there, and pytest finds the project's ini from it; the
    artifacts line names the folder from there too."""
    out = _pytest(outer, "example/scenarios/tiny_ppo.yaml", "-k", SELECTED)
    assert _rerun_line(out)[0] == "example/scenarios/tiny_ppo.yaml"
    artifacts = re.search(r"^\s*artifacts\s+(\S+)$", out, re.M)
    assert artifacts and (outer / artifacts.group(1)).is_dir(), out[-3000:]
    _pasted(outer, out)


def test_an_override_of_the_golden_folder_travels_with_the_line(outer: Path) -> None:
    moved = outer / "goldens"
    shutil.move(outer / "example" / "golden", moved)
    out = _pytest(outer / "example", "-o", f"precision_golden_dir={moved}", "scenarios/tiny_ppo.yaml", "-k", SELECTED)
    assert _rerun_line(out)[:2] == ["-o", f"precision_golden_dir={moved}"]
    _pasted(outer / "example", out)
