"""Which side is right: the judgement of an API that computes differently, against its float64 replay.

The replay (:mod:`precision_harness.runs.api_replay`) measures the new output exactly: its error
``e_new`` against the float64 reference in three norms, and whether it meets its dtype's standard
(:mod:`precision_harness.runs.api_replay.figures`). The golden keeps only msprobe's statistics of
its output, so its error is known only from below: each of Max, Min, Mean and Norm is 1-Lipschitz
in the tensor, in its norm,

    |Max(g) - Max(r)| <= max|g - r|      |Min(g) - Min(r)| <= max|g - r|
    |Mean(g) - Mean(r)| <= mean|g - r|   |Norm(g) - Norm(r)| <= ||g - r||_2

so ``L = |stat(golden) - stat(reference)| - delta`` (``delta``: what msprobe's own computation of the
statistic may be off by) is a proven lower bound on the golden's error. ``allowance`` is what the
dtype allows the op in that norm: ``m * e_baseline + floor`` (the standard's own bound, ``m`` from
torch._dynamo.utils.same). The verdicts, in this order:

- ``improvement``: the new output meets its standard, and some statistic's ``L`` exceeds both twice
  ``e_new`` and the allowance: the golden is provably more than twice as far from exact, and outside
  what the dtype allows. Review and re-record.
- ``equivalent``: the new output meets its standard, and no golden ``L`` exceeds the allowance: both
  sides as exact as the dtype allows, at this API. It says nothing of the stage's later divergences,
  which were not judged, so it never advises loosening or re-recording the stage.
- ``regression``: the new output fails its standard, and no golden ``L`` exceeds the allowance (the
  golden's statistics show no such error).
- ``undecided`` otherwise, with the reason: both sides beyond the allowance (the replay may not
  compute what the device does), or the golden beyond it but within twice ``e_new`` (neither side
  shown better); and, before any replay, an API that cannot be replayed, inputs that differ from the
  golden's, a rerun that did not reproduce the checked run.

A narrowing is never acquitted: where the output's dtype is narrower than the golden's, the replay holds
it to the golden's dtype's standard (``figures["narrowed"]``), and the verdict is ``regression`` where it
fails or ``undecided``, never ``equivalent`` or ``improvement``. The same holds where the caller knows the
side-by-side verdict is not proven (:func:`held_back`: an input not proven equal to the golden's, an
output of another shape).

A wrong ``improvement`` invites a re-record that erases the regression the gate exists to catch:
it needs a proof on the golden's side, never the absence of one. Statistics cannot prove a golden
accurate, so a regression is established on the new side alone (its standard).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

#: the norm each statistic bounds (module docstring)
STATISTIC_NORM = {"Max": "max_abs", "Min": "max_abs", "Mean": "mean_abs", "Norm": "l2"}
#: what the verdict says after the API, where the judgement rests on statistics of the inputs
INPUTS_BY_STATISTICS = "inputs matched by statistics"


class Verdict(str, Enum):
    """Which side is right (module docstring)."""

    IMPROVEMENT = "improvement"
    REGRESSION = "regression"
    EQUIVALENT = "equivalent"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Judgement:
    """The judgement of one failing stage: its verdict, the API judged, why, and the figures it rests on.

    ``figures`` is the replay's (:func:`precision_harness.runs.api_replay.figures.output_figures`) with the
    golden's bounds (``golden``: per statistic ``{"lower_bound", "allowance", "twice_new"}``) added;
    empty when nothing was replayed.
    """

    verdict: Verdict
    api: str
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def line(self) -> str:
        """The verdict's ``judgement`` line: ``regression at API Functional.linear.0.forward: ...``."""
        return f"{self.verdict.value} at API {self.api}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        """``{"verdict", "api", "reason", "figures"}``, as report.json keeps it (schema ``report``)."""
        return {"verdict": self.verdict.value, "api": self.api, "reason": self.reason, "figures": self.figures}

    @classmethod
    def undecided(cls, api: str, reason: str) -> Judgement:
        return cls(Verdict.UNDECIDED, api, reason)


@dataclass(frozen=True)
class _Bound:
    """One golden statistic: the lower bound on the golden's error it proves, against the allowance and ``2 e_new``."""

    statistic: str
    lower_bound: float
    allowance: float
    twice_new: float

    @property
    def beyond_allowance(self) -> bool:
        return self.lower_bound > self.allowance

    @property
    def proves_improvement(self) -> bool:
        return self.lower_bound > max(self.twice_new, self.allowance)


def golden_bounds(figures: Mapping[str, Any], golden: Mapping[str, float | None]) -> list[_Bound]:
    """The bound each of the golden's recorded statistics proves (statistics it does not record are skipped).

    Args:
        figures: one output's replay figures (``reference``, ``delta``, ``new``, ``baseline``, ``floor``,
            ``standard.multiplier``).
        golden: the golden's Max/Min/Mean/Norm of that output (msprobe's dump.json row).
    """
    m = figures["standard"]["multiplier"]
    bounds = []
    for statistic, norm in STATISTIC_NORM.items():
        value = golden.get(statistic)
        if value is None:
            continue
        lower = abs(value - figures["reference"][statistic]) - figures["delta"][statistic]
        allowance = m * figures["baseline"][norm] + figures["floor"][norm]
        bounds.append(_Bound(statistic, lower, allowance, 2 * figures["new"][norm]))
    return bounds


