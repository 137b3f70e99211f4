"""Verdict text: what a failing (or passing) stage or metrics item prints.

:func:`stage_text` follows the layout users read in CI logs (see README, "A failing stage reads
like this"): the headline with counts and tolerance, the first divergence in execution order, the
largest drift, msprobe's own answer, always-failures, the setting that changed, artifacts, rerun.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from precision_harness.check.compare import Drift, MetricsVerdict, StageVerdict

#: problems listed before "... and N more"
MAX_PROBLEMS = 5


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
    return f"  {label:<18}{rank}{d.tensor}  {d.statistic} {pair(d.golden, d.target)} ({how})"


def settings_changed(golden: dict[str, Any] | None, current: dict[str, Any] | None) -> list[str]:
    """``["actor_rollout_ref.actor.optim.lr: 0.001 -> 0.002", ...]`` between two numeric-settings maps."""
    if not golden or current is None:
        return []
    keys = sorted(set(golden) | set(current))
    return [f"{k}: {golden.get(k)} -> {current.get(k)}" for k in keys if golden.get(k) != current.get(k)]


def stage_text(
    v: StageVerdict,
    *,
    artifacts: Path | None = None,
    rerun: str | None = None,
    changed: Sequence[str] | None = None,
    msprobe: list[tuple[str, str]] | None = None,
    environment: str | None = None,
) -> str:
    """The verdict of one stage, as in the README's "A failing stage reads like this".

    ``environment`` (the run's environment against the golden's, when it differs) is the first line
    after the headline: after an upgrade it is the first suspect. ``msprobe`` rows (label, text),
    msprobe's own first diff and graph command, follow ours.
    """
    ranks = ", ".join(v.ranks) or "rank0"
    where = f"{v.stage} @ step_{v.step}, {ranks}"
    if v.passed:
        how = "identical to the golden (sha256)" if v.identical else f"within tolerance ({v.tolerance})"
        return f"{where}: {v.checked} statistics {how}"
    if len(v.ranks) > 1 and v.failing_ranks:
        # multi-rank: name the rank that diverged first, then every rank that differs
        first_rank = v.first_divergence.rank if v.first_divergence is not None else v.failing_ranks[0]
        where = (
            f"{v.stage} @ step_{v.step}, {first_rank} (differs on {', '.join(v.failing_ranks)} of {len(v.ranks)} ranks)"
        )
    lines = []
    n = len({(d.rank, d.tensor, d.statistic) for d in v.drifts})
    if v.drifts:
        lines.append(f"{where}: {n} of {v.checked} statistics beyond tolerance ({v.tolerance})")
    else:
        lines.append(f"{where}: {len(v.problems)} structural difference(s) from the golden")
    if environment:
        lines.append(f"  {environment}")
    multi = len(v.ranks) > 1
    first, largest = v.first_divergence, v.largest
    if first is not None:
        lines.append(_drift_line("first divergence", first, multi))
    if largest is not None and largest is not first:
        lines.append(_drift_line("largest", largest, multi))
    for label, text in msprobe or []:
        lines.append(f"  {label:<18}{text}")
    for problem in v.problems[:MAX_PROBLEMS]:
        lines.append(f"  {'always fails':<18}{problem}")
    if len(v.problems) > MAX_PROBLEMS:
        lines.append(f"  {'':<18}... and {len(v.problems) - MAX_PROBLEMS} more")
    for line in changed or []:
        lines.append(f"  {'setting changed':<18}{line}")
    if artifacts is not None:
        lines.append(f"  {'artifacts':<18}{artifacts}/")
    if rerun:
        lines.append(f"  {'rerun':<18}{rerun}")
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
