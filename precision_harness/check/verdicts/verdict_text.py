"""Verdict text: what a failing (or passing) stage or metrics item prints.

:func:`stage_text` follows the layout users read in CI logs (see README, "A failing stage reads
like this"): the headline with counts and tolerance, then the lines by what explains the drift (a
setting that changed, where the change entered and its judgement), the evidence (first divergence,
largest drift, always-failures), msprobe's answer where it adds something, artifacts, rerun. A
failing verdict whose environment differs from the golden's says so first, right after its headline:
an upgrade is what a user runs the gate for, and which software moved is read before anything else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness.check.compare import unfilled
from precision_harness.check.compare.code_path import CodePathChange, describe
from precision_harness.check.compare.drift_set import Drift
from precision_harness.check.compare.metrics import MetricsVerdict
from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.localize.drift_origin import LABEL as ORIGIN_LABEL
from precision_harness.check.localize.drift_origin import DriftOrigin
from precision_harness.check.localize.msprobe_tools import MsprobeAnswer
from precision_harness.check.recording import added_line, lost_line

#: problems listed before "... and N more"
MAX_PROBLEMS = 5
#: the label of the judgement's line (right after the ``change entered`` line)
JUDGEMENT_LABEL = "judgement"
#: the label of the line that reports a changed code path (:mod:`precision_harness.check.compare.code_path`)
CODE_PATH_LABEL = "code path"
#: the label of the lines that say what one side's msprobe records and the other's does not (check.recording)
RECORDED_LABEL = "recorded"


#: significant digits a verdict value starts at; more are added only where a pair needs them
MIN_DIGITS = 7
#: enough for any two different float64 values to print differently
MAX_DIGITS = 17


def _num(x: float | None, digits: int = MIN_DIGITS) -> str:
    return "None" if x is None else f"{x:.{digits}g}"


def pair(golden: float | None, target: float | None) -> str:
    """``"golden -> target"`` with the fewest digits (7 to 17) at which two different values read differently.

    At a fixed 7 digits ``0.99990001 -> 0.99990002`` would print ``0.9999 -> 0.9999``: a failing
    verdict that shows equal numbers.
    """
    for digits in range(MIN_DIGITS, MAX_DIGITS + 1):
        g, t = _num(golden, digits), _num(target, digits)
        if g != t or golden == target:
            break
    return f"{g} -> {t}"


def _how_far(ratio: float, rel: float, *, exact: bool) -> str:
    if math.isinf(ratio):
        return f"rel {rel:.1e}, must match exactly" if exact else "non-finite"
    return f"rel {rel:.1e}, {ratio:.3g}x tolerance"


def _drift_line(label: str, d: Drift, multi_rank: bool) -> str:
    rank = f"{d.rank} " if multi_rank else ""
    how = _how_far(d.ratio, d.rel, exact=d.tol.rtol == 0 and d.tol.atol == 0)
    return _label(label, f"{rank}{d.tensor}  {d.statistic} {pair(d.golden, d.target)} ({how})")


def settings_changed(golden: dict[str, Any] | None, current: dict[str, Any] | None) -> list[str]:
    """``["actor_rollout_ref.actor.optim.lr: 0.001 -> 0.002", ...]`` between two numeric-settings maps."""
    if not golden or current is None:
        return []
    keys = sorted(set(golden) | set(current))
    return [f"{k}: {golden.get(k)} -> {current.get(k)}" for k in keys if golden.get(k) != current.get(k)]


@dataclass(frozen=True)
class Reading:
    """What explains one failing stage, for :func:`stage_text` to order (the first line steers the user).

    Attributes:
        origin: where the change entered (:func:`~precision_harness.check.localize.drift_origin.classify`).
        judgement: the judgement's line (:mod:`precision_harness.check.verdicts.judgement`), said right after the
            origin.
        changed: numeric settings that differ from the golden's, one line each.
        environment: the run's environment against the golden's.
        identical_elsewhere: other stage dumps of the same run identical to their goldens (sha256): on
            the same machine, so the environment alone does not explain a drift.
        msprobe: msprobe's own answer (first diff, graph, its errors), shown where it adds something.
        graph_dir: where msprobe's graph is, as the verdict names it.
    """

    origin: DriftOrigin | None = None
    judgement: str | None = None
    changed: tuple[str, ...] = ()
    environment: EnvironmentDiff = field(default_factory=EnvironmentDiff)
    identical_elsewhere: int = 0
    msprobe: MsprobeAnswer | None = None
    graph_dir: Path | None = None

    @property
    def exonerates_environment(self) -> bool:
        """The environment differs, and other stages of the run held on this machine."""
        return self.environment.differs and self.identical_elsewhere > 0

    def environment_line(self) -> str | None:
        """The environment's line: the difference, and when other stages held, that it alone does not explain."""
        line = self.environment.headline()
        if line is not None and self.exonerates_environment:
            line += (
                f"; alone it does not explain this drift: {self.identical_elsewhere} other stage dump(s) of this run "
                "are identical to their goldens on this machine"
            )
        return line


