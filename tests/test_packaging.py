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
