"""How the session checks one item of a scenario it ran against its golden: the compare (check.verdicts.items), then
on a failing stage the L1 localisation (level: auto) and the judgement's replay, each rerun once per scenario
(later failing stages point to the stage that had it); an ``invariants:`` item over the run's own files; and a
``verl.fresh_steps`` item against the bounds its golden observed.

The session (:class:`~precision_harness.session.PrecisionSession`) owns the runs, the goldens and the report; what
is here reads them through it, and keeps each scenario's once-only results on its
:class:`~precision_harness.session_plan.ScenarioState`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.environment import EnvironmentDiff, rollout_engine_line
from precision_harness.check.item_key import ItemKey
from precision_harness.check.rerun import level_auto, replay
from precision_harness.check.tolerance import consistency, fresh_bounds
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import Outcome, OutcomeKind, check_items, identical_stages
from precision_harness.check.verdicts.verdict_text import settings_changed
from precision_harness.dumps.stage import DirStage
from precision_harness.goldens.golden import Golden, update_command
from precision_harness.goldens.manifest import fresh_rollouts
from precision_harness.goldens.store import GoldenStore
from precision_harness.options import PrecisionOptions
from precision_harness.paths import join_inside
from precision_harness.runs.kind_runners import Run
from precision_harness.runs.launch import RunResult
from precision_harness.runs.verl import engine
from precision_harness.scenarios.fresh_steps import FRESH_CHECK
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session_plan import Plan, ScenarioState, device_model_error


class CheckingSession(Protocol):
    """What the checks read of the session that ran the scenario
    (:class:`~precision_harness.session.PrecisionSession`)."""

    options: PrecisionOptions
    store: GoldenStore
    artifacts: Path
    on_progress: Callable[[str], None] | None

    def shown(self, p: Path) -> Path: ...

    def rerun_command(self, scenario: Scenario, selector: str) -> str: ...

    def checked_run(self, st: ScenarioState) -> Run: ...


def invariant_outcome(scenario: Scenario, run: RunResult, key: ItemKey) -> Outcome:
    """An ``invariants:`` item: the run's own files, whatever the golden mode (docs/consistency.md)."""
    assert key.step is not None and key.stage is not None
    t0 = time.perf_counter()
    mode = consistency.log_prob_mode(scenario.config)
    verdict = consistency.check(run.run_dir, key.step, key.stage, scenario.invariants, log_prob_mode=mode)
    return Outcome(verdict.passed, verdict.text, OutcomeKind.COMPARED, seconds=time.perf_counter() - t0)


def fresh_outcome(scenario: Scenario, run: RunResult, golden: Golden, key: ItemKey, env: EnvironmentDiff) -> Outcome:
    """A ``verl.fresh_steps`` item: the step's rollout-training mismatch against the bounds the golden's recording
    and calibration observed (:mod:`precision_harness.check.tolerance.fresh_bounds`). A failure's first line names
    the rollout engine and its version change (``env``: the run's environment against the golden's)."""
    assert key.step is not None
    t0 = time.perf_counter()
    measured = (fresh_rollouts(run.run_dir) or {}).get(str(key.step))
    verdict = fresh_bounds.check_step(key.step, measured, golden.manifest.get("fresh_rollouts") or {}, golden.noise)
    text = verdict.text
    if not verdict.passed:
        name = engine.rollout_engine_name(scenario.config["verl"]["overrides"], run.run_json.get("device", "cpu"))
        text = f"{rollout_engine_line(env, run.run_json.get('env'), name)}\n{text}"
    return Outcome(verdict.passed, text, OutcomeKind.COMPARED, seconds=time.perf_counter() - t0)


