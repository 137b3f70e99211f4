"""An installed distribution's version, read from its package metadata (nothing is imported), and the leading
release numbers the gate's version guards compare: torch's for the FSDP2 fill (:mod:`..verl.fsdp2_buffers`),
mindstudio-probe's for msprobe's analyses (``check/localize/msprobe_release.py``) and acc_check internals
(:mod:`..api_replay.msprobe_acc`)."""

from __future__ import annotations

import importlib.metadata
import re


def installed(name: str) -> str | None:
    """The version of distribution ``name`` in this interpreter (the first on ``sys.path``), or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version: str, parts: int = 3) -> tuple[int, ...]:
    """The first ``parts`` numbers of ``version``: ``(26, 1, 0)`` of ``"26.1.0.post1"``, ``(2, 14)`` of
    ``"2.14.1+cu130"`` with ``parts=2``; ``()``, before every release, where it does not start with that many."""
    found = re.match(r"\.".join([r"(\d+)"] * parts), version)
    return tuple(int(part) for part in found.groups()) if found else ()
