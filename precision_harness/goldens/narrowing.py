"""A narrowed scenario: the golden holds ``(step, stage)`` dumps that the scenario no longer lists.

``global_profiler.steps`` and ``precision_debugger.stages`` stay out of the scenario hash (what a run
computes is the same), and a check builds its items from the scenario. A scenario shortened to save CI
time would so stop gating the golden's other steps and stages without a word; :func:`narrowed` names
them, and the session fails the scenario's items with :meth:`Narrowing.line` (as a stale golden's).

Selecting items (``pytest -k``, a pasted rerun line) is not narrowing: only the scenario's own lists
count. This module imports neither torch nor msprobe.
"""

from __future__ import annotations

from dataclasses import dataclass

from precision_harness.errors import GoldenNarrowedError
from precision_harness.goldens.golden import Golden, update_command
from precision_harness.paths import display_path
from precision_harness.scenarios.scenario import Scenario

#: the scenario fields that list what a check gates
STEPS_FIELD = "global_profiler.steps"
STAGES_FIELD = "global_profiler.global_tool_config.precision_debugger.stages"


@dataclass(frozen=True)
class Narrowing:
    """The golden's stage dumps a scenario does not check (empty: none).

    ``unchecked`` is every such ``(step, stage)``, in step then name order; ``steps`` and ``stages`` name why:
    a golden step the scenario's ``global_profiler.steps`` no longer lists, a golden stage its
    ``precision_debugger.stages`` no longer lists (one pair may be both).
    """

    scenario: str  #: the scenario file, as shown
    unchecked: tuple[tuple[int, str], ...] = ()
    steps: tuple[int, ...] = ()
    stages: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.unchecked)

    def line(self, rerecord: str) -> str:
        """One line naming what the golden holds and the scenario no longer checks, and what to do: ``rerecord``
        (the command that re-records the golden to the scenario's lists), or list them again."""
        held = []
        if self.steps:
            held.append(f"step{'s' if len(self.steps) > 1 else ''} {', '.join(map(str, self.steps))}")
        if self.stages:
            held.append(f"stage{'s' if len(self.stages) > 1 else ''} {', '.join(self.stages)}")
        fields = [f for f, some in ((STEPS_FIELD, self.steps), (STAGES_FIELD, self.stages)) if some]
        count = len(self.unchecked)
        return (
            f"{self.scenario}: the golden holds {' and '.join(held)} that this scenario no longer checks "
            f"({count} stage dump{'s' if count != 1 else ''} of the golden compared by nothing); re-record with: "
            f"{rerecord}, or list {'them' if count > 1 else 'it'} again in {' and '.join(fields)}"
        )


def narrowed(scenario: Scenario, golden: Golden) -> Narrowing:
    """What ``golden`` holds that ``scenario`` (as written, not as a selection runs it) no longer lists.

    Only the golden's top-level stage dumps count: a ``level: auto`` golden's L1 record is read on a failing
    stage's rerun, and follows the same lists.
    """
    listed_steps, listed_stages = set(scenario.steps), set(scenario.stages)
    unchecked = sorted(
        (step, stage) for step, stage in golden.stages() if step not in listed_steps or stage not in listed_stages
    )
    return Narrowing(
        scenario=display_path(scenario.path),
        unchecked=tuple(unchecked),
        steps=tuple(sorted({step for step, _ in unchecked if step not in listed_steps})),
        stages=tuple(sorted({stage for _, stage in unchecked if stage not in listed_stages})),
    )


def check_narrowing(scenario: Scenario, golden: Golden) -> None:
    """Raise where ``scenario`` no longer checks all that ``golden`` holds.

    Raises:
        GoldenNarrowedError: one line (:meth:`Narrowing.line`), carrying the :class:`Narrowing`.
    """
    narrowing = narrowed(scenario, golden)
    if narrowing:
        raise GoldenNarrowedError(narrowing.line(update_command(scenario)), narrowing)
