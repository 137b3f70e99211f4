"""The wall time of one pytest session in a benchmark's throwaway project (shared by the benchmarks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed_pytest(
    project: Path, args: list[str], *, paths: list[Path], env: dict[str, str], expect: int, timeout: float
) -> float:
    """Seconds ``pytest -q ARGS`` took in ``project``, with ``paths`` then the repository (and its plugins) on
    ``PYTHONPATH`` and ``env`` over this process's environment.

    Exits (``sys.exit``, with the tail of pytest's output) unless pytest exited ``expect``: 0 for a passing
    gate, 1 for one a plant makes fail; or when it runs past ``timeout`` seconds (``subprocess.TimeoutExpired``).
    """
    path = os.pathsep.join(str(p) for p in [*paths, REPO, REPO / "plugins"])
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env={**os.environ, **env, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != expect:
        sys.exit(
            f"pytest {' '.join(args)} exited {proc.returncode} in {project} (expected {expect}):\n{proc.stdout[-3000:]}"
        )
    return wall
