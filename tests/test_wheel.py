"""The gate installs without a package index: a wheel built from the repository, installed into a fresh
place, records and checks a project of its own (issue 40).

README's install section names three ways (git+URL, a clone, a wheel); the wheel is the one that
proves the package itself is complete (its modules, schemas, entry points), since nothing of this
checkout is on the path. The wheel is built offline from a copy of the sources (``--no-build-isolation``:
setuptools and wheel of this venv; nothing is fetched) and installed with ``--target``; the project
is a ``scenarios/`` folder with a copy of ``grpo_tiny.yaml`` and nothing else (no conftest, no ini).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: what the wheel is built from (pyproject.toml's packages and py-modules, and its readme)
SOURCES = ("pyproject.toml", "README.md", "plugins", "precision_harness")


def _pip(*args: str, cwd: Path) -> None:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the wheel was installed into (``pip install --target``)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(base / "dist"), str(src), cwd=base)
    wheels = list((base / "dist").glob("pytest_precision-*.whl"))
    assert len(wheels) == 1, wheels
    _pip("install", "--no-deps", "--target", str(base / "site"), str(wheels[0]), cwd=base)
    return base / "site"


def _env(site: Path) -> dict[str, str]:
    """This interpreter's packages, with the installed wheel first and nothing of this checkout."""
    return {**os.environ, "PYTHONPATH": str(site)}


def test_the_wheel_holds_the_plugin_the_package_and_its_data(installed: Path) -> None:
    code = (
        "import pytest_precision, precision_harness, precision_harness.schemas as s, importlib.resources as r;"
        "print(pytest_precision.__file__); print(precision_harness.__file__);"
        "print(r.files(s).joinpath('scenario.schema.json').is_file())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=installed.parent, env=_env(installed), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    plugin, package, schema = proc.stdout.split()
    assert Path(plugin).is_relative_to(installed) and Path(package).is_relative_to(installed), proc.stdout
    assert schema == "True"
    assert (installed / "bin" / "precision-harness").is_file()  # the console script
    entry_points = next(installed.glob("pytest_precision-*.dist-info")) / "entry_points.txt"
    assert "precision = pytest_precision" in entry_points.read_text()


def test_the_wheel_holds_every_module_and_data_file_of_the_package(installed: Path) -> None:
    """pyproject.toml lists the packages by name: a subpackage left off the list is missing from the wheel."""
    source = ROOT / "precision_harness"
    kept = {
        p.relative_to(source).as_posix()
        for p in source.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".json", ".yaml", ".typed")
    }
    wheel = installed / "precision_harness"
    assert {f for f in kept if not (wheel / f).is_file()} == set()


@pytest.mark.slow
def test_a_project_of_its_own_records_and_checks_with_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "scenarios").mkdir(parents=True)
    shutil.copy(ROOT / "scenarios" / "grpo_tiny.yaml", project / "scenarios")

    def pytest_run(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]  # the entry point loads the gate
        return subprocess.run(argv, cwd=project, env=_env(installed), capture_output=True, text=True, timeout=600)

    record = pytest_run("--precision-golden", "update")
    assert record.returncode == 0, record.stdout[-3000:] + record.stderr[-2000:]
    manifest = project / "golden" / "grpo_tiny" / "cpu" / "manifest.json"
    assert manifest.is_file(), sorted(p.relative_to(project) for p in project.rglob("*") if p.is_file())[:40]
    check = pytest_run()
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert "passed" in check.stdout.splitlines()[-1], check.stdout[-1000:]
    version = pytest_run("--version", "--version")  # names each plugin with the file it was loaded from
    assert f"pytest-precision-0.1.0 at {installed}" in version.stdout + version.stderr, version.stdout + version.stderr