def _label(label: str, text: str) -> str:
    return f"  {label:<18}{text}"


def _passed_text(v: StageVerdict, reading: Reading, where: str, rerecord: str | None) -> str:
    """A passing stage's verdict: its headline, then a changed code path, what only one side recorded, the rows left
    out."""
    how = "identical to the golden (sha256)" if v.identical else f"within tolerance ({v.tolerance})"
    line = code_path_line(v, reading.environment, rerecord=rerecord)
    allowed = f"; {len(v.unchecked)} tensor row(s) unchecked, allowed by tolerance.unchecked" if v.unchecked else ""
    text = f"{where}: {v.checked} statistics {how}{allowed}"
    text += f"\n{_label(CODE_PATH_LABEL, line)}" if line else ""
    recorded = added_line(v.recording, reading.environment)
    text += f"\n{_label(RECORDED_LABEL, recorded)}" if recorded else ""
    left_out = unfilled.line(v)
    return text + (f"\n{_label(unfilled.LABEL, left_out)}" if left_out else "")


def _failing_headline(v: StageVerdict, where: str) -> str:
    """A failing stage's first line: where (on several ranks, the rank that diverged first, then every rank that
    differs), and what failed."""
    if len(v.ranks) > 1 and v.failing_ranks:
        first_rank = v.first_divergence.rank if v.first_divergence is not None else v.failing_ranks[0]
        where = (
            f"{v.stage} @ step_{v.step}, {first_rank} (differs on {', '.join(v.failing_ranks)} of {len(v.ranks)} ranks)"
        )
    if v.drifts:
        return f"{where}: {v.beyond} of {v.checked} statistics beyond tolerance ({v.tolerance})"
    if v.problems:
        return f"{where}: {len(v.problems)} structural difference(s) from the golden"
    if v.failing_unchecked:
        return f"{where}: {len(v.failing_unchecked)} tensor row(s) compared by nothing, {v.checked} statistics compared"
    if v.recording.loses and not v.failing_code_paths:
        lost, calls = sum(v.recording.lost.values()), sum(v.recording.calls_lost.values())
        what = f"{lost} statistic(s)" if not calls else f"{calls} call(s) and {lost} statistic(s)"
        return f"{where}: coverage lost: {what} of the golden not recorded, {v.checked} compared"
    return f"{where}: the code path changed in {len(v.failing_code_paths)} place(s), {v.checked} statistics compared"


def stage_text(
    v: StageVerdict,
    reading: Reading | None = None,
    *,
    artifacts: Path | None = None,
    rerun: str | None = None,
    rerecord: str | None = None,
) -> str:
    """The verdict of one stage, as in the README's "A failing stage reads like this".

    After the headline come the environment's difference from the golden's (with, where other stages
    of the run held on this machine, that it alone does not explain the drift), then what explains the
    drift: a changed setting, where the change entered (``change entered``) and its judgement, then
    the evidence (first divergence, largest drift, always-failures, changed code paths), msprobe's
    answer where it adds something, artifacts and the rerun line. A passing stage whose code path changed
    says so (``rerecord``: the command that refreshes the golden).
    """
    reading = reading or Reading()
    ranks = ", ".join(v.ranks) or "rank0"
    where = f"{v.stage} @ step_{v.step}, {ranks}"
    if v.passed:
        return _passed_text(v, reading, where, rerecord)
    lines = [_failing_headline(v, where)]
    environment = reading.environment_line()
    if environment:
        lines.append(f"  {environment}")
    lines += _explanations(reading)
    lines += _evidence(v)
    changes = reading.environment
    recorded = lost_line(v.recording, changes, rerecord=rerecord), added_line(v.recording, changes)
    lines += [_label(RECORDED_LABEL, line) for line in recorded if line]
    lines += [_label(unfilled.LABEL, line) for line in (unfilled.line(v),) if line]
    lines += [_label(label, text) for label, text in msprobe_rows(reading)]
    if artifacts is not None:
        lines.append(_label("artifacts", f"{artifacts}/"))
    if rerun:
        lines.append(_label("rerun", rerun))
    return "\n".join(lines)


