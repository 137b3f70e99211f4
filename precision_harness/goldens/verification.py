"""``precision-harness golden verify``: every problem of a golden on disk, and the NaN/Inf lint of a dump.

A golden must be made of numbers, listed in its manifest and match both its digests; this reports
each problem as one line instead of raising at the first. A NaN/Inf its scenario declares
(``tolerance.nonfinite``, :class:`NonFinite`) is no problem: it is listed apart, with the declared reason.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness.dumps.files import parse_dump
from precision_harness.dumps.rows import tensors
from precision_harness.dumps.statistics import STATISTICS
from precision_harness.errors import GoldenCorruptError, GoldenError
from precision_harness.goldens.golden import Golden
from precision_harness.goldens.manifest import MANIFEST
from precision_harness.paths import display_path

#: dtype -> largest finite value; a Mean/Norm of +-inf next to a Max/Min at half of it is the
#: overflow of an attention-mask constant (``finfo.min``), not a bad number.
_FINITE_MAX = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
}


@dataclass(frozen=True)
class NonFinite:
    """One ``tolerance.nonfinite`` entry: NaN/Inf allowed in the tensors ``where`` matches."""

    where: str  #: fnmatch glob over tensor paths (``Functional.softmax.*``)
    reason: str  #: why the run computes NaN/Inf there (kept in the scenario, for its reviewers)

    def allows(self, tensor: str) -> bool:
        return fnmatch.fnmatchcase(tensor, self.where)


@dataclass
class GoldenVerification:
    """What ``golden verify`` found in one golden: ``problems`` (none: sound) and the NaN/Inf its scenario
    declares (``declared``, each line with the declared reason), one line each."""

    problems: list[str] = field(default_factory=list)
    declared: list[str] = field(default_factory=list)


def non_finite(dump: dict[str, Any]) -> Iterator[tuple[str, str, float]]:
    """``(tensor path, statistic, value)`` of every statistic of a parsed ``dump.json`` a golden may not hold.

    NaN anywhere, and +-Inf in Max or Min, are errors (a golden must be made of numbers). An
    infinite Mean or Norm is allowed where Max or Min holds a masking constant (at least half the
    dtype's largest finite value), whose sum overflows in msprobe's own statistics. Tensor paths are
    :func:`~precision_harness.dumps.rows.tensors`' (``Functional.linear.0.forward.output.0``).
    """
    for where, tensor in tensors(dump["data"]):
        dtype = str(tensor["dtype"]).rsplit(".", 1)[-1]
        extreme = 0.5 * _FINITE_MAX.get(dtype, math.inf)
        masked = any(isinstance(tensor.get(k), (int, float)) and abs(tensor[k]) >= extreme for k in ("Max", "Min"))
        for stat in STATISTICS:
            v = tensor.get(stat)
            if not isinstance(v, (int, float)) or math.isfinite(v):
                continue
            if math.isnan(v) or stat in ("Max", "Min") or not masked:
                yield where, stat, v


def lint_dump(dump: dict[str, Any], *, shown: str, declared: Sequence[NonFinite] = ()) -> GoldenVerification:
    """NaN/Inf lint of one parsed ``dump.json`` (named ``shown``): one line per non-finite tensor statistic
    (:func:`non_finite`), a problem unless an entry of ``declared`` allows its tensor (then a declared line, with
    the entry's reason)."""
    out = GoldenVerification()
    for where, stat, v in non_finite(dump):
        line = f"{shown}: {where} {stat} is {v}"
        entry = next((n for n in declared if n.allows(where)), None)
        if entry is None:
            out.problems.append(line)
        else:
            out.declared.append(f"{line}, declared ({entry.where}): {entry.reason}")
    return out


def verify_golden(path: Path, declared: Sequence[NonFinite] = ()) -> GoldenVerification:
    """Every problem of the golden at ``path``: manifest schema, both digests of each file, unlisted
    files, NaN/Inf lint; a NaN/Inf that an entry of ``declared`` (its scenario's ``tolerance.nonfinite``)
    allows is listed as declared, not as a problem.

    Returns one line per problem (none: the golden is sound) and per declared NaN/Inf; never raises for a bad
    golden.
    """
    path = Path(path)
    try:
        golden = Golden.from_dir(path)
    except GoldenError as exc:
        return GoldenVerification([str(exc)])
    out = GoldenVerification()
    for name, stored in sorted(golden.contents.items()):
        try:
            content = golden.read(name)
            if name.endswith("/dump.json"):
                shown = display_path(path / stored)
                lint = lint_dump(parse_dump(content, shown=shown), shown=shown, declared=declared)
                out.problems += lint.problems
                out.declared += lint.declared
        except GoldenCorruptError as exc:
            out.problems.append(str(exc))
    listed = set(golden.manifest["files"]) | {MANIFEST}
    for extra in sorted(p for p in path.rglob("*") if p.is_file() and p.relative_to(path).as_posix() not in listed):
        out.problems.append(f"{display_path(extra)}: not listed in {MANIFEST}; remove it or re-record the golden")
    return out
