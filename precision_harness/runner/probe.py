"""StageProbe: one msprobe PrecisionDebugger per process, one dump directory per stage.

msprobe's debugger is a process-wide singleton with one level per process (docs/msprobe.md#debugger-lifecycle),
so a worker builds one probe and re-points ``service.config.dump_path`` for every stage, as verl's
``PrecisionDebuggerProfiler`` does: ``start(model, rank_id) -> stage -> stop -> reset_status``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: msprobe's path check (``check_path_pattern_valid``) rejects anything else in dump paths.
MSPROBE_PATH_RE = re.compile(r"^[a-zA-Z0-9_.:/-]+$")


def check_dump_path(path: Path) -> None:
    """Raise ``ValueError`` if msprobe would reject ``path`` (spaces, brackets, non-ASCII)."""
    real = str(Path(path).resolve())
    if not MSPROBE_PATH_RE.match(real):
        raise ValueError(
            f"msprobe rejects dump path {real!r}: only [A-Za-z0-9_.:/-] are allowed; "
            "use --precision-artifacts (or --out) with a path made of those characters"
        )


class StageProbe:
    """Collects one msprobe ``dump.json`` per (step, stage) under ``root`` in verl's layout.

    Args:
        msprobe_config: the msprobe ``config.json`` contents (``dump_path`` is managed here).
        root: run directory; stage dumps go to ``root/step_<n>/<stage>/step0/rank<r>/``.
        rank: the rank passed to ``start(rank_id=...)`` (``rank0`` folders without a process group).

    Raises:
        ImportError: mindstudio-probe is not installed.
    """

    def __init__(self, *, msprobe_config: dict[str, Any], root: Path, rank: int = 0) -> None:
        from msprobe.pytorch import PrecisionDebugger

        check_dump_path(root)
        self.root, self.rank = Path(root).resolve(), rank
        self.root.mkdir(parents=True, exist_ok=True)
        config_path = self.root / "msprobe_config.json"
        config_path.write_text(json.dumps(msprobe_config, indent=2, sort_keys=True))
        self._cls = PrecisionDebugger
        self.debugger = PrecisionDebugger(config_path=str(config_path), dump_path=str(self.root / "_unused"))

    @contextmanager
    def stage(self, step: int, stage: str, model: Any) -> Iterator[Path]:
        """Dump everything the body runs to ``step_<step>/<stage>``; always stops and resets."""
        dump_dir = self.root / f"step_{step}" / stage
        service = self.debugger.service
        service.config.dump_path = str(dump_dir)
        try:
            self._cls.start(model, rank_id=self.rank)
            yield dump_dir
        finally:
            # a failed start() leaves Runtime.is_running=True: stop() regardless (docs/msprobe.md#debugger-lifecycle)
            self._cls.stop()
            service.reset_status()
