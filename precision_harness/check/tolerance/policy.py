"""TolerancePolicy: how far a statistic may move from its golden before a stage fails.

Check, per statistic: ``|target - golden| <= atol + rtol * scale`` where ``scale = |golden|`` for
Max, Min and Norm, and ``scale = golden Norm / sqrt(numel)`` (the RMS) for Mean, since means near
zero have no useful relative error (docs/msprobe.md#determinism: 317 % relative Mean changes from
summation order alone). The rtol defaults by dtype are ``torch.testing.assert_close``'s table. The
default atol scales with the golden tensor (docs/tolerance.md#atol-scales-with-the-tensor):
``max(floor, rtol x RMS)`` for Max and Min, the floor alone for Mean, Norm and scalar values, where
the floor is msprobe's absolute threshold for small values (:data:`ATOL_FLOOR`). Overrides from the
scenario's ``tolerance:`` section, most specific first: API glob > statistic > stage > dtype >
built-in default; an override may set only ``rtol`` or only ``atol`` (an explicit ``atol`` replaces
the scaled one). ``mode: exact`` demands bitwise-equal statistics (rtol = atol = 0).

Calibrated noise (``precision-harness calibrate``, stored in the golden manifest's ``noise``) can
only widen a tolerance, per tensor row and statistic: ``rtol = max(k x observed, floor)`` where the
floor is the rtol resolved above, see :meth:`TolerancePolicy.with_noise`.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from precision_harness.dumps.statistics import STATISTICS


@dataclass(frozen=True)
class Tol:
    """Relative and absolute tolerance (dimensionless / in the tensor's units)."""

    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"


#: ``torch.testing.assert_close`` defaults; integer and bool tensors must match exactly. The gate takes their
#: rtol; their atol (1e-5, for elements of order 1) serves elementwise checks of values of order 1 only
#: (the invariants' log-probs), the gate's atol scales with the tensor (:data:`ATOL_FLOOR`, :func:`scaled_atol`).
DTYPE_DEFAULTS: dict[str, Tol] = {
    "float64": Tol(1e-7, 1e-7),
    "float32": Tol(1.3e-6, 1e-5),
    "bfloat16": Tol(1.6e-2, 1e-5),
    "float16": Tol(1e-3, 1e-5),
}
#: The smallest atol of a float statistic: msprobe's absolute-threshold standard's error allowed on a value it
#: calls small (``StandardConfig._threshold_small_value_atol`` in mindstudio-probe 26.2.0,
#: ``msprobe/pytorch/api_accuracy_checker/precision_standard/standard_config.py``; float64 takes its "default").
ATOL_FLOOR: dict[str, float] = {"float64": 2**-30, "float32": 2**-30, "bfloat16": 1e-16, "float16": 2**-16}
#: the statistics whose own magnitude says nothing of their precision: an extreme near zero of a tensor whose
#: elements are of order RMS carries the error of those elements (Mean is judged against the RMS already,
#: Norm = sqrt(numel) x RMS is never below it)
RMS_ATOL_STATISTICS = frozenset({"Max", "Min"})
EXACT = Tol(0.0, 0.0)
#: Defaults when the golden was recorded on another device (``--precision-golden-device``): kernels
#: differ (NPU vs GPU vs CPU matmul tiling, fused softmax), so fp32 gets msprobe's "one per mille"
#: and half types twice their same-device rtol; atol scales with the tensor as on one device, from these
#: rtols. A scenario's ``tolerance.cross_device`` overrides these.
CROSS_DEVICE_DTYPES: dict[str, dict[str, float]] = {
    "float64": {"rtol": 1e-6},
    "float32": {"rtol": 1e-3},
    "bfloat16": {"rtol": 3.2e-2},
    "float16": {"rtol": 2e-3},
}
CROSS_DEVICE_METRICS: dict[str, dict[str, float]] = {"*": {"rtol": 1e-3}}
#: metrics.jsonl values are python floats computed in fp32, each judged against its own golden value
#: (``rtol x |golden|``); their atol is the fp32 floor, so a metric of order 1e-6 is gated.
METRIC_DEFAULT = Tol(DTYPE_DEFAULTS["float32"].rtol, ATOL_FLOOR["float32"])


def short_dtype(dtype: str) -> str:
    """``"torch.float32"`` -> ``"float32"``; other strings pass through."""
    return dtype.rsplit(".", 1)[-1]


def scaled_atol(dtype: str, statistic: str, rtol: float, rms: float | None) -> float:
    """The default atol of one statistic of a float tensor (``dtype`` short, e.g. ``"float32"``).

    ``max(ATOL_FLOOR[dtype], rtol x rms)`` for Max and Min, ``ATOL_FLOOR[dtype]`` for the rest (and where
    ``rms``, the golden tensor's ``Norm / sqrt(numel)`` in its own units, is None or not finite). The
    source and the reasons: docs/tolerance.md#atol-scales-with-the-tensor.
    """
    floor = ATOL_FLOOR[dtype]
    if statistic in RMS_ATOL_STATISTICS and rms is not None:
        return rms_atol(floor, rtol, float(rms))
    return floor


def rms_atol(floor: Any, rtol: Any, rms: Any) -> Any:
    """``max(floor, rtol x |rms|)``, or ``floor`` where ``rms`` is NaN or infinite: the atol of Max and Min, on floats
    (:func:`scaled_atol`) or elementwise on arrays (:meth:`TolerancePolicy.tolerance_arrays`): the one place the rule
    is written, its float form beside its array form (through numpy, ``for_tensor`` of a Max took 11.9 µs, not 4.3), the
    two checked float for float by tests/test_tolerance_per_tensor.py. docs/tolerance.md#atol-scales-with-the-tensor."""
    if isinstance(rms, float):  # one row (for_tensor, per statistic): the same floats without numpy's per-call cost
        return max(floor, rtol * abs(rms)) if math.isfinite(rms) else floor
    with np.errstate(invalid="ignore"):
        return np.fmax(floor, rtol * np.where(np.isfinite(rms), np.abs(rms), np.nan))


def widened_rtol(rtol: float, k: float, observed: float) -> float:
    """A float row's rtol widened by its calibrated noise: ``max(rtol, k x observed)``, ``rtol`` where none was
    observed (``calibrate.py``; docs/tolerance.md)."""
    return max(rtol, k * observed) if observed else rtol


def _apply(base: Tol, override: Mapping[str, float] | None) -> Tol:
    if not override:
        return base
    return Tol(override.get("rtol", base.rtol), override.get("atol", base.atol))


#: calibrated noise per row: stage -> msprobe row name -> statistic -> observed relative change
RowNoise = Mapping[str, Mapping[str, Mapping[str, float]]]


@dataclass(frozen=True)
class TolerancePolicy:
    """Resolved tolerance rules of one scenario (its ``tolerance:`` section)."""

    mode: str = "tolerance"
    dtypes: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    stages: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    statistics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    apis: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: calibrated noise of a manifest written before per-row calibration: stage -> statistic -> the stage's
    #: largest relative change between reruns (empty where ``row_noise`` applies)
    noise: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: calibrated noise per tensor row: stage -> row name -> statistic -> its relative change between reruns
    row_noise: RowNoise = field(default_factory=dict)
    noise_k: float = 0.0
    #: ``report``: a changed code path whose values match the golden's passes, reported; ``fail``: it fails
    code_path: str = "report"
    #: globs of tensor rows (or their APIs) that may go unchecked: msprobe records no statistics of them
    unchecked: tuple[str, ...] = ()
    #: (dtype, stage, statistic, api or "") -> (rtol, explicit atol or None): the rules resolved once
    _rules: dict[tuple[str, str, str, str], tuple[float, float | None]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> TolerancePolicy:
        """Build from a scenario's ``tolerance`` mapping (already schema-validated)."""
        section = dict(section or {})
        return cls(
            mode=section.get("mode", "tolerance"),
            dtypes=dict(section.get("dtypes", {})),
            stages=dict(section.get("stages", {})),
            statistics=dict(section.get("statistics", {})),
            apis=dict(section.get("apis", {})),
            metrics=dict(section.get("metrics", {})),
            code_path=section.get("code_path", "report"),
            unchecked=tuple(section.get("unchecked", ())),
        )

    def with_noise(self, noise: Mapping[str, Any] | None) -> TolerancePolicy:
        """This policy widened by a golden manifest's calibrated ``noise`` section (None: unchanged).

        Per tensor row and statistic (the manifest's ``noise.rows``), ``rtol = max(k x observed, floor)``:
        ``observed`` is that row's largest change between reruns that should not matter (thread counts,
        process restarts) over the row's own scale (``|golden|``, for Mean its RMS), ``floor`` is the rtol
        this policy gives without calibration (``assert_close``'s dtype default or the scenario's override).
        A row absent from ``noise.rows`` reproduced bitwise and keeps its floor. A manifest written before
        per-row calibration has only ``noise.stages`` (stage -> statistic -> the stage's largest change):
        it widens every row of the stage, as it did when it was recorded. Megatron uses k = 1.5 and a
        fixed floor of 1e-3; we use k = 3 (``calibrate.DEFAULT_K``, see its docstring) and a dtype floor,
        because on CPU reruns are usually bit-identical (observed = 0) and a fixed 1e-3 would loosen an
        fp32 gate by three orders of magnitude. ``mode: exact`` ignores calibration.
        """
        if not noise or self.exact:
            return self
        k = float(noise.get("k", 0.0))
        if "rows" in noise:
            return replace(self, noise={}, row_noise=dict(noise["rows"]), noise_k=k)
        return replace(self, noise=dict(noise.get("stages", {})), row_noise={}, noise_k=k)

    @classmethod
    def cross_device_from_config(cls, section: Mapping[str, Any] | None) -> TolerancePolicy:
        """Policy against a golden recorded on another device.

        ``tolerance.cross_device`` over :data:`CROSS_DEVICE_DTYPES`.

        The same-device rules are not inherited (a bitwise or tight same-device rule says nothing
        about another device's kernels); ``mode`` defaults to ``tolerance``.
        """
        cross = dict((section or {}).get("cross_device") or {})
        return cls(
            mode=cross.get("mode", "tolerance"),
            dtypes={**CROSS_DEVICE_DTYPES, **cross.get("dtypes", {})},
            stages=dict(cross.get("stages", {})),
            statistics=dict(cross.get("statistics", {})),
            apis=dict(cross.get("apis", {})),
            metrics={
                **cross.get("metrics", {}),
                **{k: v for k, v in CROSS_DEVICE_METRICS.items() if k not in cross.get("metrics", {})},
            },
        )

    @classmethod
    def for_golden(
        cls, section: Mapping[str, Any] | None, *, noise: Mapping[str, Any] | None, cross_device: bool
    ) -> TolerancePolicy:
        """The policy a check against a golden uses: the scenario's ``tolerance`` section (its
        ``cross_device`` rules when the golden was recorded on another device), widened by the
        golden's calibrated ``noise``."""
        base = cls.cross_device_from_config(section) if cross_device else cls.from_config(section)
        section = section or {}
        kept = {"code_path": section.get("code_path", "report"), "unchecked": tuple(section.get("unchecked", ()))}
        return replace(base, **kept).with_noise(noise)

    @property
    def exact(self) -> bool:
        return self.mode == "exact"

    @property
    def strict_code_path(self) -> bool:
        """Any changed code path fails its stage (``tolerance.code_path: fail``)."""
        return self.code_path == "fail"

    def for_tensor(self, *, dtype: str, stage: str, statistic: str, api: str, rms: float | None = None) -> Tol:
        """Tolerance for one statistic of one tensor row.

        Args:
            dtype: msprobe dtype string, e.g. ``"torch.float32"``.
            stage: verl stage name.
            statistic: one of ``Max``, ``Min``, ``Mean``, ``Norm`` (``value`` for a scalar argument).
            api: msprobe row name, e.g. ``"Functional.linear.7.forward.output.0"``: API globs match it and
                calibrated noise is looked up by it.
            rms: the golden tensor's RMS, ``Norm / sqrt(numel)`` (:func:`~precision_harness.dumps.rows.rms`),
                in the tensor's units; the default atol of Max and Min scales with it (:func:`scaled_atol`).
                None: unknown (the floor applies).
        """
        if self.exact:
            return EXACT
        d = short_dtype(dtype)
        rtol, atol = self._rule(d, stage, statistic, api)
        if d not in DTYPE_DEFAULTS:  # integer and bool tensors: exact unless overridden, never calibrated
            return Tol(rtol, 0.0 if atol is None else atol)
        if atol is None:
            atol = scaled_atol(d, statistic, rtol, rms)
        return Tol(widened_rtol(rtol, self.noise_k, self._observed(stage, api, statistic)), atol)

    def tolerance_arrays(
        self, *, stage: str, dtypes: Sequence[str], codes: np.ndarray, names: Sequence[str], rms: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rtol, atol)``, each ``(rows, 4)`` float64 in :data:`STATISTICS` order: :meth:`for_tensor` of every
        statistic of every row, the same floats, for the compare's vectorised rows (``check/compare/stat_table.py``).

        Args:
            dtypes: msprobe dtype strings; row ``i``'s is ``dtypes[codes[i]]``.
            codes: ``(rows,)`` int, each row's index into ``dtypes``.
            names: each row's name.
            rms: ``(rows,)`` float64, each golden tensor's ``Norm / sqrt(numel)`` (NaN where unknown).
        """
        n = len(names)
        if self.exact:
            return np.zeros((n, 4)), np.zeros((n, 4))
        # a rule per dtype (per dtype and row name where API globs apply), read into every row by index
        if self.apis:
            keys: dict[tuple[str, str], int] = {}
            pairs = zip(codes.tolist(), names, strict=True)
            at = np.fromiter((keys.setdefault((dtypes[c], name), len(keys)) for c, name in pairs), np.int64, count=n)
            rules = [self._row_rule(short_dtype(dtype), stage, name) for dtype, name in keys]
        else:
            at, rules = codes, [self._row_rule(short_dtype(dtype), stage, "") for dtype in dtypes]
        rtol = np.array([r[0] for r in rules], dtype=float).reshape(-1, 4)[at]
        atol = np.array([r[1] for r in rules], dtype=float).reshape(-1, 4)[at]
        floor = np.array([r[2] for r in rules], dtype=float)[at]
        by_rms = rms_atol(floor[:, None], rtol, rms[:, None])
        scales = np.array([s in RMS_ATOL_STATISTICS for s in STATISTICS])
        atol = np.where(np.isnan(atol), np.where(scales, by_rms, floor[:, None]), atol)
        if self.noise or self.row_noise:
            self._widen(rtol, stage, names, ~np.isnan(floor))
        return rtol, atol

    def _row_rule(self, d: str, stage: str, name: str) -> tuple[list[float], list[float], float]:
        """A row's rtols and atols (NaN: scaled with its RMS) of each statistic, and its dtype's floor (NaN for
        integer and bool rows, which are never scaled nor calibrated)."""
        rules = [self._rule(d, stage, s, name) for s in STATISTICS]
        if d not in DTYPE_DEFAULTS:
            return [r for r, _ in rules], [0.0 if a is None else a for _, a in rules], math.nan
        return [r for r, _ in rules], [math.nan if a is None else a for _, a in rules], ATOL_FLOOR[d]

    def _widen(self, rtol: np.ndarray, stage: str, names: Sequence[str], floats: np.ndarray) -> None:
        """``rtol`` widened in place by calibrated noise, as :meth:`for_tensor` widens it (float rows only)."""
        for i in np.flatnonzero(floats).tolist():
            for k, statistic in enumerate(STATISTICS):
                rtol[i, k] = widened_rtol(rtol[i, k], self.noise_k, self._observed(stage, names[i], statistic))

    def _rule(self, d: str, stage: str, statistic: str, api: str) -> tuple[float, float | None]:
        """``(rtol, atol)`` from the defaults and overrides; atol None where no rule sets it (it scales)."""
        key = (d, stage, statistic, api if self.apis else "")
        found = self._rules.get(key)
        if found is None:
            default = DTYPE_DEFAULTS.get(d)
            rtol, atol = (default.rtol, None) if default else (0.0, 0.0)
            for override in (
                self.dtypes.get(d),
                self.stages.get(stage),
                self.statistics.get(statistic),
                self._api(api),
            ):
                rtol, atol = (override or {}).get("rtol", rtol), (override or {}).get("atol", atol)
            found = self._rules[key] = (rtol, atol)
        return found

    def _api(self, api: str) -> Mapping[str, float] | None:
        for pattern, override in self.apis.items():
            if fnmatch.fnmatchcase(api, pattern):
                return override
        return None

    def _observed(self, stage: str, row: str, statistic: str) -> float:
        """The calibrated relative change of ``row``'s ``statistic`` (0 where none was observed)."""
        if self.row_noise:
            return self.row_noise.get(stage, {}).get(row, {}).get(statistic, 0.0)
        return self.noise.get(stage, {}).get(statistic, 0.0)

    def for_metric(self, name: str) -> Tol:
        """Tolerance for one ``metrics.jsonl`` key (first matching glob in ``tolerance.metrics``): its scale is its
        own golden value, its atol the fp32 floor unless a rule sets one."""
        if self.exact:
            return EXACT
        for pattern, override in self.metrics.items():
            if fnmatch.fnmatchcase(name, pattern):
                return _apply(METRIC_DEFAULT, override)
        return METRIC_DEFAULT

    def describe(self, dtype: str = "torch.float32") -> str:
        """Headline text, e.g. ``"fp32: rtol 1.3e-06, atol rtol x RMS"`` (the atol of Max and Min; the floor of
        :data:`ATOL_FLOOR` below it and for the rest, docs/tolerance.md#atol-scales-with-the-tensor)."""
        if self.exact:
            return "exact"
        d = short_dtype(dtype)
        rtol, atol = self._rule(d, "", "", "")
        atol_text = "atol rtol x RMS" if atol is None else f"atol {atol:g}"  # Max, Min; the floor elsewhere
        calibrated = f", calibrated k={self.noise_k:g}" if self.noise or self.row_noise else ""
        per_row = " per row" if self.row_noise else ""
        return f"{d.replace('float', 'fp').replace('bfp', 'bf')}: rtol {rtol:g}, {atol_text}{calibrated}{per_row}"


def tolerance_ratio(target: float, golden: float, tol: Tol, *, scale: float | None = None) -> float:
    """``|target - golden| / (atol + rtol * scale)``; > 1 means beyond tolerance.

    ``scale`` defaults to ``|golden|``. Returns ``0.0`` for equal values (NaN == NaN and equal
    infinities included), ``inf`` when a non-finite value appears or disappears, or when the
    allowance is 0 and the values differ.
    """
    if target == golden or (math.isnan(target) and math.isnan(golden)):
        return 0.0
    if not (math.isfinite(target) and math.isfinite(golden)):
        return math.inf
    allowed = tol.atol + tol.rtol * (abs(golden) if scale is None else abs(scale))
    diff = abs(target - golden)
    return diff / allowed if allowed > 0 else math.inf
