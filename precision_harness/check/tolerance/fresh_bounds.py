"""Fresh steps (``verl.fresh_steps``): the rollout-training mismatch of rollouts sampled afresh, against bounds.

A fresh step samples its own rollouts, so its tokens, rewards and statistics have no golden to be compared with. What
stays comparable is how far the rollout engine's log-probs are from the training forward's on whatever was sampled:
verl's mismatch metrics (:data:`~precision_harness.scenarios.fresh_steps.MISMATCH_METRICS`). Their spread comes from
sampling and the engine's run-to-run noise, which only reruns measure, so the bound of each metric at each fresh step
is made of what was observed on the recording host:

- the recording run's value (the golden manifest's ``fresh_rollouts``, written when the golden is recorded);
- each ``precision-harness calibrate`` rerun's value (the manifest's ``noise.fresh_rollouts``).

With ``hi`` and ``lo`` the largest and smallest of them, the bound is ``hi + max(k x (hi - lo), FLOOR x |hi|)``:

- **k** is calibration's own (``noise.k``, default 3, :mod:`.calibrate` says why): the bound must cover a rarer run
  than the largest of a few reruns.
- **FLOOR = 5 %** of the recorded size. Where reruns never moved (the CPU, where sampling is seeded and bitwise), the
  spread is 0 and the bound would be the value itself; a rise smaller than 5 % of the recorded mismatch is not called
  a regression. The failures this gate exists for move the metric by orders of magnitude (a bf16 log-prob against
  fp32 training: docs/consistency.md).

Only a rise fails: a mismatch below everything observed means rollout and training agree better, and the verdict says
so. The bound is one-sided because every metric gated here grows with disagreement.

Pure: no file I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from precision_harness.check.tolerance.calibrate import DEFAULT_K
from precision_harness.scenarios.fresh_steps import FRESH_CHECK

#: the smallest rise called a regression, relative to the largest observed value
FLOOR = 0.05


@dataclass(frozen=True)
class FreshBound:
    """One metric's bound at one fresh step, from ``observed`` (the recording run's value first)."""

    metric: str
    observed: tuple[float, ...]
    k: float = DEFAULT_K

    @property
    def high(self) -> float:
        hi, lo = max(self.observed), min(self.observed)
        return hi + max(self.k * (hi - lo), FLOOR * abs(hi))

    def holds(self, value: float) -> bool:
        return value <= self.high

    def describe(self, value: float) -> str:
        """``training/rollout_probs_diff_max 1.2e-06 <= 1.26e-06``, with ``>`` where broken and a note where the
        value is below every observation."""
        if not self.holds(value):
            return f"{self.metric} {value:.6g} > {self.high:.3g} (recorded {_range(self.observed)})"
        better = " (below every observation: closer agreement)" if value < min(self.observed) else ""
        return f"{self.metric} {value:.6g} <= {self.high:.3g}{better}"


@dataclass(frozen=True)
class FreshVerdict:
    passed: bool
    text: str


def _range(values: tuple[float, ...]) -> str:
    lo, hi = min(values), max(values)
    return f"{hi:.6g}" if lo == hi else f"{lo:.6g}..{hi:.6g}"


def bounds(recorded: Mapping[str, float], calibrated: Mapping[str, list[float]] | None, k: float) -> list[FreshBound]:
    """The bound of each metric the recording run logged at one fresh step: its value, then the calibration
    reruns' (``calibrated``: metric -> one value per rerun; None where the golden was not calibrated)."""
    calibrated = calibrated or {}
    return [FreshBound(m, (float(v), *map(float, calibrated.get(m, []))), k) for m, v in sorted(recorded.items())]


def check_step(
    step: int, measured: Mapping[str, float] | None, golden: Mapping[str, Any], noise: Mapping[str, Any] | None
) -> FreshVerdict:
    """The verdict of fresh step ``step``: the run's mismatch metrics there (``measured``, metric -> value, as
    :func:`~precision_harness.goldens.manifest.fresh_rollouts` reads them; None: the run logged no row) against the
    golden manifest's ``fresh_rollouts`` (``golden``: step -> metric -> value) and calibration (``noise``: the
    manifest's ``noise``, whose ``fresh_rollouts`` is step -> metric -> values, one per rerun).

    Fails where a metric rose past its bound, where the run logged no row or not a metric the recording did, and
    where the golden holds no bound for the step (it predates the step: re-record)."""
    where = f"{FRESH_CHECK} @ step_{step}"
    recorded = golden.get(str(step))
    if not recorded:
        return FreshVerdict(False, f"{where}: the golden holds no mismatch bounds for step {step}; re-record it")
    if measured is None:
        return FreshVerdict(False, f"{where}: the run logged no metrics for step {step}")
    noise = noise or {}
    calibrated = (noise.get("fresh_rollouts") or {}).get(str(step))
    missing = [m for m in sorted(recorded) if m not in measured]
    if missing:
        return FreshVerdict(False, f"{where}: the run logged no finite {missing[0]} (the recording did)")
    all_bounds = bounds(recorded, calibrated, float(noise.get("k", DEFAULT_K)))
    broken = [b for b in all_bounds if not b.holds(measured[b.metric])]
    shown = ", ".join(b.describe(measured[b.metric]) for b in (broken or all_bounds))
    return FreshVerdict(not broken, f"{where}: {shown}; {_basis(calibrated)}")


def _basis(calibrated: Mapping[str, list[float]] | None) -> str:
    reruns = max((len(v) for v in (calibrated or {}).values()), default=0)
    if not reruns:
        return "bounds from the recording run alone (precision-harness calibrate measures the spread between reruns)"
    return f"bounds from the recording run and {reruns} calibration reruns"
