"""``make test`` (and so CI, ``.ci/run``) sets PRECISION_REQUIRE_VERL=1: with the [verl] extra installed, a verl
missing from the environment fails the parity tests instead of skipping them (tests/test_verl_parity.py)."""

from __future__ import annotations

import itertools
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_runs_pytest_with_verl_required() -> None:
    dry = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    (line,) = [x for x in dry.splitlines() if "pytest" in x]
    assignments = itertools.takewhile(lambda word: "=" in word and not word.startswith("-"), shlex.split(line))
    env = dict(word.split("=", 1) for word in assignments)  # the variables the command line sets before pytest
    assert env.get("PRECISION_REQUIRE_VERL") == "1", line


@pytest.mark.parametrize("required", [True, False], ids=["required", "not required"])
def test_a_verl_missing_fails_the_parity_tests_only_when_required(tmp_path: Path, required: bool) -> None:
    broken = tmp_path / "verl"
    broken.mkdir()
    # as a verl missing from the environment reads (pytest.importorskip skips on ModuleNotFoundError alone)
    (broken / "__init__.py").write_text("raise ModuleNotFoundError('a broken verl install', name='verl')\n")
    env = {k: v for k, v in os.environ.items() if k != "PRECISION_REQUIRE_VERL"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "plugins"), env.get("PYTHONPATH", "")])
    if required:
        env["PRECISION_REQUIRE_VERL"] = "1"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "tests/test_verl_parity.py"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if required:
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, proc.stdout[-2000:]
        assert "ModuleNotFoundError: a broken verl install" in proc.stdout
    else:
        assert "1 skipped" in proc.stdout and "error" not in proc.stdout, proc.stdout[-2000:]  # green by accident
