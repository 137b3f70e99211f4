"""PrecisionSession: one gate run (a pytest session): scenario runs, goldens, and item outcomes.

One place decides check / update / missing for every golden (as pytest-regressions'
``perform_regression_check``): :meth:`PrecisionSession.outcome`. The comparison itself is
:func:`precision_harness.check.check_items`, the path ``precision-harness compare`` takes too.
Scenario runs are started in worker processes on a thread pool, at most ``jobs`` at a time, and
each scenario runs once however many of its items are selected. What the run adds up to (counts,
churn, unused goldens, report files) is :class:`~precision_harness.report.PrecisionReport`.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from precision_harness import churn as churn_mod
from precision_harness import device_check, localize, progress
from precision_harness.check import ItemKey, Outcome, OutcomeKind, check_items
from precision_harness.check_settings import CheckSettings
from precision_harness.environment import EnvironmentDiff
from precision_harness.errors import (
    GoldenDeviceModelError,
    PrecisionError,
    ProbeUnavailableError,
    RunFailedError,
    ScenarioError,
)
from precision_harness.golden import LOCALIZE_DIR, Golden, GoldenStore, gates_at_recorded_level, update_command
from precision_harness.launch import RunResult, run_scenario
from precision_harness.options import PrecisionOptions
from precision_harness.paths import display_path, join_inside
from precision_harness.report import ItemRecord, PrecisionReport
from precision_harness.scenario import AUTO, Scenario
from precision_harness.tolerance import TolerancePolicy
from precision_harness.usage import GoldenUsage, discover_scenarios
from precision_harness.verdict_text import settings_changed


@dataclass
class ScenarioState:
    """One scenario's run and golden within a session."""

    scenario: Scenario
    device: str
    golden_device: str  #: the device whose golden is checked (== device unless --precision-golden-device)
    future: Future | None = None
    golden: Golden | None = None
    golden_error: PrecisionError | None = None
    recorded: str | None = None  #: "recorded" / "unchanged" after an update
    size_note: str = ""  #: update mode: the golden's stored size and what the update added
    churn: list[churn_mod.ChurnRow] = field(default_factory=list)  #: update mode: against the previous golden
    lock: threading.Lock = field(default_factory=threading.Lock)
    prepared: bool = False
    runs: Scenario | None = None  #: the scenario as it runs (an auto one whose golden predates auto: at L1)
    localized: ItemKey | None = None  #: level auto: the failing stage this session reran at L1
    environment: EnvironmentDiff | None = None  #: the run's environment against the golden's, once run
    progress_shown: bool = False  #: the run's stage starts were reported (once, by the first item waiting)

    @property
    def cross_device(self) -> bool:
        """Another device's golden, or another accelerator model's (allowed by --precision-golden-device)."""
        model = self.environment.device_model if self.environment is not None else None
        return self.golden_device != self.device or model is not None


def missing_dumps(scenario: Scenario, run_dir: Path) -> list[str]:
    """Declared ``step_<n>/<stage>`` of ``scenario`` with no ``step0/rank*/dump.json`` in ``run_dir``."""
    return [
        f"step_{step}/{stage}"
        for step in scenario.steps
        for stage in scenario.stages
        if not any((run_dir / f"step_{step}" / stage).glob("step0/rank*/dump.json"))
    ]


def size_note(stored: int, before: int) -> str:
    """``"0.41 MB stored, +0.02 MB"``: a golden's stored size and what an update added to it."""
    return f"{stored / 1e6:.2f} MB stored, {(stored - before) / 1e6:+.2f} MB"


def msprobe_available() -> bool:
    """True if ``msprobe.core`` can be found (does not import msprobe.pytorch or torch)."""
    try:
        return importlib.util.find_spec("msprobe.core") is not None
    except (ImportError, ValueError):
        return False


