"""The mindstudio-probe releases the gate runs with, and one line for a release that does not import here.

The floor (:data:`MSPROBE_FLOOR`) is the oldest release the stack matrix proves (``benchmarks/stack_matrix.py``,
docs/stacks.md), and pyproject.toml's requirement. A release below it may still be installed, as the 8.x line
of a CANN image is: mindstudio-probe 8.3.3 uses ``np.unicode_``, which numpy 2 removed, and declares
``numpy<2.0``. Imported under numpy 2 it raises ``AttributeError`` three frames deep, and in the warm server's
preload (:mod:`precision_harness.runs.warm.workers`) it stopped the forkserver itself, so every item failed with
``EOFError: unexpected EOF``. :func:`unimportable` turns any such failure into one line: the release, the error,
the requirements of that release this environment does not meet (its own ``Requires-Dist``, read with
``importlib.metadata``), and what to install.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import InvalidRequirement, Requirement

from precision_harness.runs.host.package_versions import installed

#: the distribution msprobe ships in
DISTRIBUTION = "mindstudio-probe"
#: the oldest release the stack matrix proves (docs/stacks.md); pyproject.toml requires at least this
MSPROBE_FLOOR = "26.1.0"
#: the requirement that gives a release the gate runs with, as pip takes it
WANTED = f"'{DISTRIBUTION}>={MSPROBE_FLOOR}'"


def unmet_requirements(distribution: str = DISTRIBUTION) -> list[str]:
    """The requirements of ``distribution`` (extras left out) that this interpreter does not meet, one phrase each:
    ``"numpy<2.0,>=1.23.0 (numpy 2.4.6 is installed)"`` or ``"tabulate (not installed)"``. Empty when
    ``distribution`` itself is not installed."""
    try:
        requires = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    unmet = []
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        version = installed(requirement.name)
        if version is None:
            unmet.append(f"{requirement.name} (not installed)")
        elif not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{requirement.name}{requirement.specifier} ({requirement.name} {version} is installed)")
    return unmet


def unimportable(exc: BaseException) -> str:
    """One line for ``exc``, raised importing ``msprobe.pytorch``: the release, the error, what it needs, what to do."""
    message = str(exc).splitlines()[0] if str(exc) else ""
    version = installed(DISTRIBUTION)
    if version is None:
        return f"mindstudio-probe is not installed ({type(exc).__name__}: {message}); pip install {WANTED}"
    unmet = unmet_requirements()
    needs = f"; this release requires {', '.join(unmet)}" if unmet else ""
    return (
        f"mindstudio-probe {version} does not import here ({type(exc).__name__}: {message}){needs}; "
        f"the gate runs with mindstudio-probe>={MSPROBE_FLOOR} (docs/stacks.md): pip install {WANTED}"
    )
