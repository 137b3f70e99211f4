"""PrecisionSession: owns one gate run (pytest session or CLI): runs, goldens, verdicts.

One place decides check / update / missing for every golden (as pytest-regressions'
``perform_regression_check``): :meth:`PrecisionSession.outcome` for a stage or the metrics of a
scenario. Scenario runs are started in worker processes on a thread pool, at most ``jobs`` at a
time, and each scenario runs once however many of its items are selected.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness import compare as compare_mod
from precision_harness import report
from precision_harness.errors import GoldenCorruptError, PrecisionError, ProbeUnavailableError
from precision_harness.golden import Golden, GoldenStore, update_command
from precision_harness.launch import RunResult, run_scenario
from precision_harness.scenario import Scenario, display_path
from precision_harness.tolerance import TolerancePolicy

GOLDEN_MODES = ("check", "update", "missing")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")


@dataclass(frozen=True)
class PrecisionOptions:
    """Options shared by the pytest plugin and the CLI."""

    golden_mode: str = "check"
    device: str = "auto"
    artifacts: Path = Path(".precision/artifacts")
    golden_dir: Path = Path("golden")
    jobs: int = max(1, os.cpu_count() or 1)
    timeout: float | None = None
    #: existing Ray cluster to submit runs to (``--precision-ray-address``); None: local subprocess / local Ray
    ray_address: str | None = None
    #: compare against the golden recorded on this device, with ``tolerance.cross_device`` (``--precision-golden-device``)
    golden_device: str | None = None
    #: pytest-xdist worker id (``gw0``): runs go to ``run-gw0`` so a scenario split over workers
    #: by an explicit ``--dist load`` cannot race on one run directory
    worker_id: str | None = None


@dataclass
class Outcome:
    """What an item reports: passed or not, the verdict text, and data for summaries."""

    passed: bool
    text: str
    kind: str  # "compared", "identical", "recorded", "error"
    verdict: Any = None


@dataclass
class ScenarioState:
    scenario: Scenario
    device: str
    golden_device: str = ""  #: the device whose golden is checked (== device unless --precision-golden-device)
    future: Future | None = None
    golden: Golden | None = None
    golden_error: PrecisionError | None = None
    recorded: str | None = None  # "recorded" / "unchanged" after update
    lock: threading.Lock = field(default_factory=threading.Lock)
    prepared: bool = False


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
        self._executor: ThreadPoolExecutor | None = None
        self._states: dict[str, ScenarioState] = {}
        self.outcomes: list[tuple[str, Outcome]] = []
        self._merged: list[dict[str, Any]] = []  #: summary_data() of xdist workers (controller only)

    def _abs(self, p: Path) -> Path:
        p = Path(p)
        return p if p.is_absolute() else self.rootdir / p

    # ----------------------------------------------------------------------------------- runs
    def device_for(self, scenario: Scenario) -> str:
        return scenario.config["device"] if self.options.device == "auto" else self.options.device

    def device_unavailable(self, scenario: Scenario) -> str | None:
        """Why the scenario's own ``device:`` cannot run here (``--precision-device auto`` only), else None.

        An explicit ``--precision-device`` is checked once at start-up instead (a usage error), and a
        Ray cluster (``--precision-ray-address``) is trusted to have the device the scenario asks for.
        """
        if self.options.device != "auto" or self.options.ray_address:
            return None
        from precision_harness import device_check

        return device_check.unavailable_reason(self.device_for(scenario))

    def state(self, scenario: Scenario) -> ScenarioState:
        st = self._states.get(scenario.name)
        if st is None:
            device = self.device_for(scenario)
            st = self._states[scenario.name] = ScenarioState(scenario=scenario, device=device, golden_device=self.options.golden_device or device)
        return st

    def run_dir(self, scenario: Scenario) -> Path:
        return self.artifacts / scenario.name / ("run" if not self.options.worker_id else f"run-{self.options.worker_id}")

    def _needs_run(self, st: ScenarioState) -> bool:
        mode = self.options.golden_mode
        if mode == "update" or (mode == "missing" and not self.store.exists(st.scenario.name, st.device)):
            return True
        self._load_golden(st)
        return st.golden_error is None

    def _load_golden(self, st: ScenarioState) -> None:
        if st.golden is None and st.golden_error is None:
            try:
                st.golden = self.store.load(st.scenario, st.golden_device)
            except PrecisionError as exc:
                st.golden_error = exc

    def submit(self, scenario: Scenario) -> None:
        """Start ``scenario``'s run in the background if its items will need it (idempotent)."""
        st = self.state(scenario)
        if self.device_unavailable(scenario):
            return  # its items skip with the reason
        with st.lock:
            if st.future is not None or not self._needs_run(st):
                return
            if not msprobe_available():
                st.golden_error = ProbeUnavailableError("mindstudio-probe (msprobe) is not installed; pip install mindstudio-probe")
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.options.jobs, thread_name_prefix="precision-run")
            st.future = self._executor.submit(
                run_scenario, scenario, out_dir=self.run_dir(scenario), device=st.device, timeout=self.options.timeout,
                ray_address=self.options.ray_address,
            )

    def result(self, scenario: Scenario) -> RunResult:
        """Wait for the scenario's run. Raises RunFailedError (and the golden's error, if any)."""
        self.submit(scenario)
        st = self.state(scenario)
        if st.golden_error is not None:
            raise st.golden_error
        assert st.future is not None
        return st.future.result()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    # -------------------------------------------------------------------------------- goldens
    def _prepare(self, scenario: Scenario) -> ScenarioState:
        """Run (if needed) and, in update/missing mode, record the golden once per scenario."""
        st = self.state(scenario)
        run = self.result(scenario)
        with st.lock:
            if not st.prepared:
                mode = self.options.golden_mode
                if mode == "update" or (mode == "missing" and st.golden is None):
                    changed = self.store.promote(run.run_dir, scenario, st.device)
                    st.recorded = "recorded" if changed else "unchanged"
                    st.golden, st.golden_error = None, None
                    self._load_golden(st)
                st.prepared = True
        if st.golden_error is not None:
            raise st.golden_error
        return st

    def rerun_command(self, scenario: Scenario, selector: str) -> str:
        try:
            rel = scenario.path.resolve().relative_to(self.rootdir.resolve())
        except ValueError:
            rel = scenario.path
        return f'pytest {rel} -k "{selector}"'

    def outcome(self, scenario: Scenario, *, step: int | None = None, stage: str | None = None) -> Outcome:
        """Verdict for one (scenario, step, stage) item, or the metrics item when ``stage`` is None.

        Never raises for user-caused problems: a PrecisionError becomes a failed Outcome whose text
        is the error's one line.
        """
        try:
            st = self._prepare(scenario)
            if st.recorded is not None:
                out = Outcome(True, f"golden {st.recorded}: {self.store.path(scenario.name, st.device)}", "recorded")
            elif stage is None:
                out = self._check_metrics(st)
            else:
                out = self._check_stage(st, step, stage)
        except PrecisionError as exc:
            out = Outcome(False, str(exc), "error")
        self.outcomes.append((scenario.name, out))
        return out

    def _changed(self, st: ScenarioState) -> list[str]:
        assert st.golden is not None
        return report.settings_changed(st.golden.manifest.get("numeric_settings"), st.scenario.numeric_settings)

    def _check_stage(self, st: ScenarioState, step: int, stage: str) -> Outcome:
        golden, scenario = st.golden, st.scenario
        assert golden is not None and step is not None
        if not golden.has_stage(step, stage):
            raise GoldenCorruptError(
                f"{display_path(golden.path)}: no dump for {stage} @ step_{step}; the golden predates this step/stage, "
                f"re-record with: {update_command(scenario)}"
            )
        sha = golden.sha256(step, stage)
        for rank in sha:
            golden.verify_file(f"step_{step}/{stage}/step0/{rank}/dump.json")
        run = self.result(scenario)
        artifacts = self.artifacts / scenario.name / f"step_{step}" / stage
        shutil.rmtree(artifacts, ignore_errors=True)
        verdict = compare_mod.compare_stage(
            run.stage_dir(step, stage), golden.stage_dir(step, stage), scenario=scenario.name, step=step, stage=stage,
            policy=self._policy(st), golden_sha256=sha,
            golden_statistics=golden.statistics(step, stage), artifacts=artifacts,
        )
        text = report.stage_text(
            verdict, artifacts=None if verdict.passed else self._rel(artifacts),
            rerun=None if verdict.passed else self.rerun_command(scenario, f"{stage} and step_{step}"),
            changed=None if verdict.passed else self._changed(st),
        )
        if not verdict.passed:
            artifacts.mkdir(parents=True, exist_ok=True)
            (artifacts / "verdict.txt").write_text(text + "\n", encoding="utf-8")
        return Outcome(verdict.passed, text, "identical" if verdict.identical else "compared", verdict)

    def _check_metrics(self, st: ScenarioState) -> Outcome:
        golden, scenario = st.golden, st.scenario
        assert golden is not None
        golden_metrics = golden.verify_file(golden.manifest.get("metrics", "metrics.jsonl"))
        run = self.result(scenario)
        verdict = compare_mod.compare_metrics(
            compare_mod.read_metrics(run.run_dir / "metrics.jsonl"), compare_mod.read_metrics(golden_metrics),
            scenario=scenario.name, policy=self._policy(st),
        )
        text = report.metrics_text(
            verdict, rerun=None if verdict.passed else self.rerun_command(scenario, "metrics"), policy_exact=self._policy(st).exact,
            changed=None if verdict.passed else self._changed(st),
        )
        return Outcome(verdict.passed, text, "compared", verdict)

    @staticmethod
    def _policy(st: ScenarioState) -> TolerancePolicy:
        """The scenario's tolerance; its ``cross_device`` rules when the golden comes from another device."""
        tolerance = st.scenario.config["tolerance"]
        if st.golden_device != st.device:
            return TolerancePolicy.cross_device_from_config(tolerance)
        return TolerancePolicy.from_config(tolerance)

    def _rel(self, p: Path) -> Path:
        try:
            return p.relative_to(self.rootdir)
        except ValueError:
            return p

    # -------------------------------------------------------------------------------- summary
    def summary_data(self) -> dict[str, Any]:
        """This process's share of the summary as plain JSON (what an xdist worker sends to the controller).

        Keys: ``recorded`` ``[[scenario, golden path, "recorded"|"unchanged"]]``, ``outcomes``
        ``[[scenario, passed, kind, text]]``, ``runs`` ``[[scenario, device, wall_s, run dir]]``. A summary
        that must add up over workers takes its inputs from here, never from ``_states``.
        """
        recorded, runs = [], []
        for name, st in sorted(self._states.items()):
            if st.recorded:
                recorded.append([name, str(self._rel(self.store.path(name, st.device))), st.recorded])
            if st.future is not None and st.future.done() and st.future.exception() is None:
                run = st.future.result()
                runs.append([name, st.device, run.wall_s, str(self._rel(run.run_dir))])
        outcomes = [[name, o.passed, o.kind, o.text] for name, o in self.outcomes]
        return {"recorded": recorded, "outcomes": outcomes, "runs": runs}

    def merge_summary(self, data: dict[str, Any]) -> None:
        """Add a worker's :meth:`summary_data` (pytest-xdist ``workeroutput``) to this controller's summary."""
        self._merged.append(data)

    def summary_lines(self) -> list[str]:
        """Terminal-summary lines: goldens recorded, stage counts, run wall times (merged over xdist workers)."""
        parts = [self.summary_data(), *self._merged]
        recorded = sorted(r for d in parts for r in d["recorded"])
        outs = [o for d in parts for o in d["outcomes"]]
        runs = sorted(r for d in parts for r in d["runs"])
        lines = [f"golden {state}: {path}" for _, path, state in recorded]
        if outs:
            identical = sum(kind == "identical" for _, _, kind, _ in outs)
            compared = sum(kind == "compared" for _, _, kind, _ in outs)
            n_recorded = sum(kind == "recorded" for _, _, kind, _ in outs)
            failed = sum(not passed for _, passed, _, _ in outs)
            counts = [f"{identical} identical to golden", f"{compared} within tolerance or compared"] if not n_recorded else [f"{n_recorded} recorded"]
            lines.append(f"{len(outs)} precision items: {', '.join(counts)}, {failed} failed")
        for name, device, wall_s, run_dir in runs:
            lines.append(f"{name} on {device}: run {wall_s:.1f} s -> {run_dir}")
        return lines