class PrecisionSession:
    """State of one gate run. Not thread-safe except where noted (runs complete on worker threads)."""

    def __init__(self, options: PrecisionOptions, *, rootdir: Path) -> None:
        self.options = options
        self.rootdir = Path(rootdir)
        self.artifacts = self._abs(options.artifacts)
        self.store = GoldenStore(self._abs(options.golden_dir))
        self.report = PrecisionReport(mode=options.golden_mode)
        self.usage = GoldenUsage()  #: which scenarios were collected; why the run is partial
        self.on_progress: Callable[[str], None] | None = None  #: called with a line as each stage starts
        self._executor: ThreadPoolExecutor | None = None
        self._states: dict[str, ScenarioState] = {}

    def _abs(self, p: Path) -> Path:
        p = Path(p)
        return p if p.is_absolute() else self.rootdir / p

    def shown(self, p: Path) -> Path:
        """``p`` relative to rootdir where it lies below it (how verdicts and summaries name paths)."""
        try:
            return p.relative_to(self.rootdir)
        except ValueError:
            return p

    # ----------------------------------------------------------------------------------- runs
    def device_unavailable(self, scenario: Scenario) -> str | None:
        """Why the scenario's own ``device:`` cannot run here (``--precision-device auto`` only), else None.

        An explicit ``--precision-device`` is checked once at start-up instead (a usage error), and a
        Ray cluster (``--precision-ray-address``) is trusted to have the device the scenario asks for.
        """
        if self.options.device != "auto" or self.options.ray_address:
            return None
        return device_check.unavailable_reason(self.options.device_for(scenario))

    def state(self, scenario: Scenario) -> ScenarioState:
        st = self._states.get(scenario.name)
        if st is None:
            device = self.options.device_for(scenario)
            golden_device = self.options.golden_device or device
            st = self._states[scenario.name] = ScenarioState(scenario, device, golden_device)
        return st

    def run_dir(self, scenario: Scenario) -> Path:
        """``<artifacts>/<scenario>/run`` (``run-<worker>`` under xdist)."""
        run = "run" if not self.options.worker_id else f"run-{self.options.worker_id}"
        return join_inside(self.artifacts, scenario.name, run, what="artifacts <scenario>/run")

    def submit(self, scenario: Scenario) -> None:
        """Start ``scenario``'s run in the background if its items will need it (idempotent)."""
        st = self.state(scenario)
        if self.device_unavailable(scenario):
            return  # its items skip with the reason
        with st.lock:
            if st.future is not None or not self._needs_run(st):
                return
            try:
                self._start(st)
            except ProbeUnavailableError as exc:
                st.golden_error = exc  # every item of the scenario reports it

    def _needs_run(self, st: ScenarioState) -> bool:
        if self._records(st):
            return True
        self._load_golden(st)
        return st.golden_error is None

    def _load_golden(self, st: ScenarioState) -> None:
        if st.golden is None and st.golden_error is None:
            try:
                st.golden = self.store.load(st.scenario, st.golden_device)
            except PrecisionError as exc:
                st.golden_error = exc

    def _start(self, st: ScenarioState) -> None:
        """Submit ``st``'s worker run to the thread pool (caller holds ``st.lock``).

        Raises:
            ProbeUnavailableError: msprobe is not installed.
            UnsafePathError: the scenario name would leave the artifacts folder.
        """
        if not msprobe_available():
            raise ProbeUnavailableError("mindstudio-probe (msprobe) is not installed; pip install mindstudio-probe")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.options.jobs, thread_name_prefix="precision-run")
        scenario, run = self._runs(st), run_scenario
        kw: dict[str, Any] = {}
        if scenario.level == AUTO and self._records(st):
            run, kw = localize.run_recording, {"variants": self._variants(scenario)}
        st.future = self._executor.submit(
            run,
            scenario,
            out_dir=self.run_dir(scenario),
            device=st.device,
            timeout=self.options.timeout,
            ray_address=self.options.ray_address,
            pinned=st.golden if scenario.kind == "verl" and self.options.golden_mode == "check" else None,
            warm=self.options.worker == "warm",
            **kw,
        )

    def _records(self, st: ScenarioState) -> bool:
        """Whether this session records ``st``'s golden (update, or missing with none on disk)."""
        mode = self.options.golden_mode
        return mode == "update" or (mode == "missing" and not self.store.exists(st.scenario.name, st.device))

    def _variants(self, scenario: Scenario) -> Path:
        return join_inside(self.artifacts, scenario.name, "variants", what="artifacts <scenario>/variants")

    def _runs(self, st: ScenarioState) -> Scenario:
        """The scenario as this session runs it: a ``level: auto`` scenario whose golden was recorded at
        L1 (before auto) runs and gates at L1, with a note saying to re-record."""
        if st.runs is None:
            st.runs = st.scenario
            if st.scenario.level == AUTO and not self._records(st):
                self._load_golden(st)
                if st.golden is not None and gates_at_recorded_level(st.golden.level, st.scenario.level):
                    st.runs = localize.at_localize_level(st.scenario, self._variants(st.scenario))
                    self.report.notes.append(
                        f"{st.scenario.name}: golden recorded at {st.golden.level} before level: auto; gating at "
                        f"{st.golden.level}. Re-record for auto with: {update_command(st.scenario)}"
                    )
        return st.runs

    def start(self, scenario: Scenario) -> Future:
        """Start ``scenario``'s run whatever the golden mode (invariant checks need no golden); idempotent.

        The gate's items and :meth:`run` share this one run: a scenario runs once per session.

        Raises:
            ProbeUnavailableError: msprobe is not installed.
        """
        st = self.state(scenario)
        with st.lock:
            if st.future is None:
                self._start(st)
            assert st.future is not None
            return st.future

    def run(self, scenario: Scenario) -> RunResult:
        """Wait for :meth:`start`'s run. Raises RunFailedError or ProbeUnavailableError."""
        return self.start(scenario).result()

    def result(self, scenario: Scenario) -> RunResult:
        """Wait for the scenario's run. Raises RunFailedError (and the golden's error, if any)."""
        self.submit(scenario)
        st = self.state(scenario)
        if st.golden_error is not None:
            raise st.golden_error
        assert st.future is not None
        if self.on_progress is not None and not st.progress_shown:
            # once per run, even one already finished: the lines printed must not depend on timing
            st.progress_shown = True
            total = scenario.total_steps
            progress.follow(
                self.run_dir(scenario), st.future, scenario=scenario.name, report=self.on_progress, total_steps=total
            )
        return st.future.result()

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
                    return Scenario.load(path)
        where = ", ".join(f"{d}/" for d in dirs)
        raise ScenarioError(f"{name}: no scenario file {name}.yaml under {where} in {self.rootdir}")

    def variant(self, scenario: Scenario, overrides: dict[str, Any]) -> Scenario:
        """``scenario`` with verl-key ``overrides``, written under ``<artifacts>/variants/`` (no golden)."""
        st = self.state(scenario.with_overrides(overrides, directory=self.artifacts / "variants"))
        return st.scenario

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    # -------------------------------------------------------------------------------- outcomes
    def outcome(self, scenario: Scenario, key: ItemKey) -> Outcome:
        """Verdict of one item: a (step, stage) dump, or the scenario's metrics.

        Never raises for user-caused problems: a PrecisionError becomes a failed Outcome whose text
        is the error's one line.
        """
        try:
            st = self._prepare(scenario)
            if st.recorded is not None:
                path = self.shown(self.store.path(scenario.name, st.device))
                churn = [r for r in st.churn if (r.step, r.stage) == (key.step, key.stage)]
                text = f"golden {st.recorded}: {path} ({st.size_note})"
                return Outcome(True, text, OutcomeKind.RECORDED, churn=churn)
            run = self.result(scenario)
            assert st.golden is not None
            self._environment(st, run)
            localizes = st.golden.localizes and not key.is_metrics
            settings = self._settings(st)
            # a failure here is rerun at L1, whose verdict asks msprobe
            skip_msprobe = localizes and st.localized is None
            out = next(check_items(run.run_dir, st.golden, [key], replace(settings, msprobe=not skip_msprobe)))[1]
            if localizes and not out.passed and out.kind is not OutcomeKind.ERROR:
                out = self._localize(st, key, out, settings)
            return out
        except PrecisionError as exc:
            return Outcome.error(exc)

    def _environment(self, st: ScenarioState, run: RunResult) -> EnvironmentDiff:
        """The run's environment against the golden's, worked out once per scenario.

        Raises:
            GoldenDeviceModelError: the golden was recorded on another GPU/NPU model and
                --precision-golden-device was not given (goldens are kept per device type, not model).
        """
        if st.environment is None:
            assert st.golden is not None
            st.environment = EnvironmentDiff.between(st.golden.env, run.manifest.get("env"))
        model = st.environment.device_model
        if model is not None and not self.options.golden_device:
            path = display_path(self.store.path(st.scenario.name, st.golden_device))
            raise GoldenDeviceModelError(
                f"{path}/: recorded on {model.golden}, this run is on {model.run}: a golden is not used for another "
                f"{model.what} model silently; gate across models with --precision-golden-device {st.golden_device} "
                f"(tolerance.cross_device rules) or re-record it on this model with: {update_command(st.scenario)}"
            )
        return st.environment

    def _localize(self, st: ScenarioState, key: ItemKey, l0: Outcome, settings: CheckSettings) -> Outcome:
        """Rerun the scenario's first failing stage at L1 (level: auto); later failing stages point to it."""
        with st.lock:
            first, st.localized = st.localized, st.localized or key
        if first is not None and first != key:
            return localize.not_rerun(l0, first)
        assert st.golden is not None
        out_dir = join_inside(self.artifacts, st.scenario.name, "localize", what="artifacts <scenario>/localize")
        return localize.with_localization(
            l0,
            key,
            lambda: localize.localize(
                st.scenario,
                key,
                st.golden,
                settings,
                out_dir=out_dir,
                device=st.device,
                timeout=self.options.timeout,
                warm=self.options.worker == "warm",
            ),
        )

    def _prepare(self, scenario: Scenario) -> ScenarioState:
        """Run (if needed) and, in update/missing mode, record the golden once per scenario."""
        st = self.state(scenario)
        run = self.result(scenario)
        with st.lock:
            if not st.prepared:
                st.prepared = True
                self._note_undeclared(scenario, run)
                mode = self.options.golden_mode
                if mode == "update" or (mode == "missing" and st.golden is None):
                    try:
                        self._record(st, run)
                    except PrecisionError as exc:
                        st.golden_error = exc
        if st.golden_error is not None:
            raise st.golden_error
        return st

    def _record(self, st: ScenarioState, run: RunResult) -> None:
        """Promote the run to the golden (never from a partial run) and keep its churn and size."""
        scenario = st.scenario
        missing = missing_dumps(scenario, run.run_dir)
        if scenario.level == AUTO:
            missing += [f"{LOCALIZE_DIR}/{m}" for m in missing_dumps(scenario, run.run_dir / LOCALIZE_DIR)]
        if missing:
            raise RunFailedError(
                f"{display_path(scenario.path)}: no golden written: the run dumped no {missing[0]} "
                f"({len(missing)} declared (step, stage) missing); a verl run dumps nothing when "
                "precision_debugger.config_path is unset or msprobe is missing with strict: false"
            )
        previous = self.store.previous(scenario.name, st.device)
        st.churn = churn_mod.run_churn(scenario.name, run.run_dir, previous, scenario.steps, scenario.stages)
        st.recorded = "recorded" if self.store.promote(run.run_dir, scenario, st.device) else "unchanged"
        st.golden, st.golden_error = None, None
        self._load_golden(st)
        if st.golden is not None:
            st.size_note = size_note(st.golden.size_bytes, previous.size_bytes if previous is not None else 0)

    def _note_undeclared(self, scenario: Scenario, run: RunResult) -> None:
        """A stage a command dumped but did not declare is named in the summary, never silently ignored."""
        undeclared = run.manifest.get("undeclared") or []
        if undeclared:
            self.report.notes.append(
                f"{scenario.name}: dumped but not declared in precision_debugger.stages (not gated): "
                f"{', '.join(undeclared)}"
            )

    def _settings(self, st: ScenarioState) -> CheckSettings:
        scenario, golden = st.scenario, st.golden
        assert golden is not None
        return CheckSettings(
            scenario=scenario.name,
            policy=TolerancePolicy.for_golden(
                scenario.config["tolerance"], noise=golden.noise, cross_device=st.cross_device
            ),
            artifacts=join_inside(self.artifacts, scenario.name, what="artifacts <scenario>"),
            shown=self.shown,
            rerun=lambda key: self.rerun_command(scenario, key.selector),
            rerecord=update_command(scenario),
            changed=tuple(settings_changed(golden.numeric_settings, scenario.numeric_settings)),
            environment=st.environment or EnvironmentDiff(),
        )

    def rerun_command(self, scenario: Scenario, selector: str) -> str:
        try:
            path = scenario.path.resolve().relative_to(self.rootdir.resolve())
        except ValueError:
            path = scenario.path
        return f'pytest {path} -k "{selector}"'

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
        return {
            "device": st.device,
            "wall_s": round(run.wall_s, 3),
            "timings": run.manifest.get("timings", {}),
            "timing": progress.timing_line(run.manifest, profiled=profiled),
            "run_dir": str(self.shown(run.run_dir)),
        }

    def finish(self, *, scenario_dirs: list[str]) -> None:
        """End of the run (the xdist controller's, or the only process's): unused goldens, prune, report files."""
        if not self.usage.partial:
            self.usage.check_complete(discover_scenarios(self.rootdir, scenario_dirs), rootdir=self.rootdir)
        self.report.partial = list(self.usage.partial)
        if self.usage.partial and self.options.prune:
            reason = "; ".join(self.usage.partial)
            self.report.notes.append(f"precision-prune: nothing removed, not a full run ({reason})")
        elif not self.usage.partial:
            for name, device in self.store.unused(self.usage.names):
                path = str(self.shown(self.store.path(name, device)))
                if self.options.prune:
                    self.store.remove(name, device)
                    self.report.pruned.append(path)
                else:
                    self.report.unused.append({"scenario": name, "device": device, "path": path})
        if self.options.report is not None:
            t0 = time.perf_counter()
            paths = self.report.write(self._abs(self.options.report))
            shown = ", ".join(str(self.shown(p)) for p in paths)
            self.report.notes.append(f"precision report: {shown} ({time.perf_counter() - t0:.1f} s)")
