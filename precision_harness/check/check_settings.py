"""CheckSettings: what every item of one (target, golden) pair is checked with, passed whole down to the compare."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.item_key import ItemKey
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.options import MSPROBE_TIMEOUT_S


@dataclass(frozen=True)
class CheckSettings:
    """What every item of one (target, golden) pair is checked with."""

    scenario: str
    policy: TolerancePolicy
    artifacts: Path | None = None  #: compare tables and verdicts go to ``<artifacts>/step_<n>/<stage>/``
    shown: Callable[[Path], Path] = Path  #: how a verdict names a path (e.g. relative to rootdir)
    rerun: Callable[[ItemKey], str] | None = None  #: the command that reruns one item
    rerecord: str | None = None  #: the command that re-records the golden
    changed: tuple[str, ...] = ()  #: numeric settings that differ from the golden's, one line each
    #: ask msprobe too on a failing stage (its compare table, first diff, graph); level auto skips it
    #: for the stage it localises, whose L1 rerun gets msprobe's answer instead
    msprobe: bool = True
    #: msprobe's table and first diff of every failing rank, whole; else the first divergent rank's window
    #: (:mod:`precision_harness.check.localize.msprobe_window`)
    msprobe_full: bool = False
    #: seconds msprobe's worker has to answer on a failing stage, else it is killed and the verdict says so (None: no
    #: limit; :mod:`precision_harness.check.localize.msprobe_worker`)
    msprobe_timeout: float | None = float(MSPROBE_TIMEOUT_S)
    #: called with a line per rank of a long stage compare (:class:`~precision_harness.progress.RankProgress`)
    progress: Callable[[str], None] | None = None
    #: the target's environment against the golden's: a failing verdict names it, first where it is a suspect
    environment: EnvironmentDiff = field(default_factory=EnvironmentDiff)
    #: stage dumps of the same run identical to their goldens (sha256): the environment alone does not explain
    #: a drift on this machine
    identical_elsewhere: int = 0
    #: a check that compared less than the golden holds, for a reason nothing declares, passes
    #: (``--precision-allow-uncompared``; :mod:`~precision_harness.check.coverage`)
    allow_uncompared: bool = False
    #: why FSDP2's all-gather buffer rows are not compared: the run, or the golden's, ran without the zero-fill (its
    #: ``env`` says so; :mod:`~precision_harness.check.compare.unfilled`); None: both were filled, every row is compared
    unfilled: str | None = None

    def rerun_of(self, key: ItemKey) -> str | None:
        """The command that reruns ``key`` alone, or None."""
        return self.rerun(key) if self.rerun is not None else None

    @property
    def asks_msprobe(self) -> bool:
        """msprobe is asked of a failing stage: :attr:`msprobe` is on and there are artifacts to write its answer to."""
        return self.msprobe and self.artifacts is not None

    def item_artifacts(self, step: int, stage: str) -> Path | None:
        """``<artifacts>/step_<n>/<stage>``, or None where the settings keep no artifacts."""
        return self.artifacts / f"step_{step}" / stage if self.artifacts is not None else None
