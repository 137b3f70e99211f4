"""PrecisionSession: one gate run (a pytest session): scenario runs, goldens, and item outcomes.

Each scenario's golden action is decided once, as one value (:meth:`PrecisionSession.plan`,
:class:`~precision_harness.session_plan.Plan`): the only place the golden mode is read. Its run is
started once (:meth:`~PrecisionSession.start`, on a pool of :class:`~precision_harness.runs.pools.RunPools`)
however many of its items are selected, and waited for by one verb, :meth:`~PrecisionSession.run`. The
runner that starts a run is a constructor argument
(:func:`~precision_harness.runs.kind_runners.run_scenario` by default). The comparison itself is
:func:`precision_harness.check.verdicts.items.check_items`, the path ``precision-harness compare`` takes too.
What the run adds up to (counts, churn, unused goldens, report files) is
:class:`~precision_harness.report.precision_report.PrecisionReport`.

A scenario's states (:class:`~precision_harness.session_plan.ScenarioState`), each reached once and
in this order:

=========  ======================================================  ==========================================
state      reached by                                              its items
=========  ======================================================  ==========================================
new        :meth:`~PrecisionSession.state`                         --
planned    :meth:`~PrecisionSession.plan`: ``SKIP`` (cannot    ``SKIP``: fail with the reason, or skip
           run here: its device is absent, verl is missing, no      under ``--precision-allow-skip``;
           golden in check mode), ``ERROR`` (golden stale,          ``ERROR``: fail with the error's line,
           corrupt, or holding steps/stages the scenario no         no run; ``CHECK``/``RECORD``: wait
           longer lists; msprobe missing), ``RECORD`` (update,
           or missing with no golden on disk), ``CHECK``
running    :meth:`~PrecisionSession.start`: the gate's up-front    wait for the run
           :meth:`~PrecisionSession.schedule` (``CHECK``/``RECORD``),
           a first item, or ``precision_run`` (any plan)
settled    the first item after the run: undeclared stages noted;  ``RECORD``: "golden recorded" (or the
           ``RECORD`` promotes the run to the golden                record's error); ``CHECK``: compared
=========  ======================================================  ==========================================
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from precision_harness import progress
from precision_harness.check.item_key import ItemKey
from precision_harness.check.rerun import level_auto
from precision_harness.check.verdicts.items import Outcome, OutcomeKind
from precision_harness.errors import GoldenMissingError, PrecisionError, ScenarioError
from precision_harness.goldens.golden import Golden, gates_at_recorded_level, update_command
from precision_harness.goldens.narrowing import check_narrowing
from precision_harness.goldens.store import GoldenStore
from precision_harness.goldens.unused_goldens import GoldenUsage, discover_scenarios, settle
from precision_harness.options import PrecisionOptions
from precision_harness.paths import display_path, join_inside
from precision_harness.report.item_record import ItemRecord, run_info
from precision_harness.report.precision_report import PrecisionReport
from precision_harness.runs.host import device_availability, stack
from precision_harness.runs.kind_runners import Run, engine_missing, load_scenario, preflight, run_scenario
from precision_harness.runs.kind_runners import stop as stop_runs
from precision_harness.runs.launch import RunOptions, RunResult
from precision_harness.runs.pools import RunPools
from precision_harness.scenarios.invariant_declarations import INVARIANTS
from precision_harness.scenarios.profiling import ROLLOUT_COMPUTE_LOG_PROB
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session_checks import ItemChecks, invariant_outcome
from precision_harness.session_plan import (
    GoldenAction,
    Plan,
    Recording,
    ScenarioState,
    checked_folder,
    last_step_needed,
    msprobe_available,
    no_msprobe,
    other_models_golden,
    record_run,
)

#: starts one scenario run: ``runner(scenario, *, out_dir, device, options)`` (as ``kind_runners.run_scenario``)
Runner = Callable[..., RunResult]


class PrecisionSession:
    """State of one gate run. Not thread-safe except where noted (runs complete on worker threads).

    Args:
        runner: starts one scenario run (:data:`Runner`); tests give a fake that returns a prepared run.
        rerun_args: the invocation's options a pasted rerun line needs (``-c``, ``-o precision_*=...``).
    """

    def __init__(
        self, options: PrecisionOptions, *, rootdir: Path, runner: Runner = run_scenario, rerun_args: tuple = ()
    ) -> None:
        self.options = options
        self.rootdir = Path(rootdir)
        self.rerun_args = tuple(rerun_args)
        self.runner = runner
        self.artifacts = self._abs(options.artifacts)
        self.store = GoldenStore(self._abs(options.golden_dir))
        self.report = PrecisionReport(mode=options.golden_mode)
        self.usage = GoldenUsage()  #: which scenarios were collected; why the run is partial
        self.on_progress: Callable[[str], None] | None = None  #: called with a line as each stage starts
        self._pools = RunPools(options)  #: one pool of --precision-jobs runs, else one per device
        self._states: dict[str, ScenarioState] = {}
        self._last_steps: dict[str, int | None] = {}  #: per scenario, :meth:`select`'s last step
        self._models: dict[str, str | None] = {}  #: per device, this host's accelerator model (:meth:`host_model`)
        self._checks = ItemChecks(self)

    def _abs(self, p: Path) -> Path:
        p = Path(p)
        return p if p.is_absolute() else self.rootdir / p

    def shown(self, p: Path) -> Path:
        """``p`` as verdicts and summaries name it: from the working directory where it lies below it, so
        the artifacts and ``tensorboard --logdir`` lines work where pytest was started."""
        return Path(display_path(p))

    # ------------------------------------------------------------------------------ planning
    def state(self, scenario: Scenario) -> ScenarioState:
        st = self._states.get(scenario.name)
        if st is None:
            device = self.options.device_for(scenario)
            golden_device = self.options.golden_device or device
            st = self._states[scenario.name] = ScenarioState(scenario, device, golden_device, folder=golden_device)
        return st

    def host_model(self, device: str) -> str | None:
        """This host's accelerator model for ``device``, read once a session from its vendor tool
        (:func:`~precision_harness.runs.host.stack.host_model`; None on cpu or where the tool does not answer)."""
        if device not in self._models:
            self._models[device] = stack.host_model(device)
        return self._models[device]

    def plan(self, scenario: Scenario) -> Plan:
        """The scenario's golden action, decided on first use and kept (thread-safe)."""
        st = self.state(scenario)
        with st.lock:
            if st.plan is None:
                st.plan = self._decide(st)
            return st.plan

    def _decide(self, st: ScenarioState) -> Plan:
        """The one reading of the golden mode. An explicit ``--precision-device`` was checked at start-up
        (a usage error), and a Ray cluster (``--precision-ray-address``) is trusted to have the device."""
        scenario, mode = st.scenario, self.options.golden_mode
        reason = self._cannot_run(st)
        if reason:
            return Plan(GoldenAction.SKIP, scenario, reason=reason)
        model = self._pick_golden(st)
        if mode == "update" or (mode == "missing" and self._missing(st, model)):
            plan = Plan(GoldenAction.RECORD, scenario)  # where it writes follows the run's model: record_run
        else:
            try:
                golden = self.store.load(scenario, st.folder)
                check_narrowing(scenario, golden)  # the golden's steps/stages the scenario no longer lists
            except GoldenMissingError as exc:
                return Plan(GoldenAction.SKIP, scenario, reason=str(exc))
            except PrecisionError as exc:
                return Plan(GoldenAction.ERROR, scenario, error=exc)
            pinned = golden if scenario.pins_rollouts and mode == "check" else None
            plan = Plan(GoldenAction.CHECK, self._run_to(self._runs(scenario, golden)), golden=golden, pinned=pinned)
        if not msprobe_available():
            return Plan(GoldenAction.ERROR, scenario, error=no_msprobe())
        return plan

    def _pick_golden(self, st: ScenarioState) -> str | None:
        """Sets ``st.folder`` to the golden the check reads: this host's accelerator model's own first
        (docs/goldens.md, "Another accelerator model"); returns the model (None: cpu, or the tool did not answer)."""
        model = self.host_model(st.device)
        own = model if st.golden_device == st.device else None  # another device's golden: no model of this one
        st.folder = checked_folder(self.store, st.scenario.name, st.golden_device, own)
        return model

    def _missing(self, st: ScenarioState, model: str | None) -> bool:
        """``missing`` records: no golden of this device on disk, or only another model's and no
        --precision-golden-device (this model's own is then recorded beside it)."""
        name = st.scenario.name
        folder = checked_folder(self.store, name, st.device, model)
        if not self.store.exists(name, folder):
            return True
        other = folder == st.device and not self.options.golden_device
        return other and other_models_golden(self.store, name, st.device, model)

    def _cannot_run(self, st: ScenarioState) -> str | None:
        """Why the scenario cannot run here, before its golden is read (one line naming the scenario): its engine
        (verl) is not installed, or its own ``device:`` is absent (``--precision-device auto`` only), else None."""
        missing = engine_missing(st.scenario)
        if missing:
            return missing
        if self.options.device == "auto" and not self.options.ray_address:
            reason = device_availability.unavailable_reason(st.device)
            return f"{st.scenario.name}: {reason}" if reason else None
        return None

    def select(self, name: str, keys: Iterable[ItemKey]) -> None:
        """Scenario ``name``'s selected items, before its plan: a check runs it only as far as they need."""
        self._last_steps[name] = last_step_needed(keys)

    def _run_to(self, scenario: Scenario) -> Scenario:
        """``scenario`` run only to the last step of its selected items (:meth:`select`), noted in the summary."""
        step = self._last_steps.get(scenario.name)
        overrides = scenario.run_to(step)
        if overrides is None:
            return scenario
        self.report.notes.append(f"{scenario.name}: run to step {step} of {scenario.total_steps}, as selected")
        return scenario.with_overrides(overrides, directory=self._variants(scenario), name=scenario.name)

    def _runs(self, scenario: Scenario, golden: Golden) -> Scenario:
        """The scenario as a check runs it: a ``level: auto`` scenario whose golden was recorded at L1
        (before auto) runs and gates at L1, with a note saying to re-record."""
        if not scenario.localizes or not gates_at_recorded_level(golden.level, scenario.level):
            return scenario
        self.report.notes.append(
            f"{scenario.name}: golden recorded at {golden.level} before level: auto; gating at "
            f"{golden.level}. Re-record for auto with: {update_command(scenario)}"
        )
        return level_auto.at_localize_level(scenario, self._variants(scenario))

    # ----------------------------------------------------------------------------------- runs
    def run_dir(self, scenario: Scenario) -> Path:
        """``<artifacts>/<scenario>/run`` (``run-<worker>`` under xdist)."""
        run = "run" if not self.options.worker_id else f"run-{self.options.worker_id}"
        return join_inside(self.artifacts, scenario.name, run, what="artifacts <scenario>/run")

    def schedule(self, scenario: Scenario) -> None:
        """Start the run now if the scenario's items will need it (so runs overlap); never raises.

        A run that cannot start (msprobe missing, an unsafe name) is reported by every item.
        """
        try:
            if self.plan(scenario).needs_run:
                self.start(scenario)
        except PrecisionError:
            pass  # outcome() meets the same error again, and reports it as the item's failure

    def start(self, scenario: Scenario) -> Future:
        """Start ``scenario``'s run, whatever its plan (invariant checks need no golden); idempotent.

        The gate's items and :meth:`run` share this one run: a scenario runs once per session.

        Raises:
            ProbeUnavailableError: msprobe is not installed.
            UnsafePathError: the scenario name would leave the artifacts folder.
        """
        plan, st = self.plan(scenario), self.state(scenario)
        with st.lock:
            if st.future is None:
                st.future = self._submit(st, plan)
            return st.future

    def _submit(self, st: ScenarioState, plan: Plan) -> Future:
        if not msprobe_available():
            raise no_msprobe()
        executor = self._pools.pool(st.device)
        scenario, out_dir = plan.runs, self.run_dir(plan.runs)
        options = self._as_checked(plan)
        if scenario.localizes and plan.action is GoldenAction.RECORD:
            variants, run = self._variants(scenario), self._bound(st, options)
            return executor.submit(level_auto.run_recording, scenario, out_dir=out_dir, variants=variants, run=run)
        return executor.submit(self.runner, scenario, out_dir=out_dir, device=st.device, options=options)

    def _run_options(self, **more: Any) -> RunOptions:
        return RunOptions(timeout=self.options.timeout, warm=self.options.worker == "warm", **more)

    def _as_checked(self, plan: Plan) -> RunOptions:
        """How the scenario's run, and every rerun of it (level auto's L1 rerun, the judgement's capture rerun),
        is started: on the same Ray address, with the same pinned rollouts (a verl check run's, from the golden).
        A rerun that sampled its own rollouts would differ from the check by sampling noise."""
        return self._run_options(ray_address=self.options.ray_address, pinned=plan.pinned)

    def _bound(self, st: ScenarioState, options: RunOptions) -> Run:
        """The session's runner on the scenario's device with ``options``."""
        return lambda scenario, out_dir: self.runner(scenario, out_dir=out_dir, device=st.device, options=options)

    def checked_run(self, st: ScenarioState) -> Run:
        """A rerun of ``st``'s scenario as its check ran (device, Ray, pinned rollouts): the localisation's, the
        judgement's capture."""
        return self._bound(st, self._as_checked(self.plan(st.scenario)))

    def _variants(self, scenario: Scenario) -> Path:
        return join_inside(self.artifacts, scenario.name, "variants", what="artifacts <scenario>/variants")

    def run(self, scenario: Scenario) -> RunResult:
        """Start (if need be) and wait for ``scenario``'s run. Raises RunFailedError or ProbeUnavailableError."""
        return self.start(scenario).result()

    def _follow(self, scenario: Scenario) -> None:
        """Report the run's stage starts, once per run, even one already finished (the lines printed
        must not depend on timing)."""
        st = self.state(scenario)
        if self.on_progress is None or st.progress_shown or st.future is None:
            return
        st.progress_shown = True
        run_dir, total = self.run_dir(scenario), scenario.total_steps
        progress.follow(run_dir, st.future, scenario=scenario.name, report=self.on_progress, total_steps=total)

    def scenario_named(self, name: str, dirs: Sequence[str]) -> Scenario:
        """The scenario ``name``: the one this session already knows, else ``<rootdir>/<dir>/<name>.yaml``.

        Raises:
            ScenarioError: no such file under any of ``dirs``, or the file is invalid.
        """
        st = self._states.get(name)
        if st is not None:
            return st.scenario
        for d in dirs:
            for suffix in (".yaml", ".yml"):
                path = self.rootdir / d / f"{name}{suffix}"
                if path.is_file():
                    return load_scenario(path)
        where = ", ".join(f"{d}/" for d in dirs)
        raise ScenarioError(f"{name}: no scenario file {name}.yaml under {where} in {self.rootdir}")

    def variant(self, scenario: Scenario, overrides: dict[str, Any]) -> Scenario:
        """``scenario`` with verl-key ``overrides``, written under ``<artifacts>/variants/`` (no golden)."""
        st = self.state(preflight(scenario.with_overrides(overrides, directory=self.artifacts / "variants")))
        return st.scenario

    def close(self) -> None:
        stop_runs()  # a run still in flight (Ctrl-C) and the shared Ray of verl runs: nothing outlives the session
        self._pools.close()

    # -------------------------------------------------------------------------------- outcomes
    def outcome(self, scenario: Scenario, key: ItemKey) -> Outcome:
        """Verdict of one item: a (step, stage) dump, or the scenario's metrics.

        Never raises for user-caused problems: a PrecisionError becomes a failed Outcome whose text
        is the error's one line.
        """
        try:
            plan = self.plan(scenario)
            if plan.action is GoldenAction.SKIP:
                return self._not_run(scenario, plan)
            run = self._settle(scenario, plan)
            st = self.state(scenario)
            if key.stage in INVARIANTS:
                return invariant_outcome(scenario, run, key)
            if plan.action is GoldenAction.RECORD:
                return self._recorded(st, key)
            return self._checks.check(st, plan, run, key)
        except PrecisionError as exc:
            return Outcome.error(exc)

    def _not_run(self, scenario: Scenario, plan: Plan) -> Outcome:
        """The item of a scenario that cannot run here: a failure naming why (a gate that checked nothing is not
        green), or a skip under ``--precision-allow-skip`` (the summary counts it)."""
        kind = OutcomeKind.SKIPPED if self.options.allow_skip else OutcomeKind.ERROR
        return Outcome(False, plan.reason, kind)

    def _settle(self, scenario: Scenario, plan: Plan) -> RunResult:
        """Wait for the run and take it in once: undeclared stages noted, and RECORD's promotion.

        Raises:
            PrecisionError: the plan's error, the run's (RunFailedError), or the promotion's.
        """
        if plan.error is not None:
            raise plan.error
        st = self.state(scenario)
        future = self.start(scenario)
        self._follow(scenario)
        run = future.result()
        with st.lock:
            if not st.settled:
                st.settled = True
                self.report.note_undeclared(scenario.name, run.run_json.get("undeclared") or [])
                if plan.action is GoldenAction.RECORD:
                    try:
                        st.recording = record_run(self.store, st, run, history_window=self.options.history_window)
                    except PrecisionError as exc:
                        st.recording = exc
        if isinstance(st.recording, PrecisionError):
            raise st.recording
        return run

    def _recorded(self, st: ScenarioState, key: ItemKey) -> Outcome:
        assert isinstance(st.recording, Recording)
        path = self.shown(self.store.path(st.scenario.name, st.folder))
        churn = [r for r in st.recording.churn if (r.step, r.stage) == (key.step, key.stage)]
        text = f"golden {st.recording.status}: {path} ({st.recording.size_note})"
        return Outcome(True, text, OutcomeKind.RECORDED, churn=churn)

    def rerun_command(self, scenario: Scenario, selector: str) -> str:
        """``pytest [options] SCENARIO -k "SELECTOR"``, to paste where pytest was started (its working directory)."""
        return shlex.join(["pytest", *self.rerun_args, display_path(scenario.path)]) + f' -k "{selector}"'

    # -------------------------------------------------------------------------------- records
    def record(self, outcome: Outcome, *, nodeid: str, scenario: Scenario, key: ItemKey) -> ItemRecord:
        """The report record of one item (plain JSON: it travels to the xdist controller on the TestReport)."""
        return ItemRecord.from_outcome(
            outcome, nodeid=nodeid, scenario=scenario.name, step=key.step, stage=key.stage, run=self._run_info(scenario)
        )

    def _run_info(self, scenario: Scenario) -> dict[str, Any] | None:
        st = self.state(scenario)
        if st.future is None or not st.future.done() or st.future.exception() is not None:
            return None
        run: RunResult = st.future.result()
        profiled = {f"step_{a}/{b}" for a in scenario.steps for b in scenario.stages}
        info = run_info(run.run_json, wall_s=run.wall_s, profiled=profiled, run_dir=str(self.shown(run.run_dir)))
        # a check that loaded the golden's rollouts sampled nothing: the rollout engine ran only if it scored them
        # (rollout_compute_log_prob; report.not_exercised)
        pinned = self.plan(scenario).pinned is not None
        scored = pinned and ROLLOUT_COMPUTE_LOG_PROB in scenario.stages
        sampled = pinned and bool(scenario.fresh_steps)  # verl.fresh_steps: the engine sampled, its mismatch gated
        return {
            **info,
            "device": st.device,
            "rollouts_pinned": pinned,
            "engine_scored": scored,
            "engine_sampled": sampled,
        }

    def finish(self, *, scenario_dirs: list[str]) -> None:
        """End of the run (the xdist controller's, or the only process's): unused goldens, prune, report files."""
        if not self.usage.partial:
            self.usage.check_complete(discover_scenarios(self.rootdir, scenario_dirs), rootdir=self.rootdir)
        self.report.partial = list(self.usage.partial)
        settled = settle(self.usage, self.store, prune=self.options.prune, shown=self.shown)
        self.report.unused, self.report.pruned = settled.unused, settled.pruned
        self.report.notes += [settled.note] if settled.note else []
        if self.options.report is not None:
            t0 = time.perf_counter()
            paths = self.report.write(self._abs(self.options.report))
            shown = ", ".join(str(self.shown(p)) for p in paths)
            self.report.notes.append(f"precision report: {shown} ({time.perf_counter() - t0:.1f} s)")
