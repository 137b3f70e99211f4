"""The one compare path: a target directory against a golden, item by item, into :class:`Outcome` s.

A target is any directory in verl's dump layout (our run, or verl's ``global_profiler.save_path``);
a golden is a :class:`~precision_harness.goldens.golden.Golden`. :func:`check_items` walks the requested
items, a ``(step, stage)`` pair (every rank's ``dump.json``) or the ``metrics.jsonl``, verifies the
golden's files against their sha256, compares, and on a failing stage asks msprobe too (first diff;
graph for L0/mix), over the calls around the first divergence of the first divergent rank. The pytest
items (through :class:`~precision_harness.session.PrecisionSession`)
and ``precision-harness compare`` both call it, so both give the same verdicts, text and artifacts.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare import rank_pool, unfilled
from precision_harness.check.compare.metrics import MetricsVerdict, compare_metrics
from precision_harness.check.compare.stage import compare_ahead, compare_stage
from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.check.coverage import Ledger
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.item_key import METRICS_ITEM, ItemKey
from precision_harness.check.localize import msprobe_worker
from precision_harness.check.localize.drift_origin import DriftOrigin, classify
from precision_harness.check.localize.msprobe_tools import GRAPH_LEVELS, MsprobeAnswer
from precision_harness.check.localize.msprobe_window import write_window
from precision_harness.check.verdicts import verdict_text
from precision_harness.check.verdicts.judgement import Judgement
from precision_harness.dumps import sampled_tokens
from precision_harness.dumps.files import DUMP, METRICS, load_dump, read_metrics
from precision_harness.dumps.pairing import aligned_golden, pair_calls
from precision_harness.dumps.stage import DirStage, StageSource
from precision_harness.errors import GoldenMissingError, PrecisionError, RunFailedError
from precision_harness.goldens.churn import ChurnRow
from precision_harness.goldens.golden import Golden
from precision_harness.goldens.recordable import FILTER_FIELDS
from precision_harness.paths import display_path
from precision_harness.scenarios.profiling import ROLLOUT_COMPUTE_LOG_PROB, ROLLOUT_GENERATE, STAGES


class OutcomeKind(str, Enum):
    """What an item's outcome is: compared within/beyond tolerance, identical, a recorded golden, an error,
    or skipped (its scenario cannot run here, under ``--precision-allow-skip``)."""

    COMPARED = "compared"
    IDENTICAL = "identical"
    RECORDED = "recorded"
    ERROR = "error"
    SKIPPED = "skipped"


@dataclass
class Outcome:
    """What an item reports: passed or not, the verdict text, and data for summaries and reports."""

    passed: bool
    text: str
    kind: OutcomeKind
    verdict: StageVerdict | MetricsVerdict | None = None
    msprobe: MsprobeAnswer | None = None
    seconds: float = 0.0  #: compare (and msprobe analysis) wall time
    artifacts: Path | None = None
    churn: list[ChurnRow] = field(default_factory=list)  #: update mode: the stage against the previous golden
    #: ``level: auto``: the stage rerun at L1 and checked against the golden's L1 record (check.rerun.level_auto)
    localized: Outcome | None = None
    #: the run's environment against the golden's (every item of a scenario carries the same)
    environment: EnvironmentDiff = field(default_factory=EnvironmentDiff)
    #: a failing stage: where its change entered (check.localize.drift_origin)
    origin: DriftOrigin | None = None
    #: a failing stage whose change entered at an API: the replay's judgement (check.rerun.replay)
    judgement: Judgement | None = None
    #: the ledger of an outcome with no verdict that still accounts for part of the golden; else the verdict's
    coverage: Ledger | None = None

    @property
    def ledger(self) -> Ledger | None:
        """What of the golden the item compared, and why not the rest (:mod:`~precision_harness.check.coverage`);
        None where nothing was compared (a recorded golden, an error before the compare)."""
        if self.coverage is not None:
            return self.coverage
        return self.verdict.ledger if self.verdict is not None else None

    @classmethod
    def error(cls, exc: PrecisionError) -> Outcome:
        """A failed outcome whose text is the error's one line."""
        return cls(False, str(exc), OutcomeKind.ERROR)


