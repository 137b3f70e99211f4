"""Compare one stage dump (or a metrics.jsonl) against its golden and return a verdict.

The table comes from msprobe's own in-memory compare (``Comparator.compare_statistics``, the code
behind ``msprobe compare``; docs/msprobe.md#compare), without importing torch. msprobe's Result column
only looks at Norm and lets a 5 % output change pass, so it is not the gate: every Max/Min/Mean/Norm
is checked with :class:`~precision_harness.tolerance.TolerancePolicy`, and the checks msprobe misses
are added: API key sets (msprobe silently drops golden-only rows), dtype/shape changes, NaN/Inf where
the golden is finite, a rank missing on either side.

A dump whose bytes equal the golden's is identical statistic for statistic; it passes without the
table (``StageVerdict.identical``), which keeps the common, unchanged case fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness import stage_outputs
from precision_harness.errors import GoldenCorruptError, ProbeUnavailableError
from precision_harness.tolerance import STATISTICS, Tol, TolerancePolicy, relative_change, tolerance_ratio


@dataclass(frozen=True)
class Drift:
    """One statistic of one tensor beyond tolerance."""

    tensor: str  #: msprobe tensor name, e.g. ``Functional.linear.7.forward.output.0``
    statistic: str  #: Max, Min, Mean or Norm
    golden: float
    target: float
    ratio: float  #: |target - golden| / allowance; > 1 fails
    rel: float  #: |target - golden| / |golden|
    tol: Tol
    order: int  #: row index in execution order
    rank: str = "rank0"


@dataclass
class StageVerdict:
    """Outcome of comparing one (scenario, step, stage) across all its ranks."""

    scenario: str
    step: int
    stage: str
    checked: int = 0  #: statistics compared
    drifts: list[Drift] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  #: always-failures, one line each
    tolerance: str = ""
    identical: bool = False  #: every rank's dump.json is byte-identical to the golden
    ranks: list[str] = field(default_factory=list)
    table_paths: list[Path] = field(default_factory=list)
    #: ``(rank, order, tensor, worst tolerance ratio of its statistics)`` for every compared row, in
    #: execution order: the drift profile a report plots (empty for identical dumps).
    profile: list[tuple[str, int, str, float]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.drifts and not self.problems

    @property
    def worst_ratio(self) -> float:
        """Largest tolerance ratio of any statistic (``inf`` for a structural failure; 0 if identical)."""
        worst = max([d.ratio for d in self.drifts] + [p[3] for p in self.profile], default=0.0)
        return math.inf if self.problems else worst

    @property
    def first_divergence(self) -> Drift | None:
        """The drift earliest in execution order; across ranks, the one whose rank diverged first.

        Ranks run the same program in lock step (collectives synchronise them), so a row index is
        comparable across ranks: a change to rank 1's data shows in rank 1's forward before rank 0
        sees it through the gradient all-reduce.
        """
        return min(self.drifts, key=lambda d: (d.order, d.rank)) if self.drifts else None

    @property
    def failing_ranks(self) -> list[str]:
        """Ranks with a drift or an always-failure (problems start with ``rank<r>:``), sorted."""
        ranks = {d.rank for d in self.drifts} | {p.split(":", 1)[0] for p in self.problems if p.startswith("rank")}
        return sorted(ranks, key=lambda r: (len(r), r))

    def add(self, rank: RankVerdict) -> None:
        """Take in one rank's result."""
        self.checked += rank.checked
        self.drifts += rank.drifts
        self.problems += rank.problems
        self.profile += rank.profile

    @property
    def largest(self) -> Drift | None:
        return max(self.drifts, key=lambda d: (d.ratio, -d.order)) if self.drifts else None


# ------------------------------------------------------------------------------------- helpers
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_dump(path: Path) -> dict[str, Any]:
    """Read an msprobe ``dump.json`` (bare NaN/Infinity allowed); raise GoldenCorruptError naming the file."""
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        raise GoldenCorruptError(f"{path}: not a readable msprobe dump.json ({exc}); re-record the golden") from None
    return parse_dump(content, shown=str(path))


