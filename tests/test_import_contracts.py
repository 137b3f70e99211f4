"""The import contracts of pyproject.toml (``[tool.importlinter]``, run by ``make lint``) hold, and they bite.

Each test lints a copy of the package, so a planted import never touches the checkout: as it is, every
contract is kept; with one import from the scenario model up into check/, the flow's layers contract
breaks and names that import; with one import from one kind of run into another (the API replay into
command runs), the kinds' independence contract breaks and names it; with one from what the kinds share
(runs/host/) into a kind, the contract on the shared rooms breaks; with one from a phase of check/ up the phase order
(the compare into the verdicts), check/'s phase contract breaks and names it, and a module left at check/'s top in no
phase's layer is named too. The plants share one lint of one copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: an upward import: the scenario model (scenarios/) reaching into the compare (check/)
PLANTED = "from precision_harness.check.compare import stage  # planted upward import\n"
#: a cross-kind import: the API replay (runs/api_replay/) reaching into command runs (runs/command/)
PLANTED_KIND = "from precision_harness.runs.command import run  # planted cross-kind import\n"
#: what every kind shares (runs/host/) reaching into one kind (the built-in runner)
PLANTED_SHARED = "from precision_harness.runs.runner import trainer  # planted import of a kind\n"
#: a phase of check/ reaching up the phase order: the compare (check/compare/) into the verdicts (check/verdicts/)
PLANTED_PHASE = "from precision_harness.check.verdicts import items  # planted import up the phases\n"
#: a module at check/'s top that is in no phase's layer
PLANTED_LOOSE = '"""A module beside the phases of check/, in none of them."""\n'


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    package = tree / "precision_harness"
    shutil.copytree(ROOT / "precision_harness", package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over ``tree``'s package with ``tree``'s contracts (its copy comes first on the path)."""
    pytest.importorskip("importlinter", reason="the [test] extra installs import-linter")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    lint_imports = Path(sys.executable).with_name("lint-imports")
    command = [str(lint_imports), "--config", str(tree / "pyproject.toml"), "--no-cache"]
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_every_contract_is_kept(tmp_path: Path) -> None:
    result = _lint_imports(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken." in result.stdout


def _plant(tree: Path, module: str, line: str) -> None:
    path = tree / "precision_harness" / module
    path.write_text(path.read_text(encoding="utf-8") + line, encoding="utf-8")


def test_upward_cross_kind_and_cross_phase_imports_break_their_contracts(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    _plant(tree, "scenarios/scenario.py", PLANTED)
    _plant(tree, "runs/api_replay/names.py", PLANTED_KIND)
    _plant(tree, "runs/host/machine.py", PLANTED_SHARED)
    _plant(tree, "check/compare/drift_set.py", PLANTED_PHASE)
    (tree / "precision_harness" / "check" / "loose.py").write_text(PLANTED_LOOSE, encoding="utf-8")
    result = _lint_imports(tree)
    out = " ".join(result.stdout.split())  # lint-imports wraps its lines at 80 columns
    assert result.returncode == 1, out
    assert "The flow: each room imports only the rooms below it BROKEN" in out
    assert "precision_harness.scenarios is not allowed to import precision_harness.check" in out
    assert "precision_harness.scenarios.scenario -> precision_harness.check.compare.stage" in out
    kinds = "The kinds of run do not know each other: the built-in runner, command runs, verl, the API replay"
    assert f"{kinds} BROKEN" in out
    assert "precision_harness.runs.api_replay is not allowed to import precision_harness.runs.command" in out
    assert "precision_harness.runs.api_replay.names -> precision_harness.runs.command.run" in out
    assert "What the kinds of run share imports none of them (kind_runners and launch start them) BROKEN" in out
    assert "precision_harness.runs.host is not allowed to import precision_harness.runs.runner" in out
    assert "precision_harness.runs.host.machine -> precision_harness.runs.runner.trainer" in out
    phases = "check/ by phase: rerun -> verdicts -> localize -> compare -> what the phases share -> tolerance"
    assert f"{phases} BROKEN" in out
    assert "precision_harness.check.compare is not allowed to import precision_harness.check.verdicts" in out
    assert "precision_harness.check.compare.drift_set -> precision_harness.check.verdicts.items" in out
    assert "precision_harness.check.loose" in out  # in no layer of the exhaustive phase contract