class ItemChecks:
    """The check of a scenario's items against its golden, for one session."""

    def __init__(self, session: CheckingSession) -> None:
        self.session = session

    def check(self, st: ScenarioState, plan: Plan, run: RunResult, key: ItemKey) -> Outcome:
        golden = plan.golden
        assert golden is not None
        env = self._environment(st, golden, run)
        if key.stage == FRESH_CHECK:
            return fresh_outcome(st.scenario, run, golden, key, env)
        localizes = golden.localizes and not key.is_metrics and st.scenario.localizes_stage(key.stage)
        localizes = localizes and self.session.options.localize == "rerun"
        settings = self._settings(st, golden, run)
        skip_msprobe = localizes and st.localized is None  # a failure here is rerun at L1, whose verdict asks msprobe
        out = next(check_items(run.run_dir, golden, [key], replace(settings, msprobe=not skip_msprobe)))[1]
        if localizes and not out.passed and out.kind is not OutcomeKind.ERROR:
            out = self._localize(st, golden, key, out, settings)
        judged = key.step is not None and key.stage is not None  # a stage's dump: not metrics.jsonl
        judges = self.session.options.judgement == "replay"
        if judged and judges and not out.passed and out.kind is OutcomeKind.COMPARED:
            out = self._judge(st, golden, run, key, out)
        return out

    def _judge(self, st: ScenarioState, golden: Golden, run: RunResult, key: ItemKey, out: Outcome) -> Outcome:
        """The judgement of a failing stage whose change entered at an API (check.rerun.replay); one capture rerun per
        scenario: later stages that need one point to the stage that had it."""
        local = replay.judged_outcome(out) is not out
        assert key.step is not None and key.stage is not None
        target = (self._localize_dir(st) / "run") if local else run.run_dir
        record = golden.localization() if local else golden
        pair = replay.StagePair(
            DirStage(target / f"step_{key.step}" / key.stage, step=key.step, name=key.stage),
            record.stage(key.step, key.stage),
        )
        where = join_inside(self.session.artifacts, st.scenario.name, "judge", what="artifacts <scenario>/judge")
        warm = self.session.options.worker == "warm"
        run = self.session.checked_run(st)
        settings = replay.ReplaySettings(where, run, self.session.options.timeout, warm)

        def claim() -> ItemKey | None:
            with st.lock:
                first, st.judged = st.judged, st.judged or key
            return first if first != key else None

        return replay.judge_outcome(out, replay.JudgeRequest(st.scenario, key, pair, settings), claim=claim)

    def _environment(self, st: ScenarioState, golden: Golden, run: RunResult) -> EnvironmentDiff:
        """The run's environment against the golden's, worked out once per scenario.

        Raises:
            GoldenDeviceModelError: the golden was recorded on another GPU/NPU model, this model has none of its own
                (``<device>@<model>/``) and --precision-golden-device was not given.
        """
        if st.environment is None:
            st.environment = EnvironmentDiff.between(golden.env, run.run_json.get("env"))
        if st.environment.device_model is not None and not self.session.options.golden_device:
            raise device_model_error(st, self.session.store.path(st.scenario.name, st.folder))
        return st.environment

    def _localize(
        self, st: ScenarioState, golden: Golden, key: ItemKey, l0: Outcome, settings: CheckSettings
    ) -> Outcome:
        """Rerun the scenario's first failing stage at L1 (level: auto); later failing stages point to it."""
        with st.lock:
            first, st.localized = st.localized, st.localized or key
        if first is not None and first != key:
            return level_auto.not_rerun(l0, first)
        out_dir = self._localize_dir(st)
        return level_auto.with_localization(
            l0,
            key,
            lambda: level_auto.localize(
                st.scenario,
                key,
                golden,
                settings,
                out_dir=out_dir,
                run=self.session.checked_run(st),
            ),
        )

    def _localize_dir(self, st: ScenarioState) -> Path:
        return join_inside(self.session.artifacts, st.scenario.name, "localize", what="artifacts <scenario>/localize")

    def _identical(self, st: ScenarioState, golden: Golden, run: RunResult) -> int:
        """Stage dumps of the run identical to the golden's, counted once per scenario and only where the
        environment differs (then they show it alone does not explain a drift)."""
        if st.environment is None or not st.environment.differs:
            return 0
        with st.lock:
            if st.identical is None:
                st.identical = identical_stages(run.run_dir, golden)
            return st.identical

    def _settings(self, st: ScenarioState, golden: Golden, run: RunResult) -> CheckSettings:
        scenario = st.scenario
        return CheckSettings(
            scenario=scenario.name,
            policy=TolerancePolicy.for_golden(
                scenario.config["tolerance"], noise=golden.noise, cross_device=st.cross_device
            ),
            artifacts=join_inside(self.session.artifacts, scenario.name, what="artifacts <scenario>"),
            shown=self.session.shown,
            rerun=lambda key: self.session.rerun_command(scenario, key.selector),
            rerecord=update_command(scenario),
            changed=tuple(settings_changed(golden.numeric_settings, scenario.numeric_settings)),
            environment=st.environment or EnvironmentDiff(),
            identical_elsewhere=self._identical(st, golden, run),
            msprobe_full=self.session.options.msprobe_full,
            msprobe_timeout=self.session.options.msprobe_timeout,
            progress=self.session.on_progress,
            allow_uncompared=self.session.options.allow_uncompared,
        )
