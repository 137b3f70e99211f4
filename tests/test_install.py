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
#: a device image's stack: msprobe's 8.x line, pytest 8, and numpy and protobuf older than constraints/cpu.txt's. The
#: oldest each can be here: the rest of this environment (where pip looks for what is installed) needs numpy>=2.0.2
#: (pandas 3.1) and protobuf>=6.33.5 (googleapis-common-protos); a CANN image's numpy 1 and protobuf 3 come with
#: older packages around them, which this environment does not have
DEVICE_STACK = {**USER_STACK, "mindstudio-probe": "8.3.3", "numpy": "2.0.2", "protobuf": "6.33.5", "pytest": "8.3.5"}
#: the one wheel a device-like install may take: mindstudio-probe at the gate's floor (``make test`` downloads it)
WHEELS = ROOT / ".venv" / "wheels"


def _installed(site: Path, versions: dict[str, str]) -> Path:
    for name, version in versions.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return site


def _dry_run(site: Path, *requirements: str, report: Path, links: Path | None = None) -> subprocess.CompletedProcess:
    """``pip install --dry-run`` of ``requirements`` (offline; ``links``: a folder of wheels pip may take), with
    ``site`` before the venv on sys.path."""
    env = {**os.environ, "PYTHONPATH": str(site), "PIP_CONSTRAINT": ""}
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation"]
    argv += ["--find-links", str(links)] if links is not None else []
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


def _msprobe_floor() -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (requirement,) = (r for r in dependencies if r.startswith("mindstudio-probe"))
    return requirement.partition(">=")[2].strip()


def test_the_msprobe_floor_is_the_one_the_gate_names() -> None:
    """pyproject.toml's floor is the one an unimportable msprobe's line tells the user to install."""
    from precision_harness.runs.host.msprobe_release import MSPROBE_FLOOR

    assert _msprobe_floor() == MSPROBE_FLOOR


def test_installing_into_a_device_stack_moves_only_msprobe(tmp_path: Path) -> None:
    """A CANN image's stack (:data:`DEVICE_STACK`): pip moves mindstudio-probe 8.3.3 to the floor, and nothing else
    of it: torch, transformers, the older numpy and protobuf, and pytest 8 stay (README, "Install into your own
    project")."""
    floor = _msprobe_floor()
    if not any(WHEELS.glob(f"mindstudio_probe-{floor}-*.whl")):
        pytest.fail(f"{WHEELS} holds no mindstudio-probe {floor} wheel: `make .venv/.test` downloads it")
    site = _installed(tmp_path / "site", DEVICE_STACK)
    proc = _dry_run(site, ".", report=tmp_path / "report.json", links=WHEELS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    planned = {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}
    assert planned == {"pytest-precision": "0.1.0", "mindstudio-probe": floor}, planned


#: the install lines that name a ref of this repository: ``git+<url>@<ref>``
_GIT_REF = re.compile(r"pytest-precision(?:\.git)?@([\w./-]+)\"")
INSTALL_LINES = ("examples/ci/github-actions.yml", "examples/ci/gitlab-ci.yml", "README.md")


def test_the_install_lines_name_a_ref_that_exists() -> None:
    """Each ``git+...@<ref>`` the CI examples and README install from is a tag or branch of this repository."""
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True, check=False).returncode:
        pytest.skip("not a git checkout: no refs to check the install lines against")
    refs = {ref for name in INSTALL_LINES for ref in _GIT_REF.findall((ROOT / name).read_text())}
    assert refs, "no install line names a ref: the pattern no longer matches the examples"
    for ref in sorted(refs):
        names = [f"refs/tags/{ref}", f"refs/heads/{ref}", f"refs/remotes/origin/{ref}"]
        found = [
            name
            for name in names
            if subprocess.run(["git", "rev-parse", "--verify", "--quiet", name], cwd=ROOT, check=False).returncode == 0
        ]
        assert found, f"{ref} is no tag or branch of this repository: an install line in {INSTALL_LINES} names it"