def _explanations(reading: Reading) -> list[str]:
    """A changed setting, where the change entered and its judgement."""
    lines = [_label("setting changed", line) for line in reading.changed]
    if reading.origin is not None:
        lines.append(_label(ORIGIN_LABEL, reading.origin.summary))
    if reading.judgement:
        lines.append(_label(JUDGEMENT_LABEL, reading.judgement))
    return lines


def _evidence(v: StageVerdict) -> list[str]:
    """The first divergence, the largest drift and the always-failures."""
    multi = len(v.ranks) > 1
    first, largest = v.first_divergence, v.largest
    lines = []
    if first is not None:
        lines.append(_drift_line("first divergence", first, multi))
    if largest is not None and largest is not first:
        lines.append(_drift_line("largest", largest, multi))
    lines += [_label("always fails", str(problem)) for problem in v.problems[:MAX_PROBLEMS]]
    if len(v.problems) > MAX_PROBLEMS:
        lines.append(_label("", f"... and {len(v.problems) - MAX_PROBLEMS} more"))
    unchecked = v.failing_unchecked
    for rank, name in unchecked[:MAX_PROBLEMS]:
        where = f"{rank}: " if multi else ""
        lines.append(_label("unchecked", f"{where}{name}: msprobe recorded no statistics on either side"))
    if unchecked:
        more = f"... and {len(unchecked) - MAX_PROBLEMS} more; " if len(unchecked) > MAX_PROBLEMS else ""
        lines.append(
            _label("", f"{more}allow them by name only where nothing else can compare them: tolerance.unchecked")
        )
    failing = v.failing_code_paths
    groups: dict[str, list[CodePathChange]] = {}
    for change in failing:
        groups.setdefault(change.block.what, []).append(change)
    for what, changes in list(groups.items())[:MAX_PROBLEMS]:
        first = changes[0]
        rank = f"{first.rank}: " if multi else ""
        more = f" (x{len(changes)}, the first shown)" if len(changes) > 1 else ""
        lines.append(_label(CODE_PATH_LABEL, f"{rank}{what}{more}: {first.evidence}"))
    others = [c for c in v.code_paths if c not in failing]
    matching, undecided = [c for c in others if not c.undecided], [c for c in others if c.undecided]
    if matching:
        lines.append(
            _label(CODE_PATH_LABEL, f"{len(matching)} other changed block(s) whose values match: {describe(matching)}")
        )
    if undecided:
        said = f"{len(undecided)} other changed block(s) undecided, no tensor leaves them: {describe(undecided)}"
        lines.append(_label(CODE_PATH_LABEL, said))
    return lines


def code_path_line(v: StageVerdict, environment: EnvironmentDiff, *, rerecord: str | None = None) -> str | None:
    """What a stage says of its changed code paths: the likely cause (the software that differs from the
    golden's), what changed and where, how its paired values compare, and, where the stage passes with every
    value within tolerance, how to refresh (a failing stage's verdict says why it fails: no re-record is
    offered). None: nothing changed."""
    if not v.code_paths:
        return None
    software = "; ".join(map(str, environment.software))
    cause = f"{software} changed the code path" if software else "the code path changed"
    paired, decided = v.profile.max_ratio(), [c.ratio for c in v.code_paths if not c.undecided]
    leaving = max(decided, default=0.0)
    values = _values("every paired value", "paired values", paired)
    if decided:
        leaving_values = "the values leaving the changed calls"
        values += ", " + _values(leaving_values, leaving_values, leaving)
    if len(decided) < len(v.code_paths):
        values += f", {len(v.code_paths) - len(decided)} changed block(s) undecided: no tensor leaves them"
    if not (v.passed and paired <= 1 and leaving <= 1):  # NaN compares False: never offered a re-record
        return f"{cause}: {describe(v.code_paths)}; {values}"
    again = f": {rerecord}" if rerecord else ""
    return f"{cause}: {describe(v.code_paths)}; {values}; re-record to refresh{again}"


