"""Installing the gate leaves the user's stack alone (issue 32).

On an NPU or GPU runner the environment already holds its torch (+ torch_npu), transformers and verl.
The gate's own dependencies are loose lower bounds on what it imports, so pip keeps what is there:
shown with pip's resolver itself (``pip install --dry-run --report``) over an environment that holds
torch 2.5.1 and transformers 4.57.1 (distribution records laid before this venv's on ``sys.path``,
which is where pip looks for what is installed), offline.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")

ROOT = Path(__file__).resolve().parent.parent
#: other versions than the CPU lock's, within the gate's bounds: what an Ascend runner may hold
USER_STACK = {"torch": "2.5.1", "transformers": "4.57.1"}


def _installed(site: Path, versions: dict[str, str]) -> Path:
    for name, version in versions.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return site


def _dry_run(site: Path, *requirements: str, report: Path) -> subprocess.CompletedProcess:
    """``pip install --dry-run`` of ``requirements`` (offline), with ``site`` before the venv on sys.path."""
    env = {**os.environ, "PYTHONPATH": str(site), "PIP_CONSTRAINT": ""}
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation"]
    argv += ["--disable-pip-version-check", "--report", str(report), *requirements]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_gates_dependencies_are_lower_bounds_only() -> None:
    """No pin and no upper bound on anything the gate depends on: a user's own versions satisfy them."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in dependencies:
        spec = re.sub(r"^[A-Za-z0-9_.\-\[\]]+", "", requirement.split(";")[0]).strip()
        assert not spec or re.fullmatch(r">=\s*[0-9][0-9.]*", spec), requirement


def test_installing_the_gate_keeps_the_users_torch_and_transformers(tmp_path: Path) -> None:
    site = _installed(tmp_path / "site", USER_STACK)
    proc = _dry_run(site, ".", report=tmp_path / "report.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    planned = {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}
    assert planned == {"pytest-precision": "0.1.0"}, planned  # nothing of the user's stack changes


def test_a_requirement_the_users_stack_does_not_meet_is_seen(tmp_path: Path) -> None:
    """The control: were the gate to ask for a newer transformers, pip would have to change it (and, offline,
    cannot): the check above would catch a tightened bound."""
    site = _installed(tmp_path / "site", USER_STACK)
    proc = _dry_run(site, ".", "transformers>=5.0", report=tmp_path / "report.json")
    assert proc.returncode != 0
    assert "transformers" in proc.stderr, proc.stderr[-2000:]
