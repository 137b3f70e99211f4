"""Golden history: a golden's committed versions, read from git, and how far a golden sits from each.

Git is the store (:mod:`precision_harness.history.git_history`): the versions of ``golden/<scenario>/<device>/``
are the commits that changed that folder, each written into a temporary directory by ``git
archive`` and read through :class:`~precision_harness.goldens.golden.Golden` like any golden.

The distance of a stage between two goldens is the stage compare's worst tolerance ratio
(:attr:`~precision_harness.check.compare.stage_verdict.StageVerdict.worst_ratio`: ``|a - b| / (atol + rtol * scale)``
over every Max/Min/Mean/Norm of every tensor, the number the gate fails above 1; ``inf`` for a
structural change). The metrics item's (``metrics.jsonl``) is the metrics compare's worst ratio
(:attr:`~precision_harness.check.compare.metrics.MetricsVerdict.worst_ratio`, ``|t - g| / (atol + rtol |g|)``
per metric and step; ``inf`` for a step or metric on one side only). The older version plays the
golden (its values set the scale ``|golden|``, or its RMS for Mean), so a distance reads: how many
tolerances a check of the newer golden against that version would find.

Two users: ``precision-harness golden history`` (every version against the golden now, with an
offline plot), and the creep alarm of ``--precision-golden update`` (the new golden against the
oldest version within ``precision_history_window`` versions, next to the churn against the last).
"""

from __future__ import annotations

import math
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.metrics import compare_metrics
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps.files import METRICS
from precision_harness.dumps.stage import DirStage, StageSource
from precision_harness.errors import GoldenError, HistoryError, PrecisionError
from precision_harness.goldens.churn import ChurnRow, show_ratio
from precision_harness.goldens.golden import Golden
from precision_harness.history.git_history import Commit, Repository
from precision_harness.paths import display_path

#: ``(step, stage)``
StageKey = tuple[int, str]
#: the metrics item among the stage keys (its rows hold every step; step 0 lists it first)
METRICS_KEY: StageKey = (0, METRICS)
#: characters of a commit subject shown per version
MAX_SUBJECT = 72


def stage_distance(new: StageSource, old: StageSource | None, settings: CheckSettings) -> float | None:
    """Worst tolerance ratio of ``new`` checked against ``old`` (``inf``: structure changed; None: ``old``
    has no such stage)."""
    if old is None or not old.ranks():
        return None
    return compare_stage(new, old, settings).worst_ratio


def metrics_distance(new: list[dict], old: list[dict], settings: CheckSettings) -> float:
    """Worst tolerance ratio of the ``new`` metrics rows (parsed ``metrics.jsonl``) checked against ``old``;
    ``inf`` where a step or a metric is on one side only, or a value turned null."""
    verdict = compare_metrics(new, old, settings)
    return math.inf if verdict.problems else verdict.worst_ratio


def key_label(key: StageKey) -> str:
    """``step_2/actor_update``, or ``metrics.jsonl`` for :data:`METRICS_KEY`."""
    return METRICS if key == METRICS_KEY else f"step_{key[0]}/{key[1]}"


class GoldenHistory:
    """The committed versions of one golden folder (``golden/<scenario>/<device>``), newest first.

    Versions are extracted below ``scratch`` (the caller's temporary directory) on first use.

    Raises (constructor :meth:`of`): HistoryError where the folder is outside a git working tree.
    """

    def __init__(self, repo: Repository, rel: str, scratch: Path) -> None:
        self.repo, self.rel, self.scratch = repo, rel, Path(scratch)
        self._goldens: dict[str, Golden | None] = {}

    @classmethod
    def of(cls, golden_path: Path, scratch: Path) -> GoldenHistory:
        repo = Repository.holding(golden_path)
        if repo is None:
            raise HistoryError(f"{display_path(golden_path)}: not in a git checkout (golden history is read from git)")
        return cls(repo, repo.relative(golden_path), scratch)

    def commits(self, *, since: str | None = None, limit: int | None = None) -> list[Commit]:
        """Commits that changed the golden, newest first (``since``: after that revision)."""
        return self.repo.touching(self.rel, since=since, limit=limit)

    def golden_at(self, commit: Commit) -> Golden | None:
        """The golden as committed at ``commit``; None where the folder was removed there or is unreadable."""
        if commit.sha not in self._goldens:
            path = self.repo.extract(commit.sha, self.rel, self.scratch / commit.sha)
            try:
                self._goldens[commit.sha] = Golden.from_dir(path) if path is not None else None
            except GoldenError:
                self._goldens[commit.sha] = None
        return self._goldens[commit.sha]