def items_of(target: Path, golden: Golden) -> list[ItemKey]:
    """Every ``(step, stage)`` with a ``step0/rank*/dump.json`` on either side, in execution order, then metrics
    where the golden holds them (a target without ``metrics.jsonl`` fails that item, as the gate's does)."""
    found = set(golden.stages())
    for dump in Path(target).glob("step_*/*/step0/rank*/dump.json"):
        step_dir = dump.parents[3].name
        if step_dir[5:].isdigit():
            found.add((int(step_dir[5:]), dump.parents[2].name))
    order = {s: i for i, s in enumerate(STAGES)}
    keys = [ItemKey(step, stage) for step, stage in sorted(found, key=lambda p: (p[0], order.get(p[1], 99), p[1]))]
    return keys + ([METRICS_ITEM] if golden.has_metrics() else [])


def identical_stages(target: Path, golden: Golden) -> int:
    """How many of the golden's stage dumps ``target`` (a run directory) reproduces byte for byte (every rank's
    digest equal): on one machine, the stages the environment did not move."""
    count = 0
    for step, stage in golden.stages():
        run_stage, golden_stage = DirStage(Path(target) / f"step_{step}" / stage), golden.stage(step, stage)
        ranks = golden_stage.ranks()
        count += (
            bool(ranks)
            and run_stage.ranks() == ranks
            and all(run_stage.digest(r) == golden_stage.digest(r) for r in ranks)
        )
    return count


def check_items(
    target: Path, golden: Golden, keys: Iterable[ItemKey], settings: CheckSettings
) -> Iterator[tuple[ItemKey, Outcome]]:
    """Outcome of each item of ``target`` against ``golden``; a user-caused problem is a failed outcome.

    The stages of the next items (a core each) are started beside the current one, a stage to a worker, where their
    dumps are large enough for the rank pool (:func:`~precision_harness.check.compare.rank_pool.ahead`); the outcomes
    and their order are those of one item at a time.

    Args:
        target: verl-layout directory (``step_<n>/<stage>/step0/rank<r>/dump.json``, ``metrics.jsonl``).
        golden: the golden; each of its files is checked against its sha256 before use.
        keys: the items to check (:func:`items_of` for all of them).

    Where ``target``'s run.json or the golden's manifest records FSDP2's all-gather buffer not zero-filled, its rows
    are not compared (:func:`~precision_harness.check.compare.unfilled.settled`).
    """
    keys, settings = list(keys), unfilled.settled(settings, target, golden.env)
    stages = _Stages(target, golden)
    try:
        for at, key in enumerate(keys):
            _ahead(stages, keys[at : at + rank_pool.cores()], settings)
            try:
                out = (
                    _check_metrics(target, golden, settings) if key.is_metrics else _check_stage(stages, key, settings)
                )
            except PrecisionError as exc:
                out = Outcome.error(exc)
            stages.done(key)
            out.environment = settings.environment
            yield key, covered(out, settings)
    finally:
        rank_pool.forget()


class _Stages:
    """Each stage item's run and golden side, made once: the compare started ahead and the item's own check ask the
    same two objects (the golden's, :meth:`Golden.stage`, for its rows, digests, window and skeleton), dropped once
    the item is checked so that a large golden's parses do not pile up."""

    def __init__(self, target: Path, golden: Golden) -> None:
        self.target, self.golden = Path(target), golden
        self._pairs: dict[ItemKey, tuple[DirStage, StageSource]] = {}

    def has(self, key: ItemKey) -> bool:
        return (
            not key.is_metrics
            and key.step is not None
            and key.stage is not None
            and self.golden.has_stage(key.step, key.stage)
        )

    def pair(self, key: ItemKey) -> tuple[DirStage, StageSource]:
        """``(the run's stage, the golden's)`` of a stage item the golden holds."""
        assert key.step is not None and key.stage is not None
        if key not in self._pairs:
            self._pairs[key] = (_run_stage(self.target, key), self.golden.stage(key.step, key.stage))
        return self._pairs[key]

    def done(self, key: ItemKey) -> None:
        self._pairs.pop(key, None)


