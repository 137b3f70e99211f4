"""One ``step_<n>/<stage>`` of a dump, however it is stored: the :class:`StageSource` interface.

The compare, the churn and calibration read a stage only through :class:`StageSource`. Two
classes implement it: :class:`DirStage`, a verl-layout folder on disk (a run, a plain export,
verl's ``outputs/profile``), and :class:`~precision_harness.goldens.golden.GoldenStage`, a stage of a
recorded golden, plain or compressed, whose digests come from its manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from precision_harness.dumps.files import (
    DUMP,
    STAGE_OUTPUTS,
    cut_calls,
    load_dump,
    merged,
    rank_digest,
    sha256_file,
)


@runtime_checkable
class StageSource(Protocol):
    """A stage's ranks, their parsed dumps and digests: what a run's stage and a golden's stage both offer."""

    @property
    def step(self) -> int:
        """The training step (``step_<n>``), from 1."""
        ...

    @property
    def name(self) -> str:
        """The stage name, e.g. ``actor_update``."""
        ...

    @property
    def level(self) -> str | None:
        """msprobe dump level (``L0``, ``L1``, ``mix``, ``auto``); None where unknown."""
        ...

    def ranks(self) -> list[str]:
        """``["rank0", ...]``: every rank with a dump.json, sorted."""
        ...

    def load(self, rank: str, *, raw: bool = False) -> dict[str, Any]:
        """The rank's parsed dump.json, its stage_outputs.json merged in; with ``raw``, its non-finite values left
        as :func:`~precision_harness.dumps.files.parse_dump_raw` reads them. Raises GoldenCorruptError."""
        ...

    def content(self, rank: str) -> bytes | None:
        """The rank's dump.json bytes where they are its whole dump (no stage_outputs.json beside them), else None.
        Raises GoldenCorruptError (a golden's file missing or edited)."""
        ...

    def digest(self, rank: str) -> str:
        """The rank's :func:`~precision_harness.dumps.files.rank_digest`: equal digests, identical statistics."""
        ...

    def index(self, rank: str) -> Any | None:
        """The rank's :class:`~precision_harness.dumps.dump_index.DumpIndex` where one was recorded with its dump.json
        (a golden's), else None. Raises GoldenCorruptError (a golden's file missing or edited)."""
        ...

    def indexed(self, rank: str) -> bool:
        """Whether the rank has an index to read (:meth:`index`), without reading it."""
        ...

    def statistics(self) -> int | None:
        """How many statistics the gate checks in the stage, where recorded (None: count them)."""
        ...

    def plain_dir(self, scratch: Path) -> Path:
        """The stage as plain files msprobe's own tools can open (written below ``scratch`` if need be)."""
        ...


def cut_rank(source: StageSource, rank: str, calls: list[str], span: tuple[int, int]) -> dict[str, Any] | None:
    """:func:`~precision_harness.dumps.files.cut_calls` of ``rank``'s dump.json in ``source`` (``calls``: its every
    call); None where the rank has a stage_outputs.json or its bytes do not cut so (the caller parses it)."""
    content = source.content(rank)
    return cut_calls(content, calls, span) if content is not None else None


def rank_dirs(stage_dir: Path) -> dict[str, Path]:
    """``{"rank0": .../step0/rank0/dump.json, ...}`` for a verl-layout stage directory."""
    return {p.parent.name: p for p in sorted(Path(stage_dir).glob(f"step0/rank*/{DUMP}"))}


class DirStage:
    """A verl-layout stage folder on disk (``.../step_<n>/<stage>``): a run, a plain golden, verl's profile.

    ``step`` and ``name`` default to what the path says (``step_<n>``, its last part).
    """

    def __init__(self, path: Path, *, step: int | None = None, name: str | None = None, level: str | None = None):
        self.path = Path(path)
        self.step = step if step is not None else _step_of(self.path)
        self.name = name if name is not None else self.path.name
        self.level = level

    def __str__(self) -> str:
        return str(self.path)

    def ranks(self) -> list[str]:
        return sorted(rank_dirs(self.path))

    def load(self, rank: str, *, raw: bool = False) -> dict[str, Any]:
        rank_dir = self.path / "step0" / rank
        extra = rank_dir / STAGE_OUTPUTS
        return merged(load_dump(rank_dir / DUMP, raw=raw), load_dump(extra, raw=raw) if extra.is_file() else None)

    def content(self, rank: str) -> bytes | None:
        rank_dir = self.path / "step0" / rank
        if (rank_dir / STAGE_OUTPUTS).is_file():
            return None
        try:
            return (rank_dir / DUMP).read_bytes()
        except OSError:  # load() names the file in its one line
            return None

    def digest(self, rank: str) -> str:
        rank_dir = self.path / "step0" / rank
        extra = rank_dir / STAGE_OUTPUTS
        outputs = sha256_file(extra) if extra.is_file() else None
        return rank_digest(sha256_file(rank_dir / DUMP), outputs)

    def index(self, rank: str) -> None:
        """None: a folder's files are not verified by a manifest, so an index beside them is not trusted."""
        return None

    def indexed(self, rank: str) -> bool:
        return False

    def statistics(self) -> int | None:
        return None

    def plain_dir(self, scratch: Path) -> Path:
        return self.path


def _step_of(path: Path) -> int:
    step = path.parent.name.removeprefix("step_")
    return int(step) if step.isdigit() else 0
