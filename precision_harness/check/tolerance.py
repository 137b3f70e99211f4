"""TolerancePolicy: how far a statistic may move from its golden before a stage fails.

Check, per statistic: ``|target - golden| <= atol + rtol * scale`` where ``scale = |golden|`` for
Max, Min and Norm, and ``scale = golden Norm / sqrt(numel)`` (the RMS) for Mean, since means near
zero have no useful relative error (docs/msprobe.md#determinism: 317 % relative Mean changes from
summation order alone). Defaults by dtype are ``torch.testing.assert_close``'s table. Overrides
from the scenario's ``tolerance:`` section, most specific first: API glob > statistic > stage >
dtype > built-in default; an override may set only ``rtol`` or only ``atol``. ``mode: exact``
demands bitwise-equal statistics (rtol = atol = 0).

Calibrated noise (``precision-harness calibrate``, stored in the golden manifest's ``noise``) can
only widen a tolerance: ``rtol = max(k x observed, floor)`` where the floor is the rtol resolved
above, see :meth:`TolerancePolicy.with_noise`.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Tol:
    """Relative and absolute tolerance (dimensionless / in the tensor's units)."""

    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"


#: ``torch.testing.assert_close`` defaults; integer and bool tensors must match exactly.
DTYPE_DEFAULTS: dict[str, Tol] = {
    "float64": Tol(1e-7, 1e-7),
    "float32": Tol(1.3e-6, 1e-5),
    "bfloat16": Tol(1.6e-2, 1e-5),
    "float16": Tol(1e-3, 1e-5),
}
EXACT = Tol(0.0, 0.0)
#: Defaults when the golden was recorded on another device (``--precision-golden-device``): kernels
#: differ (NPU vs GPU vs CPU matmul tiling, fused softmax), so fp32 gets msprobe's "one per mille"
#: and half types twice their same-device rtol. A scenario's ``tolerance.cross_device`` overrides these.
CROSS_DEVICE_DTYPES: dict[str, dict[str, float]] = {
    "float64": {"rtol": 1e-6, "atol": 1e-7},
    "float32": {"rtol": 1e-3, "atol": 1e-5},
    "bfloat16": {"rtol": 3.2e-2, "atol": 1e-5},
    "float16": {"rtol": 2e-3, "atol": 1e-5},
}
CROSS_DEVICE_METRICS: dict[str, dict[str, float]] = {"*": {"rtol": 1e-3, "atol": 1e-5}}
#: metrics.jsonl values are python floats computed in fp32.
METRIC_DEFAULT = DTYPE_DEFAULTS["float32"]


def short_dtype(dtype: str) -> str:
    """``"torch.float32"`` -> ``"float32"``; other strings pass through."""
    return dtype.rsplit(".", 1)[-1]


def _apply(base: Tol, override: Mapping[str, float] | None) -> Tol:
    if not override:
        return base
    return Tol(override.get("rtol", base.rtol), override.get("atol", base.atol))


@dataclass(frozen=True)
class TolerancePolicy:
    """Resolved tolerance rules of one scenario (its ``tolerance:`` section)."""

    mode: str = "tolerance"
    dtypes: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    stages: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    statistics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    apis: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: calibrated noise: stage -> statistic -> largest relative change observed between reruns
    noise: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    noise_k: float = 0.0
    #: ``report``: a changed code path whose values match the golden's passes, reported; ``fail``: it fails
    code_path: str = "report"
    #: globs of tensor rows (or their APIs) that may go unchecked: msprobe records no statistics of them
    unchecked: tuple[str, ...] = ()

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

        Per stage and statistic, ``rtol = max(k x observed, floor)``: ``observed`` is the largest
        relative change between reruns that should not matter (thread counts, process restarts),
        ``floor`` is the rtol this policy gives without calibration (``assert_close``'s dtype
        default or the scenario's override). Megatron uses k = 1.5 and a fixed floor of 1e-3; we
        use k = 3 (``calibrate.DEFAULT_K``, see its docstring) and a dtype floor, because on CPU
        reruns are usually bit-identical (observed = 0) and a fixed 1e-3 would loosen an fp32 gate
        by three orders of magnitude. ``mode: exact`` ignores calibration.
        """
        if not noise or self.exact:
            return self
        return replace(self, noise=dict(noise.get("stages", {})), noise_k=float(noise.get("k", 0.0)))

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

    def for_tensor(self, *, dtype: str, stage: str, statistic: str, api: str) -> Tol:
        """Tolerance for one statistic of one tensor.

        Args:
            dtype: msprobe dtype string, e.g. ``"torch.float32"``.
            stage: verl stage name.
            statistic: one of ``Max``, ``Min``, ``Mean``, ``Norm``.
            api: msprobe tensor name, e.g. ``"Functional.linear.7.forward.output.0"``.
        """
        if self.exact:
            return EXACT
        d = short_dtype(dtype)
        tol = DTYPE_DEFAULTS.get(d, EXACT)
        tol = _apply(tol, self.dtypes.get(d))
        tol = _apply(tol, self.stages.get(stage))
        tol = _apply(tol, self.statistics.get(statistic))
        for pattern, override in self.apis.items():
            if fnmatch.fnmatchcase(api, pattern):
                tol = _apply(tol, override)
                break
        observed = self.noise.get(stage, {}).get(statistic)
        if observed and d in DTYPE_DEFAULTS:  # integer and bool tensors stay exact
            tol = Tol(max(tol.rtol, self.noise_k * observed), tol.atol)
        return tol

    def for_metric(self, name: str) -> Tol:
        """Tolerance for one ``metrics.jsonl`` key (first matching glob in ``tolerance.metrics``)."""
        if self.exact:
            return EXACT
        for pattern, override in self.metrics.items():
            if fnmatch.fnmatchcase(name, pattern):
                return _apply(METRIC_DEFAULT, override)
        return METRIC_DEFAULT

    def describe(self, dtype: str = "torch.float32") -> str:
        """Headline text, e.g. ``"fp32: rtol 1.3e-06, atol 1e-05"``."""
        if self.exact:
            return "exact"
        d = short_dtype(dtype)
        tol = _apply(DTYPE_DEFAULTS.get(d, EXACT), self.dtypes.get(d))
        calibrated = f", calibrated k={self.noise_k:g}" if self.noise else ""
        return f"{d.replace('float', 'fp').replace('bfp', 'bf')}: {tol}{calibrated}"


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