def judge(api: str, figures: Mapping[str, Any], golden: Mapping[str, float | None]) -> Judgement:
    """The judgement of ``api`` from one output's replay figures and the golden's statistics of that output.

    Args:
        api: the dump.json key judged (``Functional.linear.0.forward``).
        figures: the replay's figures for the output (see :func:`golden_bounds`).
        golden: the golden's Max/Min/Mean/Norm of the same output row.
    """
    bounds = golden_bounds(figures, golden)
    recorded = {**figures, "golden": {b.statistic: _bound_json(b) for b in bounds}}
    standard, dtype = figures["standard"], str(figures["dtype"]).removeprefix("torch.")
    narrowed = figures.get("narrowed")
    if narrowed:
        if not standard["passed"] and not any(b.beyond_allowance for b in bounds):
            return Judgement(Verdict.REGRESSION, api, _narrowed(narrowed) + _regression(standard, dtype), recorded)
        judgement = judge(api, {k: v for k, v in figures.items() if k != "narrowed"}, golden)
        return held_back(replace(judgement, figures=recorded), _narrowed(narrowed).removesuffix(": "))
    proven = [b for b in bounds if b.proves_improvement]
    beyond = [b for b in bounds if b.beyond_allowance]
    if standard["passed"] and proven:
        return Judgement(Verdict.IMPROVEMENT, api, _improvement(proven[0], dtype), recorded)
    if standard["passed"] and not beyond:
        return Judgement(Verdict.EQUIVALENT, api, _equivalent(api, standard, dtype), recorded)
    if not standard["passed"] and not beyond:
        return Judgement(Verdict.REGRESSION, api, _regression(standard, dtype), recorded)
    worst = max(beyond, key=lambda b: b.lower_bound / b.allowance)
    if standard["passed"]:
        reason = (
            f"the golden's {worst.statistic} is at least {worst.lower_bound:.3g} from float64, beyond what {dtype} "
            f"allows ({worst.allowance:.3g}) but within twice the new output's error ({worst.twice_new:.3g}): "
            "neither side is shown better"
        )
    else:
        reason = (
            f"both sides are farther from float64 than {dtype} allows (the new output fails {_failed(standard)}; "
            f"the golden's {worst.statistic} is at least {worst.lower_bound:.3g} off, "
            f"allowance {worst.allowance:.3g}): "
            "the CPU replay may not compute what the device does"
        )
    return Judgement(Verdict.UNDECIDED, api, reason, recorded)


def held_back(judgement: Judgement, why: str | None) -> Judgement:
    """``judgement``, or, where ``why`` says its side-by-side verdict is not proven, ``undecided`` in place of an
    ``equivalent`` or ``improvement`` (a regression stands: it rests on the new output's standard alone)."""
    if why is None:
        return judgement
    if judgement.verdict is Verdict.REGRESSION:
        return replace(judgement, reason=f"{judgement.reason}; {why}")
    if judgement.verdict is Verdict.UNDECIDED:
        return replace(judgement, reason=f"{why}; {judgement.reason}")
    k = judgement.figures.get("standard", {}).get("k")
    figure = f" (the new output's error is {k:.3g}x the baseline's)" if isinstance(k, (int, float)) else ""
    reason = f"{why}; not {judgement.verdict.value} on that basis{figure}"
    return Judgement(Verdict.UNDECIDED, judgement.api, reason, judgement.figures)


def _narrowed(narrowed: Mapping[str, str]) -> str:
    golden, new = (str(narrowed[k]).removeprefix("torch.") for k in ("golden", "new"))
    return f"the output narrowed from {golden} to {new}, held to {golden}'s standard: "


def _bound_json(b: _Bound) -> dict[str, float]:
    return {"lower_bound": b.lower_bound, "allowance": b.allowance, "twice_new": b.twice_new}


def _failed(standard: Mapping[str, Any]) -> str:
    return ", ".join(standard["failed"]) or "its standard"


def _improvement(b: _Bound, dtype: str) -> str:
    return (
        f"more precise now: the golden's {b.statistic} is at least {b.lower_bound:.3g} from float64 (a lower bound "
        f"on its error), more than twice the new output's exact error ({b.twice_new:.3g}) and beyond what {dtype} "
        f"allows ({b.allowance:.3g}); the new output meets the {dtype} standard. Review and re-record the golden "
        f"({INPUTS_BY_STATISTICS})"
    )


def _equivalent(api: str, standard: Mapping[str, Any], dtype: str) -> str:
    return (
        f"both sides as exact as {dtype} allows at {api}: the new output's error is {standard['k']:.3g}x what this "
        f"op costs in {dtype}, and the golden's statistics show no error beyond that; the stage's later "
        f"divergences were not judged ({INPUTS_BY_STATISTICS})"
    )


def _regression(standard: Mapping[str, Any], dtype: str) -> str:
    return (
        f"error = {standard['k']:.3g} x what this op costs in {dtype} (fails {_failed(standard)} against float64), "
        f"while the golden's statistics showed no such error; keep the golden ({INPUTS_BY_STATISTICS})"
    )