def parse_dump(content: bytes, *, shown: str) -> dict[str, Any]:
    """Parse the bytes of an msprobe ``dump.json``; raise GoldenCorruptError naming ``shown``."""
    try:
        data = json.loads(content)
    except ValueError as exc:
        raise GoldenCorruptError(f"{shown}: not a readable msprobe dump.json ({exc}); re-record the golden") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise GoldenCorruptError(f"{shown}: no 'data' mapping; not an msprobe dump.json")
    return data


class DirStage:
    """A verl-layout stage folder on disk (``.../step_<n>/<stage>``): a run, a plain golden, verl's profile.

    The compare reads a stage through this interface (:meth:`ranks`, :meth:`load`,
    :meth:`plain_dir`); a compressed golden's stage offers the same (``golden.GoldenStage``).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def ranks(self) -> list[str]:
        return sorted(rank_dirs(self.path))

    def load(self, rank: str) -> dict[str, Any]:
        """The rank's dump.json, with its ``stage_outputs.json`` merged in where there is one."""
        rank_dir = self.path / "step0" / rank
        extra = rank_dir / stage_outputs.FILE
        return stage_outputs.merged(load_dump(rank_dir / "dump.json"), load_dump(extra) if extra.is_file() else None)

    def digest(self, rank: str) -> str:
        """The rank's identity (:func:`stage_outputs.rank_digest`): equal digests, identical statistics."""
        rank_dir = self.path / "step0" / rank
        extra = rank_dir / stage_outputs.FILE
        outputs = sha256_file(extra) if extra.is_file() else None
        return stage_outputs.rank_digest(sha256_file(rank_dir / "dump.json"), outputs)

    def plain_dir(self, scratch: Path) -> Path:
        """The stage as plain files msprobe's own tools can open (here: the folder itself)."""
        return self.path


def iter_tensors(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, statistics entry)`` of every tensor below a dump.json API entry (inputs, kwargs,
    outputs), e.g. ``("output.0", {"dtype": ..., "Max": ...})``; paths are stable keys between dumps."""
    if isinstance(node, dict):
        if "dtype" in node and "Max" in node:
            yield path, node
            return
        for key, value in node.items():
            yield from iter_tensors(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from iter_tensors(value, f"{path}.{i}" if path else str(i))


def count_statistics(dump: dict[str, Any]) -> int:
    """Number of values the gate checks in a parsed dump.json: the non-null statistics of every row
    msprobe's parser yields (a scalar argument's value fills all four, as in msprobe's table)."""
    return sum(sum(v is not None for v in _row_statistics(item).values()) for item in flatten_dump(dump).values())


def _float(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip() in ("N/A", "", "None", "-")):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _numel(shape: Any) -> int:
    if isinstance(shape, str):
        try:
            shape = json.loads(shape.replace("(", "[").replace(")", "]"))
        except ValueError:
            return 1
    return int(math.prod(shape)) if shape else 1


def _import_msprobe_compare():
    try:
        from msprobe.core.common.utils import get_dump_mode
        from msprobe.core.compare.acc_compare import Comparator, ParseData
        from msprobe.core.compare.config import MappingConfig, ModeConfig
        from msprobe.core.compare.indicator_analysis.calculator import calculate_excel_result_df
    except ImportError as exc:
        raise ProbeUnavailableError(
            f"mindstudio-probe is not installed in this interpreter ({exc}); pip install mindstudio-probe"
        ) from None
    return get_dump_mode, Comparator, ParseData, MappingConfig, ModeConfig, calculate_excel_result_df


def msprobe_table(target: Path, golden: Path):
    """msprobe's compare table (a pandas DataFrame, one row per tensor) of two ``dump.json`` files.

    Its progress bars and INFO logs are swallowed. Raises ProbeUnavailableError without msprobe.
    """
    get_dump_mode, Comparator, ParseData, MappingConfig, ModeConfig, calculate_excel_result_df = (
        _import_msprobe_compare()
    )
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # msprobe's own pandas deprecations are not the user's concern
        mode = ModeConfig(dump_mode=get_dump_mode({"npu_path": str(target), "bench_path": str(golden)}))
        npu_df, bench_df = ParseData(mode, "", {"NPU": None, "Bench": None}).parse([str(target), str(golden), None])
        df = Comparator(None, mode, MappingConfig()).compare_statistics(npu_df, bench_df)
        calculate_excel_result_df(df, mode.dump_mode, "", False)
    return df


