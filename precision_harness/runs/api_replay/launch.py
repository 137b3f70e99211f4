"""Start the replay worker (``python -m precision_harness.runs.api_replay``) and read its answer; torch-free.

The worker runs in a fresh interpreter with the CPU determinism environment of one thread
(:func:`~precision_harness.runs.runner.devices.determinism_env`), so the baseline's reduction order
is the same wherever the gate runs; the calling process never imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from precision_harness.errors import RunFailedError
from precision_harness.paths import display_path
from precision_harness.runs.runner.devices import determinism_env

REQUEST, ANSWER, LOG = "replay_request.json", "replay.json", "replay.log"


def replay_calls(rank_dir: Path, calls: list[dict[str, str]], *, out_dir: Path, timeout: float | None) -> list[dict]:
    """Replay ``calls`` (``{"api", "output"}``) of the capture in ``rank_dir``; one result per call, in order.

    Request, answer and log go to ``out_dir``.

    Raises:
        RunFailedError: the worker exited non-zero or passed ``timeout`` seconds.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    request, answer, log = out_dir / REQUEST, out_dir / ANSWER, out_dir / LOG
    request.write_text(json.dumps({"rank_dir": str(rank_dir), "calls": calls}, indent=1), encoding="utf-8")
    answer.unlink(missing_ok=True)
    env = {**os.environ, **determinism_env("cpu", 1)}
    src = str(Path(__file__).resolve().parents[3])  # this checkout of precision_harness
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "precision_harness.runs.api_replay", str(request), str(answer)]
    with open(log, "wb") as fh:
        try:
            proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RunFailedError(
                f"the replay worker timed out after {timeout:g} s (log: {display_path(log)})"
            ) from None
    if proc.returncode != 0 or not answer.is_file():
        raise RunFailedError(f"the replay worker exited with {proc.returncode} (log: {display_path(log)})")
    results: list[dict[str, Any]] = json.loads(answer.read_text(encoding="utf-8"))["calls"]
    return results