# ------------------------------------------------------------------------------ golden history
@dataclass
class HistoryRow:
    """One committed version and the golden now's distance to it, per stage."""

    commit: Commit
    distances: dict[StageKey, float | None] = field(default_factory=dict)  #: None: no such stage then
    missing: bool = False  #: the golden was removed (or unreadable) at this commit

    @property
    def worst(self) -> tuple[float, StageKey | None]:
        """Largest distance and its stage (0 and None when every stage is identical)."""
        found = [(r, k) for k, r in self.distances.items() if r is not None]
        return max(found, key=lambda x: x[0], default=(0.0, None))


def history_rows(current: Golden, history: GoldenHistory, commits: Iterable[Commit], policy: TolerancePolicy):
    """One :class:`HistoryRow` per commit: every stage of ``current``, and its metrics.jsonl, against that version.

    Raises:
        GoldenCorruptError: a dump of ``current`` is unreadable.
    """
    settings = CheckSettings(scenario=current.scenario, policy=policy)
    keys = sorted(current.stages())
    rows = []
    for commit in commits:
        old = history.golden_at(commit)
        row = HistoryRow(commit, missing=old is None)
        for step, stage in keys if old is not None else ():
            old_stage = old.stage(step, stage) if old.has_stage(step, stage) else None
            row.distances[(step, stage)] = stage_distance(current.stage(step, stage), old_stage, settings)
        if old is not None and current.has_metrics():
            old_rows = old.metrics() if old.has_metrics() else None
            distance = None if old_rows is None else metrics_distance(current.metrics(), old_rows, settings)
            row.distances[METRICS_KEY] = distance
        rows.append(row)
    return rows


def history_lines(rows: list[HistoryRow]) -> list[str]:
    """The terminal lines of ``golden history``: per version its commit, date, subject and worst
    distance, then every stage that is not identical to it."""
    lines = []
    for row in rows:
        c = row.commit
        worst, key = row.worst
        subject = c.subject if len(c.subject) <= MAX_SUBJECT else c.subject[: MAX_SUBJECT - 3] + "..."
        head = f"{c.short}  {c.date[:10]}  {subject}"
        if row.missing:
            lines += [head, "    no readable golden at this commit"]
            continue
        where = f" at {key_label(key)}" if key is not None and worst > 0 else ""
        lines.append(f"{head}\n    worst {show_ratio(worst)}{where}")
        moved = [(k, r) for k, r in sorted(row.distances.items()) if r != 0]
        lines += [f"      {key_label(k)}  {show_ratio(r)}" for k, r in moved]
    return lines


def history_html(title: str, rows: list[HistoryRow]) -> str:
    """One offline HTML page: the distance of every stage to each version along the commits (oldest
    left), the tolerance line at 1, as inline SVG (matplotlib).

    Raises:
        PrecisionError: matplotlib is not installed.
    """
    import html
    import io
    import re

    try:
        import matplotlib

        matplotlib.use("svg", force=True)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PrecisionError(f"golden history --html needs matplotlib ({exc}); pip install matplotlib") from None
    ordered = [r for r in reversed(rows) if not r.missing]
    keys = sorted({k for r in ordered for k in r.distances})
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ordered) + 3), 4), dpi=96)
    xs = list(range(len(ordered)))
    ceiling = max([v for r in ordered for v in r.distances.values() if v is not None and math.isfinite(v)] + [1.0])
    for key in keys:
        ys = [_plotted(r.distances.get(key), ceiling) for r in ordered]
        ax.plot(xs, ys, marker="o", ms=3, lw=1, label=key_label(key))
    structural = [(x, 2 * ceiling) for x, r in zip(xs, ordered, strict=True) if _has_inf(r)]
    if structural:
        label = f"structure changed (inf), drawn at {2 * ceiling:g}"
        ax.scatter(*zip(*structural, strict=True), marker="x", s=60, color="#d32f2f", zorder=3, label=label)
    ax.axhline(1.0, color="#555", ls="--", lw=0.8, label="tolerance")
    ax.set_xticks(xs, [f"{r.commit.short}\n{r.commit.date[:10]}" for r in ordered], fontsize=7)
    ax.set_ylabel("distance of the golden now (x tolerance)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.85)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg[svg.index("<svg") :], flags=re.S)
    body = "\n".join(html.escape(line) for line in history_lines(rows))
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
        f"<body><h1>{html.escape(title)}</h1>{svg}<pre>{body}</pre></body></html>\n"
    )