# -------------------------------------------------------------------------------------- stages
def _read_op():
    try:
        from msprobe.core.compare.utils import read_op
    except ImportError as exc:
        raise ProbeUnavailableError(
            f"mindstudio-probe is not installed in this interpreter ({exc}); pip install mindstudio-probe"
        ) from None
    return read_op


def flatten_dump(dump: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Tensor rows of a parsed dump.json, in execution order, named as msprobe compare names them.

    Uses msprobe's own parser (``msprobe.core.compare.utils.read_op``), so ``full_op_name`` is the
    ``NPU Name`` of msprobe's compare table, e.g. ``Functional.linear.7.forward.output.0``.
    Each row carries ``api`` (the dump.json key) besides msprobe's fields.
    """
    read_op = _read_op()
    rows: dict[str, dict[str, Any]] = {}
    for api, op_data in dump["data"].items():
        for item in read_op(op_data, api):
            item["api"] = api
            rows[item["full_op_name"]] = item
    return rows


def _row_statistics(item: dict[str, Any]) -> dict[str, float | None]:
    """Max/Min/Mean/Norm of a tensor row, or ``{"value": v}`` for a scalar argument."""
    if (
        item.get("Max") is None
        and item.get("value") is not None
        and not isinstance(item.get("value"), (list, dict, str))
    ):
        return {"value": _float(item["value"])}
    return {s: _float(item.get(s)) for s in STATISTICS}


@dataclass
class RankVerdict:
    """Outcome of comparing one rank's ``dump.json`` pair (its share of a :class:`StageVerdict`)."""

    rank: str
    checked: int = 0
    drifts: list[Drift] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: ``(rank, order, tensor, worst ratio)`` of every compared row, in execution order
    profile: list[tuple[str, int, str, float]] = field(default_factory=list)
    _nan_reported: bool = field(default=False, repr=False)

    @property
    def passed(self) -> bool:
        return not self.drifts and not self.problems


def compare_rank(
    t_dump: dict[str, Any], g_dump: dict[str, Any], *, policy: TolerancePolicy, stage: str, rank: str
) -> RankVerdict:
    """Compare one rank's parsed ``dump.json`` pair: key sets, then every statistic of every row.

    Rows are msprobe's (``read_op``), named as msprobe's compare table names them; the tolerance is
    ours. msprobe drops golden-only rows silently, so API and row key sets are checked here.
    """
    verdict = RankVerdict(rank)
    verdict.problems += _api_key_problems(rank, t_dump["data"], g_dump["data"])
    t_rows, g_rows = flatten_dump(t_dump), flatten_dump(g_dump)
    for order, (name, t_item) in enumerate(t_rows.items()):
        g_item = g_rows.get(name)
        if g_item is None:
            if t_item["api"] in g_dump["data"]:  # same API, different tensors: a structural change
                verdict.problems.append(f"{rank}: {name}: not in the golden")
            continue
        _compare_row(verdict, name, order, t_item, g_item, policy=policy, stage=stage)
    for name, g_item in g_rows.items():
        if name not in t_rows and g_item["api"] in t_dump["data"]:
            verdict.problems.append(f"{rank}: {name}: in the golden but missing from this run")
    return verdict


def _api_key_problems(rank: str, target: dict[str, Any], golden: dict[str, Any]) -> list[str]:
    only_golden = [a for a in golden if a not in target]
    only_target = [a for a in target if a not in golden]
    problems = []
    if only_golden:
        problems.append(
            f"{rank}: {len(only_golden)} API(s) in the golden are missing from this run, first {only_golden[0]}"
        )
    if only_target:
        problems.append(f"{rank}: {len(only_target)} API(s) not in the golden, first {only_target[0]}")
    return problems


def _compare_row(
    v: RankVerdict,
    name: str,
    order: int,
    t_item: dict[str, Any],
    g_item: dict[str, Any],
    *,
    policy: TolerancePolicy,
    stage: str,
) -> None:
    """Check one tensor row (dtype, shape, each statistic) into ``v``; add its worst ratio to the profile.

    Mean is judged against ``Norm / sqrt(numel)`` of the golden (the RMS), since a mean near zero
    has no useful relative error (docs/tolerance.md).
    """
    t_dtype, g_dtype = t_item.get("dtype") or t_item.get("type"), g_item.get("dtype") or g_item.get("type")
    if t_dtype != g_dtype or t_item.get("shape") != g_item.get("shape"):
        v.problems.append(
            f"{v.rank}: {name}: dtype/shape {g_dtype} {g_item.get('shape')} -> {t_dtype} {t_item.get('shape')}"
        )
        return
    t_stats, g_stats = _row_statistics(t_item), _row_statistics(g_item)
    golden_norm = g_stats.get("Norm")
    rms = None
    if golden_norm is not None and math.isfinite(golden_norm):
        rms = golden_norm / math.sqrt(max(_numel(t_item.get("shape")), 1))
    row_worst = 0.0
    for stat, g_val in g_stats.items():
        t_val = t_stats.get(stat)
        if t_val is None and g_val is None:
            continue
        v.checked += 1
        if t_val is None or g_val is None:
            v.problems.append(f"{v.rank}: {name} {stat}: {g_val} -> {t_val}")
            continue
        if not math.isfinite(t_val) and math.isfinite(g_val) and not v._nan_reported:
            v.problems.append(f"{v.rank}: {name} {stat}: {t_val} where the golden is finite ({g_val:.7g})")
            v._nan_reported = True
        tol = policy.for_tensor(dtype=str(t_dtype), stage=stage, statistic=stat, api=name)
        ratio = tolerance_ratio(t_val, g_val, tol, scale=rms if stat == "Mean" else None)
        row_worst = max(row_worst, ratio)
        if ratio > 1.0:
            v.drifts.append(Drift(name, stat, g_val, t_val, ratio, relative_change(t_val, g_val), tol, order, v.rank))
    v.profile.append((v.rank, order, name, row_worst))


def write_msprobe_table(target: Path, golden: Path, path: Path) -> Path:
    """Write msprobe's compare table of two dump.json files (as ``msprobe compare`` would) to ``path``."""
    df = msprobe_table(target, golden)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


def rank_dirs(stage_dir: Path) -> dict[str, Path]:
    """``{"rank0": .../step0/rank0/dump.json, ...}`` for a verl-layout stage directory."""
    return {p.parent.name: p for p in sorted(stage_dir.glob("step0/rank*/dump.json"))}


def compare_stage(
    target_dir: Path,
    golden_dir: Path | Any,
    *,
    scenario: str,
    step: int,
    stage: str,
    policy: TolerancePolicy,
    golden_sha256: dict[str, str] | None = None,
    golden_statistics: int | None = None,
    artifacts: Path | None = None,
) -> StageVerdict:
    """Compare ``target_dir`` (``RUN/step_<n>/<stage>``) against ``golden_dir`` (same layout).

    Args:
        golden_dir: a stage folder, or any object with :class:`DirStage`'s methods (a golden's stage).
        golden_sha256: ``{"rank0": digest}`` of the golden's ranks (``Golden.sha256``: the dump.json's
            sha256, joined with the stage_outputs.json's where there is one); a target rank with the
            same digest is identical and skips the table.
        golden_statistics: statistics count recorded for the golden (reported for identical dumps).
        artifacts: directory for ``compare_result_<rank>.csv`` tables.
    """
    verdict = StageVerdict(scenario=scenario, step=step, stage=stage, tolerance=policy.describe())
    golden = DirStage(golden_dir) if isinstance(golden_dir, (str, Path)) else golden_dir
    target = DirStage(Path(target_dir))
    t_ranks, g_ranks = rank_dirs(Path(target_dir)), set(golden.ranks())
    verdict.ranks = sorted(set(t_ranks) | set(g_ranks))
    if not t_ranks:
        verdict.problems.append(f"no dump.json under {target_dir}: the stage did not run or was not profiled")
        return verdict
    for rank in sorted(set(g_ranks) - set(t_ranks)):
        verdict.problems.append(f"{rank}: in the golden but missing from this run")
    for rank in sorted(set(t_ranks) - set(g_ranks)):
        verdict.problems.append(f"{rank}: in this run but not in the golden")
    shared = sorted(set(t_ranks) & set(g_ranks))
    identical = (
        bool(shared)
        and golden_sha256 is not None
        and all(golden_sha256.get(r) is not None and target.digest(r) == golden_sha256[r] for r in shared)
    )
    if identical:
        verdict.identical = not verdict.problems
        verdict.checked = (
            golden_statistics
            if golden_statistics is not None
            else sum(count_statistics(golden.load(r)) for r in shared)
        )
        return verdict
    for rank in shared:
        rv = compare_rank(target.load(rank), golden.load(rank), policy=policy, stage=stage, rank=rank)
        verdict.add(rv)
        if artifacts is not None and not rv.passed:
            # msprobe's own table (with its Result column), for reading beside our verdict
            g_path = golden.plain_dir(artifacts / "golden") / "step0" / rank / "dump.json"
            table = write_msprobe_table(t_ranks[rank], g_path, artifacts / f"compare_result_{rank}.csv")
            verdict.table_paths.append(table)
    verdict.drifts.sort(key=lambda d: (d.rank, d.order))
    return verdict


# ------------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class MetricDrift:
    step: int
    name: str
    golden: float | None
    target: float | None
    ratio: float
    rel: float


@dataclass
class MetricsVerdict:
    scenario: str
    checked: int = 0
    drifts: list[MetricDrift] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.drifts and not self.problems


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` (one JSON object per step); raise GoldenCorruptError naming the line."""
    try:
        content = Path(path).read_bytes()
    except OSError as exc:
        raise GoldenCorruptError(f"{path}: cannot read metrics ({exc.strerror})") from None
    return parse_metrics(content, shown=str(path))


def parse_metrics(content: bytes, *, shown: str) -> list[dict[str, Any]]:
    """Parse the bytes of a ``metrics.jsonl``; raise GoldenCorruptError naming ``shown`` and the line."""
    rows = []
    try:
        lines = content.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise GoldenCorruptError(f"{shown}: not UTF-8 text ({exc.reason})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise GoldenCorruptError(f"{shown}:{lineno}: not a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise GoldenCorruptError(f"{shown}:{lineno}: expected a JSON object per line")
        rows.append(row)
    return rows


def compare_metrics(
    target: Iterable[dict[str, Any]], golden: Iterable[dict[str, Any]], *, scenario: str, policy: TolerancePolicy
) -> MetricsVerdict:
    """Gate every metric of every step with ``policy.for_metric`` (``|t - g| <= atol + rtol |g|``)."""
    verdict = MetricsVerdict(scenario=scenario)
    t_rows = {int(r.get("training/global_step", i + 1)): r for i, r in enumerate(target)}
    g_rows = {int(r.get("training/global_step", i + 1)): r for i, r in enumerate(golden)}
    for step in sorted(set(g_rows) - set(t_rows)):
        verdict.problems.append(f"step {step}: in the golden metrics but missing from this run")
    for step in sorted(set(t_rows) - set(g_rows)):
        verdict.problems.append(f"step {step}: not in the golden metrics")
    for step in sorted(set(t_rows) & set(g_rows)):
        t, g = t_rows[step], g_rows[step]
        for name in sorted(set(g) - set(t)):
            verdict.problems.append(f"step {step}: metric {name} missing from this run")
        for name in sorted(set(t) - set(g)):
            verdict.problems.append(f"step {step}: metric {name} not in the golden")
        for name in sorted(set(t) & set(g)):
            tv, gv = _float(t[name]), _float(g[name])
            if tv is None and gv is None:
                continue
            if tv is None or gv is None:  # a number became null (or the reverse): not a drift, a change
                verdict.problems.append(f"step {step}: metric {name}: {g[name]!r} -> {t[name]!r}")
                continue
            verdict.checked += 1
            ratio = tolerance_ratio(tv, gv, policy.for_metric(name))
            if ratio > 1.0:
                verdict.drifts.append(MetricDrift(step, name, gv, tv, ratio, relative_change(tv, gv)))
    return verdict
