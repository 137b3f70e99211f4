"""An interpreter that loads none of the caller's start-up code: ``python -I isolated.py SRC MODULE ARGS...``.

The judgement's float64 replay (:mod:`precision_harness.runs.api_replay`) is the reference a changed API is judged
against, so it must compute what the installed torch computes, not what the run computed. A run can patch torch at
the Python level before any of its own code runs: a ``sitecustomize.py`` or ``usercustomize.py`` that the
interpreter imports at start-up from a folder on ``PYTHONPATH`` or from the user's site-packages, or a ``.pth`` file
there. A replay that inherited them (a subprocess with the run's environment, or a child forked from a warm server
that imported them) replayed the patched function and took it for the truth: a patch computing ``silu`` 1e-4 off
read ``improvement``.

``python -I`` (isolated mode: ``-E`` ignores every ``PYTHON*`` variable, ``PYTHONPATH`` among them; ``-s`` leaves the
user's site-packages out; ``-P`` puts neither the script's folder nor the working directory on ``sys.path``) keeps the
interpreter's own installation: its standard library and its site-packages, where torch, msprobe and an installed
precision_harness (a wheel, or an editable install's ``.pth`` file or finder) are found. A source tree run in place
(``PYTHONPATH=/path/to/checkout``) is found through ``SRC``, the folder that holds the caller's precision_harness:
:func:`main` puts it first on ``sys.path`` where the installed one is not that same folder, so the worker imports the
caller's code. What the installation itself loads at start-up (a ``sitecustomize.py`` in the standard library or
site-packages, a ``.pth`` file there) is loaded, as it is by every process of that installation: it is the
environment under test, not a patch of the run. ``-E`` drops ``PYTHONHASHSEED`` too: the replay's figures are torch's
arithmetic on the captured tensors, which no string hash orders.

This file is run as a script (its path), so it imports nothing of precision_harness before ``SRC`` is placed.
"""

from __future__ import annotations

import os
import runpy
import site
import sys
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path

#: the folder that holds this precision_harness (a checkout's root, or site-packages for a wheel)
SRC = str(Path(__file__).resolve().parents[2])


def command(module: str, argv: list[str]) -> list[str]:
    """The command line that runs ``python -m MODULE ARGV`` in an isolated interpreter (module docstring)."""
    return [sys.executable, "-I", str(Path(__file__).resolve()), SRC, module, *argv]


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without ``PYTHONPATH``: ``-I`` ignores it already, and no process the worker starts inherits it."""
    return {name: value for name, value in environ.items() if name != "PYTHONPATH"}


def start_up_code(environ: Mapping[str, str]) -> str | None:
    """What an interpreter started as this one was (its flags) with ``environ`` may load at start-up that an isolated
    one does not: ``PYTHONPATH``'s folders, or the user's site-packages; None where nothing.

    A warm server (:mod:`precision_harness.runs.warm.workers`) started with ``environ`` has imported that code, and
    so has every child forked from it.
    """
    if environ.get("PYTHONPATH"):
        return f"PYTHONPATH={environ['PYTHONPATH']}"
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE and not environ.get("PYTHONNOUSERSITE") else None
    if user_site and os.path.isdir(user_site):
        return f"the user's site-packages ({user_site})"
    return None


def main(argv: list[str]) -> None:
    """Run ``argv[1]`` as ``python -m`` does, with ``argv[2:]`` as its arguments and ``argv[0]`` (``SRC``) importable.

    Raises:
        SystemExit: the module's own exit.
    """
    src, module = argv[0], argv[1]
    spec = find_spec("precision_harness")
    found = os.path.dirname(os.path.dirname(spec.origin)) if spec is not None and spec.origin else None
    if found is None or os.path.realpath(found) != os.path.realpath(src):
        sys.path.insert(0, src)
    sys.argv = [sys.argv[0], *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