def covered(out: Outcome, settings: CheckSettings) -> Outcome:
    """``out``, or where it passed having compared less than the golden holds for a reason nothing declares
    (:attr:`~precision_harness.check.coverage.Ledger.dropped`), a failure whose first line names what was dropped;
    ``settings.allow_uncompared`` (``--precision-allow-uncompared``) accepts it. An error, not a drift: no rerun
    at L1 and no judgement is asked of it."""
    ledger = out.ledger
    if not out.passed or ledger is None or not ledger.dropped or settings.allow_uncompared:
        return out
    return replace(out, passed=False, text=f"{ledger.dropped_line()}\n{out.text}", kind=OutcomeKind.ERROR)


def _ahead(stages_of: _Stages, keys: list[ItemKey], settings: CheckSettings) -> None:
    """The stages of ``keys`` (this item's and the next ones, a core each) started side by side in the rank pool
    (:func:`~precision_harness.check.compare.stage.compare_ahead`); a stage the golden lacks or cannot give is left to
    its own item, which says why."""
    stages = [stages_of.pair(k) for k in keys if stages_of.has(k)]
    if len(stages) < 2:  # nothing to put beside it (a pytest item, level: auto's rerun): no hashing for nothing
        return
    with contextlib.suppress(PrecisionError, OSError):  # the stage's own item meets it again and reports it
        compare_ahead(stages, settings)


def _check_stage(stages: _Stages, key: ItemKey, s: CheckSettings) -> Outcome:
    assert key.step is not None and key.stage is not None
    golden = stages.golden
    if not golden.has_stage(key.step, key.stage):
        again = f", re-record with: {s.rerecord}" if s.rerecord else ""
        raise GoldenMissingError(
            f"{display_path(golden.path)}: no dump for {key.stage} @ step_{key.step}; "
            f"the golden predates this step/stage{again}"
        )
    golden.verify_stage(key.step, key.stage)
    artifacts = s.item_artifacts(key.step, key.stage)
    if artifacts is not None:
        shutil.rmtree(artifacts, ignore_errors=True)
    run_stage, golden_stage = stages.pair(key)
    out = check_stage(run_stage, golden_stage, s)
    if key.stage == ROLLOUT_GENERATE:  # a changed token explains every statistic after it: named first
        changed = sampled_tokens.compare_stage(run_stage.path, golden, key.step, key.stage)
        if changed is not None:
            out = replace(out, passed=False, text=f"{changed}\n{out.text}", kind=OutcomeKind.COMPARED)
            if artifacts is not None and (artifacts / "verdict.txt").is_file():
                (artifacts / "verdict.txt").write_text(out.text + "\n", encoding="utf-8")
    if key.stage == ROLLOUT_COMPUTE_LOG_PROB and not out.passed:  # the engine, not the training, moved: named first
        out = replace(out, text=f"{engine_line(run_stage.path)}\n{out.text}")
    return out


def engine_line(stage_dir: Path) -> str:
    """The line naming the rollout engine of a failing ``rollout_compute_log_prob`` (its dump's ``rollout_engine``,
    written by precision_harness/runs/verl/engine_scoring.py)."""
    engine: dict = {}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        engine = json.loads((stage_dir / "step0" / "rank0" / DUMP).read_text(encoding="utf-8")).get("rollout_engine")
    name = f"{engine.get('name', 'unknown')} {engine.get('version', '')}".strip() if engine else "unknown"
    return (
        f"rollout engine {name}: its log-probs of the pinned responses, scored after the weight sync, or their "
        "mismatch with the training forward's, moved against the golden's (the training-side stages are checked "
        "apart, on the same pinned responses)"
    )


def _run_stage(target: Path, key: ItemKey) -> DirStage:
    """The run's folder of a stage item (``<target>/step_<n>/<stage>``)."""
    assert key.step is not None and key.stage is not None
    return DirStage(Path(target) / f"step_{key.step}" / key.stage, step=key.step, name=key.stage)


