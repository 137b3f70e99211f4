"""Triage runs as the check ran (issue 55): ``bisect`` takes the check's device, Ray address and timeout from the one
settings object the gate reads (``PrecisionOptions``) and passes them to every commit's gate run, which accepts them.

A scenario whose YAML says ``npu`` and whose CI passes ``--precision-device cpu`` bisected, before this, on the
YAML's device at every commit: "cannot run" everywhere. ``calibrate`` reads the same fields (``cmd_calibrate``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from precision_harness.cli import build_parser
from precision_harness.history.bisect_step import pytest_command
from precision_harness.options import PrecisionOptions

AS_CI = ["--device", "cpu", "--ray-address", "10.0.0.1:6379", "--timeout", "600"]
FLAGS = ["--precision-device", "cpu", "--precision-ray-address", "10.0.0.1:6379", "-o", "precision_timeout=600"]


def _bisect_flags(*extra: str) -> list[str]:
    args = build_parser().parse_args(["bisect", "--good", "HEAD~3", *extra, "scenarios/loop.yaml"])
    return PrecisionOptions.from_cli(args).run_flags()


def test_bisect_takes_the_checks_device_ray_address_and_timeout() -> None:
    assert _bisect_flags(*AS_CI) == FLAGS
    assert _bisect_flags() == []  # auto: the scenario's own device, a local Ray, no limit, as a plain check


def test_each_commits_gate_run_gets_them_after_the_fixed_golden(tmp_path: Path) -> None:
    state = {"scenario": "scenarios/loop.yaml", "keyword": "step_1", "golden_root": "/g", "run_flags": FLAGS}
    cmd = pytest_command(state, tmp_path)
    at = cmd.index("--precision-device")
    assert cmd[at : at + len(FLAGS)] == FLAGS and cmd[-2:] == ["-k", "step_1"], cmd
    assert cmd[cmd.index("--precision-golden") + 1] == "check"


def test_the_gate_accepts_the_flags(tmp_path: Path) -> None:
    """pytest's own parser takes them (exit 5: nothing collected in an empty folder; a usage error would be 4)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", str(tmp_path), *FLAGS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 5, proc.stdout + proc.stderr
