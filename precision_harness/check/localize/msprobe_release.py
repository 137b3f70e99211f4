"""Which mindstudio-probe releases the gate runs and asks for analyses, and how each one's compare is called: the
version guard of msprobe's compare internals, in one place.

Why a guard: :mod:`~precision_harness.check.localize.msprobe_tools` calls msprobe's compare pieces (``ParseData``,
``Comparator.compare_statistics``, ``calculate_excel_result_df``, ``FirstDiffAnalyze``, ``DiffAnalyzer``,
``GraphBuilder``), which are not a public API and change between releases. Read against each release's source
(``msprobe/core/compare``, ``msprobe/visualization``):

- 26.1.0, 26.1.0.post1, 26.2.0: ``ParseData(mode_config, rank, data_dirs)``; the rest as :mod:`msprobe_tools` calls it.
- 26.0.0: ``ParseData(mode_config, rank)``, without ``data_dirs`` (called with three, it raised ``TypeError:
  ParseData.__init__() takes 3 positional arguments but 4 were given`` on every failing item): :func:`parse_data`
  passes them where its signature takes them; the rest as 26.2.0.
- the 8.x line (8.1.0 to 8.3.3, the release CANN images ship): ``Comparator(file_reader, mode_config,
  mapping_config)`` and no ``indicator_analysis`` (msprobe's Result columns): not supported, said in one line
  (:func:`analyses_problem`). Its dump (``msprobe.pytorch``) uses ``np.unicode_``, which numpy 2 removed, so under
  numpy 2 it cannot dump at all: a run is refused before it starts (:func:`run_problem`), in one line, instead of a
  worker dying behind a traceback. Under numpy 1 it dumps (its debugger's start: ``runs/msprobe_debugger.py``) and
  the gate compares what both releases record (``check/recording.py``): docs/stacks.md's msprobe-8.3.3 row.

A release newer than :data:`CHECKED` is tried as 26.2.0 is called; where msprobe then fails, its line names the
release and the range read (:func:`unread`). Each reason is one line: no traceback.
"""

from __future__ import annotations

import inspect
from typing import Any

from precision_harness.runs.host.msprobe_release import DISTRIBUTION, WANTED
from precision_harness.runs.host.package_versions import installed, release

#: the oldest release whose compare internals msprobe_tools.py was read against, and the newest: the oldest is
#: below the install floor (runs/host/msprobe_release.py): 26.0.0 runs the gate (docs/stacks.md) where a stack holds it
OLDEST, CHECKED = (26, 0, 0), (26, 2, 0)
#: the range as a line says it, and the install line that gives it (the stage API's own, runs/host/msprobe_release.py)
RANGE = "26.0.0 to 26.2.x"
INSTALL = f"pip install {WANTED}"
#: the first release whose ParseData takes the dump data folders (``data_dirs``)
DATA_DIRS = (26, 1, 0)


def _numpy_2() -> str | None:
    """numpy's version where it is 2 or later (None: older, or not installed)."""
    version = installed("numpy")
    return version if version is not None and release(version) >= (2, 0, 0) else None


def run_problem(version: str | None = None) -> str | None:
    """Why this interpreter's msprobe cannot dump a run, in one line; None where it can (or none is installed:
    that is the session's own error). Only the 8.x line under numpy 2 is known not to."""
    version = version or installed(DISTRIBUTION)
    numpy = _numpy_2()
    if version is None or release(version) >= OLDEST or numpy is None:
        return None
    return (
        f"mindstudio-probe {version} cannot run under numpy {numpy}: it uses np.unicode_, which numpy 2 removed "
        f"(the 8.x line runs the gate under numpy < 2, without verl, whose 0.9.1 needs numpy 2: docs/stacks.md); "
        f"the gate is checked with mindstudio-probe {RANGE}: {INSTALL}"
    )


def analyses_problem(version: str | None = None) -> str | None:
    """Why msprobe's analyses (its compare table, first diff and graph) are not asked of this release, in one line;
    None where they are (a newer release than :data:`CHECKED` is tried)."""
    version = version or installed(DISTRIBUTION)
    if version is None:
        return "mindstudio-probe is not installed in this interpreter; pip install mindstudio-probe"
    if release(version) >= OLDEST:
        return None
    return run_problem(version) or (
        f"mindstudio-probe {version}: msprobe's analyses are not supported for this release (its compare predates "
        f"26.0.0's API); they are for mindstudio-probe {RANGE}: {INSTALL}"
    )


def unread(version: str | None = None) -> str:
    """What a line of msprobe's own failure adds where the release is not one the guard was read against."""
    version = version or installed(DISTRIBUTION) or "unknown"
    if OLDEST <= release(version) <= (*CHECKED[:2], 999):
        return ""
    return f" (mindstudio-probe {version}; msprobe's analyses are read against {RANGE})"


def parse_data(parse_data_class: Any, mode: Any, rank: str) -> Any:
    """``ParseData`` built as the installed release builds it: with ``data_dirs`` where it takes them (26.1.0 on;
    none given: the statistics compare loads no tensor), without where it does not (26.0.0)."""
    if "data_dirs" in inspect.signature(parse_data_class).parameters:
        return parse_data_class(mode, rank, {"NPU": None, "Bench": None})
    return parse_data_class(mode, rank)