def _check_metrics(target: Path, golden: Golden, s: CheckSettings) -> Outcome:
    if not golden.has_metrics():
        again = f"; re-record with: {s.rerecord}" if s.rerecord else ""
        raise GoldenMissingError(f"{display_path(golden.path)}: no metrics.jsonl in the golden{again}")
    golden_rows = golden.metrics()
    path = Path(target) / METRICS
    if not path.is_file():
        raise RunFailedError(
            f"{display_path(path)}: missing; the golden {display_path(golden.path)} holds metrics.jsonl, so its "
            f"{len(golden_rows)} step(s) of metrics would be compared by nothing: point at the run directory that "
            "wrote it (verl writes it with trainer.logger: [console, file])"
        )
    return check_metrics(read_metrics(path), golden_rows, s)


def check_stage(target: StageSource, golden: StageSource, settings: CheckSettings) -> Outcome:
    """Compare one stage and, when it fails, ask msprobe too (its table, first diff; graph for L0/mix).

    Compare tables, ``verdict.txt`` and msprobe's output go to ``settings.item_artifacts`` (nowhere
    when the settings keep none); ``settings.msprobe`` False gives our verdict alone.

    Raises:
        GoldenCorruptError: a dump on either side is unreadable.
    """
    __tracebackhide__ = True
    t0 = time.perf_counter()
    # a failing rank of a large stage starts msprobe's worker while the other ranks are compared
    failing = msprobe_worker.warm if settings.asks_msprobe else None
    verdict = compare_stage(target, golden, settings, failing=failing)
    if verdict.passed and not verdict.checked and not verdict.unchecked:
        return Outcome(False, _nothing_compared(verdict, settings), OutcomeKind.ERROR, verdict)
    if verdict.passed:
        kind = OutcomeKind.IDENTICAL if verdict.identical else OutcomeKind.COMPARED
        passing = verdict_text.Reading(environment=settings.environment)
        text = verdict_text.stage_text(verdict, passing, rerecord=settings.rerecord)
        return Outcome(True, text, kind, verdict, seconds=time.perf_counter() - t0)
    artifacts = settings.item_artifacts(golden.step, golden.name)
    asked = None
    if settings.asks_msprobe and target.ranks() and not verdict.coverage_only:
        asked = _ask_msprobe(target, golden, verdict, artifacts, settings)
    shown = settings.shown(artifacts) if artifacts is not None else None
    origin = classify(verdict, target, golden) if target.ranks() else None  # while msprobe reads, in its worker
    answer = asked.result() if asked is not None else None
    reading = verdict_text.Reading(
        origin=origin,
        changed=tuple(settings.changed),
        environment=settings.environment,
        identical_elsewhere=settings.identical_elsewhere,
        msprobe=answer,
        graph_dir=(shown / "graph") if shown is not None else None,
    )
    rerun = settings.rerun_of(ItemKey(golden.step, golden.name))
    text = verdict_text.stage_text(verdict, reading, artifacts=shown, rerun=rerun, rerecord=settings.rerecord)
    if artifacts is not None:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "verdict.txt").write_text(text + "\n", encoding="utf-8")
    return Outcome(
        False,
        text,
        OutcomeKind.COMPARED,
        verdict,
        answer,
        seconds=time.perf_counter() - t0,
        artifacts=shown,
        origin=origin,
    )


def _nothing_compared(verdict: StageVerdict, settings: CheckSettings) -> str:
    """The line of a stage whose dumps hold no statistic on either side: it compared nothing, so it does not pass."""
    again = f"; re-record with: {settings.rerecord}" if settings.rerecord else ""
    return (
        f"{verdict.stage} @ step_{verdict.step}: no statistics in the run or the golden (every rank's dump.json "
        f'"data" is {{}}): nothing was compared; msprobe\'s filter matched no API there: fix {FILTER_FIELDS}{again}'
    )