def _values(every: str, some: str, ratio: float) -> str:
    """How values compare by their worst tolerance ratio: ``every`` value identical or within tolerance, else
    ``some`` beyond it. A non-finite ratio (a dtype, shape or finiteness that changed, an exact value that moved;
    NaN, which no comparison orders) is never within tolerance."""
    if ratio == 0:
        return f"{every} identical"
    if ratio <= 1:
        return f"{every} within tolerance (worst {ratio:.3g}x)"
    if math.isfinite(ratio):
        return f"{some} beyond tolerance (worst {ratio:.3g}x)"
    return (
        f"{some} beyond tolerance (worst ratio {ratio}: a dtype, shape or finiteness changed, or an exact value moved)"
    )


def msprobe_rows(reading: Reading) -> list[tuple[str, str]]:
    """msprobe's rows where they add something to the gate's own answer.

    Its first diff (DiffAnalyzer: the first op whose output moved past 50 %) is left out when it
    names the API where the change entered, or nothing; otherwise it is said with what it means:
    where the drift grew large, after the change entered. Its graph and its own errors always show.
    """
    answer = reading.msprobe
    if answer is None:
        return []
    rows = []
    ours = {reading.origin.api} if reading.origin is not None else set()
    theirs = {op for op in answer.first_diff.values() if op not in ours}
    if theirs:
        named = ", ".join(
            f"{r} {op}" if len(answer.first_diff) > 1 else op for r, op in sorted(answer.first_diff.items())
        )
        meaning = (
            "the first output past DiffAnalyzer's 50 % threshold: where the drift grew large, after the change entered"
            if reading.origin is not None
            else "the first output past DiffAnalyzer's 50 % threshold (DiffAnalyzer)"
        )
        rows.append(("msprobe 1st diff", f"{named}: {meaning}"))
    if answer.scope:
        rows.append(("msprobe read", answer.scope))
    if answer.graphs and reading.graph_dir is not None:
        rows.append(("graph", f"tensorboard --logdir {reading.graph_dir}"))
    rows += [("msprobe", err) for err in answer.errors[:2]]
    return rows


def with_judgement(text: str, judgement: str, *, last: bool = False) -> str:
    """``text`` (a stage verdict) with the ``judgement`` line right after its ``change entered`` line, indented
    as that line is (the last such line when ``last``: a ``localized at L1`` block's)."""
    lines = text.splitlines()
    found = [i for i, line in enumerate(lines) if line.lstrip().startswith(ORIGIN_LABEL + " ")]
    if not found:
        return f"{text}\n{_label(JUDGEMENT_LABEL, judgement)}"
    at = found[-1] if last else found[0]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at + 1, indent + f"{JUDGEMENT_LABEL:<18}{judgement}")
    return "\n".join(lines)


def metrics_text(
    v: MetricsVerdict,
    *,
    rerun: str | None = None,
    changed: Sequence[str] | None = None,
    policy_exact: bool = False,
    environment: str | None = None,
) -> str:
    """The verdict of a scenario's metrics.jsonl item (``environment`` first after a failing headline)."""
    if v.passed:
        return f"metrics.jsonl: {v.checked} values within tolerance"
    lines = [
        f"metrics.jsonl: {len(v.drifts)} of {v.checked} values beyond tolerance"
        if v.drifts
        else f"metrics.jsonl: {len(v.problems)} structural difference(s)"
    ]
    if environment:
        lines.append(f"  {environment}")
    for d in sorted(v.drifts, key=lambda d: -d.ratio)[:MAX_PROBLEMS]:
        lines.append(
            f"  step_{d.step:<3} {d.name:<34} {pair(d.golden, d.target)} "
            f"({_how_far(d.ratio, d.rel, exact=policy_exact)})"
        )
    if len(v.drifts) > MAX_PROBLEMS:
        lines.append(f"  ... and {len(v.drifts) - MAX_PROBLEMS} more")
    for problem in v.problems[:MAX_PROBLEMS]:
        lines.append(f"  always fails  {problem}")
    for line in changed or []:
        lines.append(f"  setting changed  {line}")
    if rerun:
        lines.append(f"  rerun  {rerun}")
    return "\n".join(lines)
