"""The wheel holds every package of the harness: ``[tool.setuptools] packages`` lists each folder with an
``__init__.py`` under precision_harness/ (an editable install finds an unlisted one, a wheel does not)."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_harness_package_is_listed_for_the_wheel() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "precision_harness").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set(), f"pyproject.toml [tool.setuptools] packages lacks {sorted(found - listed)}"
    assert listed - found == set(), f"pyproject.toml lists packages that do not exist: {sorted(listed - found)}"


def test_every_data_file_of_the_harness_is_package_data() -> None:
    """Files the engine reads at run time (schemas, verl's agent-loop registry file) are matched by
    ``[tool.setuptools.package-data]``: a wheel without them fails where an editable install works."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    base = ROOT / "precision_harness"
    data = {
        p.relative_to(base)
        for p in base.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    matched = {f for f in data for pattern in globs["precision_harness"] if f.match(pattern)}
    assert data - matched == set(), f"not package data: {sorted(map(str, data - matched))}"