def _has_inf(row: HistoryRow) -> bool:
    return any(v is not None and not math.isfinite(v) for v in row.distances.values())


def _plotted(value: float | None, ceiling: float) -> float:
    """A distance as plotted: a structural change at twice the largest finite one, an absent stage as NaN."""
    if value is None:
        return math.nan
    return value if math.isfinite(value) else 2 * ceiling


# -------------------------------------------------------------------------------- creep alarm
@dataclass(frozen=True)
class CreepSettings:
    """What the creep alarm of one re-record needs besides the run."""

    golden_path: Path  #: ``golden/<scenario>/<device>`` in the working tree
    window: int  #: versions looked back (``precision_history_window``); the oldest of them is compared
    policy: TolerancePolicy
    scenario_hash: str  #: the scenario's hash now: versions recorded under another are not looked at


def creep_review(run_dir: Path, previous: Golden | None, keys: Iterable[StageKey], settings: CreepSettings):
    """The new run's stages against the oldest committed version within the window.

    The window ends early at a version recorded under another scenario hash: a golden re-recorded
    because its scenario changed is a new baseline (its distance to older versions is the scenario
    change, not creep; ``golden history`` still shows it).

    Returns ``{(step, stage): creep}`` for every stage beyond tolerance from that version (the dict
    :attr:`ChurnRow.creep` holds: commit, subject, updates ago, ratio, and the ratio to ``previous``,
    the golden being replaced), or a one-line string saying why history is unavailable. Never
    raises: the alarm informs the reviewer and does not fail the update.
    """
    try:
        with tempfile.TemporaryDirectory(prefix="precision-history-") as scratch:
            history = GoldenHistory.of(settings.golden_path, Path(scratch))
            lineage = _lineage(history, settings)
            if len(lineage) < 2:
                return {}  # no version older than the last golden yet
            (commit, oldest), ago = lineage[-1], len(lineage)
            return _alarms(run_dir, previous, oldest, (commit, ago), keys, settings.policy)
    except (PrecisionError, OSError, tarfile.TarError) as exc:
        return f"golden history unavailable: {exc}"


def _lineage(history: GoldenHistory, settings: CreepSettings) -> list[tuple[Commit, Golden]]:
    """The window's versions, newest first, up to the first unreadable one or one of another scenario hash."""
    lineage = []
    for commit in history.commits(limit=max(1, settings.window)):
        golden = history.golden_at(commit)
        if golden is None or golden.manifest.get("scenario_hash") != settings.scenario_hash:
            break
        lineage.append((commit, golden))
    return lineage


def _alarms(
    run_dir: Path,
    previous: Golden | None,
    oldest: Golden,
    where: tuple[Commit, int],
    keys: Iterable[StageKey],
    policy: TolerancePolicy,
) -> dict[StageKey, dict]:
    """Each stage of the run beyond tolerance from ``oldest`` (committed at ``where``: its commit and how
    many updates ago), with its distance to ``previous`` beside it."""
    commit, ago = where
    checks = CheckSettings(scenario=oldest.scenario, policy=policy)
    out = {}
    for step, stage in keys:
        new = DirStage(Path(run_dir) / f"step_{step}" / stage, step=step, name=stage)
        if not new.ranks() or not oldest.has_stage(step, stage):
            continue
        ratio = stage_distance(new, oldest.stage(step, stage), checks)
        if ratio is None or ratio <= 1.0:
            continue
        last = None
        if previous is not None and previous.has_stage(step, stage):
            last = stage_distance(new, previous.stage(step, stage), checks)
        out[(step, stage)] = {
            "commit": commit.short,
            "subject": commit.subject,
            "updates_ago": ago,
            "ratio": ratio if math.isfinite(ratio) else None,
            "last_ratio": last if last is None or math.isfinite(last) else None,
        }
    return out


def with_creep(rows: list[ChurnRow], review: dict[StageKey, dict] | str) -> list[ChurnRow]:
    """``rows`` with the creep review attached: each alarm to its stage's row, or the unavailable
    line (``{"unavailable": line}``) to every row, so it reaches the report whichever items ran."""
    for row in rows:
        if isinstance(review, str):
            row.creep = {"unavailable": review}
        else:
            row.creep = review.get((row.step, row.stage))
    return rows