def _ask_msprobe(
    target: StageSource, golden: StageSource, verdict: StageVerdict, artifacts: Path, settings: CheckSettings
) -> msprobe_worker.Pending:
    """msprobe's table and first diff of a failing stage: over the window of its first divergent rank
    (:mod:`~precision_harness.check.localize.msprobe_window`), or with ``settings.msprobe_full`` every failing rank
    whole; its graph for L0/mix over the whole run stage either way. Asked of a worker where one was started ahead of
    the stage (:mod:`~precision_harness.check.localize.msprobe_worker`; ``settings.msprobe_timeout`` seconds to
    answer), else here when the answer is asked for."""
    graph, timeout = golden.level in GRAPH_LEVELS, settings.msprobe_timeout
    window = None if settings.msprobe_full else write_window(target, golden, verdict, artifacts)
    if window is None:
        # msprobe's tools read plain files, and pair by name: the golden goes to them aligned to the run's calls
        target_dir = target.plain_dir(artifacts)
        plain = aligned_golden_dir(target_dir, golden.plain_dir(artifacts / "golden"), artifacts)
        tables = {rank: artifacts / f"compare_result_{rank}.csv" for rank in verdict.failing_ranks}
        job = msprobe_worker.Job(target_dir, plain, artifacts, graph, tables=tables)
        return msprobe_worker.analyze(job, timeout=timeout)
    job = msprobe_worker.Job(
        window.target_dir,
        window.golden_dir,
        artifacts,
        graph,
        graph_of=target.plain_dir(artifacts) if graph else None,
        tables={window.rank: artifacts / f"compare_result_{window.rank}.csv"},
    )
    return msprobe_worker.analyze(job, scope=window.line, timeout=timeout)


def aligned_golden_dir(target_dir: Path, golden_dir: Path, artifacts: Path) -> Path:
    """``golden_dir`` (a plain stage folder) as msprobe's tools should read it beside ``target_dir``: where some
    rank's calls pair under other names (:func:`~precision_harness.dumps.pairing.pair_calls`), every rank's golden
    dump.json aligned to the run's names under ``<artifacts>/golden_aligned``; else ``golden_dir`` itself."""
    ranks = sorted(
        p.parent.name
        for p in golden_dir.glob(f"step0/rank*/{DUMP}")
        if (target_dir / "step0" / p.parent.name / DUMP).is_file()
    )
    aligned = {}
    for rank in ranks:
        g_dump = load_dump(golden_dir / "step0" / rank / DUMP)
        pairing = pair_calls(load_dump(target_dir / "step0" / rank / DUMP), g_dump)
        aligned[rank] = (aligned_golden(g_dump, pairing), pairing.blocks or any(t != g for t, g in pairing.pairs))
    if not any(renamed for _, renamed in aligned.values()):
        return golden_dir
    out = artifacts / "golden_aligned"
    for rank, (dump, _) in aligned.items():
        rank_dir = out / "step0" / rank
        rank_dir.mkdir(parents=True, exist_ok=True)
        (rank_dir / DUMP).write_text(json.dumps(dump), encoding="utf-8")
        for extra in (golden_dir / "step0" / rank).glob("*.json"):
            if extra.name != DUMP:
                shutil.copyfile(extra, rank_dir / extra.name)
    return out


def check_metrics(target: list[dict[str, Any]], golden: list[dict[str, Any]], settings: CheckSettings) -> Outcome:
    """Compare parsed ``metrics.jsonl`` rows with the golden's, with ``policy.for_metric``.

    A failing verdict names the settings' environment headline first after its own headline.
    """
    __tracebackhide__ = True
    t0 = time.perf_counter()
    verdict = compare_metrics(target, golden, settings)
    failed = not verdict.passed
    text = verdict_text.metrics_text(
        verdict,
        rerun=settings.rerun_of(METRICS_ITEM) if failed else None,
        policy_exact=settings.policy.exact,
        changed=settings.changed if failed else None,
        environment=settings.environment.headline() if failed else None,
    )
    return Outcome(verdict.passed, text, OutcomeKind.COMPARED, verdict, seconds=time.perf_counter() - t0)
