"""PrecisionSession: owns one gate run (pytest session or CLI): runs, goldens, verdicts.

One place decides check / update / missing for every golden (as pytest-regressions'
``perform_regression_check``): :meth:`PrecisionSession.outcome` for a stage or the metrics of a
scenario. Scenario runs are started in worker processes on a thread pool, at most ``jobs`` at a
time, and each scenario runs once however many of its items are selected.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from precision_harness import churn as churn_mod
from precision_harness import progress, report
from precision_harness.check import Outcome, check_metrics, check_stage
from precision_harness.errors import GoldenCorruptError, PrecisionError, ProbeUnavailableError, ScenarioError
from precision_harness.golden import Golden, GoldenStore, update_command
from precision_harness.launch import RunResult, run_scenario
from precision_harness.options import DEVICE_CHOICES, GOLDEN_MODES  # noqa: F401  (re-exported)
from precision_harness.scenario import Scenario, canonical_json, display_path
from precision_harness.tolerance import TolerancePolicy
from precision_harness.usage import GoldenUsage


@dataclass(frozen=True)
class PrecisionOptions:
    """Options shared by the pytest plugin and the CLI."""

    golden_mode: str = "check"
    device: str = "auto"
    artifacts: Path = Path(".precision/artifacts")
    golden_dir: Path = Path("golden")
    jobs: int = max(1, os.cpu_count() or 1)
    timeout: float | None = None
    report: Path | None = None  #: directory for report.json/.md/.html (``--precision-report``)
    prune: bool = False  #: remove unused goldens on a full run (``--precision-prune``)
    #: existing Ray cluster to submit runs to (``--precision-ray-address``); None: local subprocess / local Ray
    ray_address: str | None = None
    #: compare against the golden recorded on this device, with ``tolerance.cross_device`` (``--precision-golden-device``)
    golden_device: str | None = None
    #: pytest-xdist worker id (``gw0``): runs go to ``run-gw0`` so a scenario split over workers
    #: by an explicit ``--dist load`` cannot race on one run directory
    worker_id: str | None = None


@dataclass
class ScenarioState:
    scenario: Scenario
    device: str
    golden_device: str = ""  #: the device whose golden is checked (== device unless --precision-golden-device)
    future: Future | None = None
    golden: Golden | None = None
    golden_error: PrecisionError | None = None
    recorded: str | None = None  # "recorded" / "unchanged" after update
    churn: list[churn_mod.ChurnRow] | None = None  # update mode: against the previous golden
    compare_s: float = 0.0  # compare (and msprobe analysis) time of this scenario's items
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
        self.records: list[dict[str, Any]] = []  #: report records of every item (see report.item_record)
        self.usage = GoldenUsage()  #: which scenarios were collected; why the run is partial
        self.on_progress: Callable[[str], None] | None = None  #: called with a line as each stage starts
        self.finish_lines: list[str] = []  #: unused goldens, pruning, report paths
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
            st = self._states[scenario.name] = ScenarioState(
                scenario=scenario, device=device, golden_device=self.options.golden_device or device
            )
        return st

    def run_dir(self, scenario: Scenario) -> Path:
        return (
            self.artifacts / scenario.name / ("run" if not self.options.worker_id else f"run-{self.options.worker_id}")
        )

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
            try:
                self._start(st)
            except ProbeUnavailableError as exc:
                st.golden_error = exc  # every item of the scenario reports it

    def _start(self, st: ScenarioState) -> None:
        """Submit ``st``'s worker run to the thread pool (caller holds ``st.lock``).

        Raises:
            ProbeUnavailableError: msprobe is not installed.
        """
        if not msprobe_available():
            raise ProbeUnavailableError("mindstudio-probe (msprobe) is not installed; pip install mindstudio-probe")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.options.jobs, thread_name_prefix="precision-run")
        st.future = self._executor.submit(
            run_scenario,
            st.scenario,
            out_dir=self.run_dir(st.scenario),
            device=st.device,
            timeout=self.options.timeout,
            ray_address=self.options.ray_address,
        )

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
        raise ScenarioError(
            f"{name}: no scenario file {name}.yaml under {', '.join(f'{d}/' for d in dirs)} in {self.rootdir}"
        )

    def variant(self, scenario: Scenario, overrides: Mapping[str, Any], *, tag: str | None = None) -> Scenario:
        """``scenario`` with ``overrides`` (``{"dotted.key": value}``, verl key names) applied, as a new scenario.

        The variant is written to ``<artifacts>/variants/<name>.<tag>.yaml`` (``tag`` defaults to a
        digest of the overrides) and loaded, so it is validated like any scenario file; it has no golden.

        Raises:
            ScenarioError: an override names an unknown key or a bad value (the message names the
                variant file and the field).
        """
        tag = tag or hashlib.sha256(canonical_json(dict(overrides)).encode()).hexdigest()[:10]
        name = f"{scenario.name}.{tag}"
        st = self._states.get(name)
        if st is not None:
            return st.scenario
        raw = yaml.safe_load(scenario.path.read_text(encoding="utf-8")) or {}
        for dotted, value in overrides.items():
            node = raw
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise ScenarioError(
                        f"{display_path(scenario.path)}: {dotted}: {key} is not a mapping; cannot override"
                    )
            node[leaf] = value
        raw["name"] = name
        pd = raw.get("global_profiler", {}).get("global_tool_config", {}).get("precision_debugger", {})
        if pd.get("config_path"):  # keep it relative to the original scenario file
            pd["config_path"] = str((scenario.path.parent / pd["config_path"]).resolve())
        path = self.artifacts / "variants" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = f"# variant of {display_path(scenario.path)}: {canonical_json(dict(overrides))}\n" + yaml.safe_dump(
            raw, sort_keys=False
        )
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        variant = Scenario.load(path)
        self.state(variant)
        return variant

    def result(self, scenario: Scenario) -> RunResult:
        """Wait for the scenario's run. Raises RunFailedError (and the golden's error, if any)."""
        self.submit(scenario)
        st = self.state(scenario)
        if st.golden_error is not None:
            raise st.golden_error
        assert st.future is not None
        if self.on_progress is not None and not st.future.done():
            progress.follow(
                self.run_dir(scenario),
                st.future,
                scenario=scenario.name,
                report=self.on_progress,
                total_steps=scenario.config["trainer"]["total_training_steps"],
            )
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
                    previous = self.store.previous(scenario.name, st.device)
                    st.churn = churn_mod.run_churn(
                        scenario.name, run.run_dir, previous, scenario.steps, scenario.stages
                    )
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
                out.extra["churn"] = [r for r in st.churn or [] if (r.step, r.stage) == (step, stage)]
            elif stage is None:
                out = self._check_metrics(st)
            else:
                out = self._check_stage(st, step, stage)
        except PrecisionError as exc:
            out = Outcome(False, str(exc), "error")
        self.state(scenario).compare_s += out.seconds
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
        return check_stage(
            run.stage_dir(step, stage),
            golden.stage_dir(step, stage),
            scenario=scenario.name,
            step=step,
            stage=stage,
            policy=self._policy(st),
            golden_sha256=sha,
            golden_statistics=golden.statistics(step, stage),
            artifacts=artifacts,
            shown_artifacts=self._rel(artifacts),
            rerun=self.rerun_command(scenario, f"{stage} and step_{step}"),
            changed=self._changed(st),
            level=golden.manifest.get("level"),
        )

    @staticmethod
    def _policy(st: ScenarioState) -> TolerancePolicy:
        """The scenario's tolerance (its ``cross_device`` rules when the golden comes from another
        device), widened by the golden's calibrated noise, if any."""
        assert st.golden is not None
        tolerance = st.scenario.config["tolerance"]
        if st.golden_device != st.device:
            base = TolerancePolicy.cross_device_from_config(tolerance)
        else:
            base = TolerancePolicy.from_config(tolerance)
        return base.with_noise(st.golden.manifest.get("noise"))

    def _check_metrics(self, st: ScenarioState) -> Outcome:
        golden, scenario = st.golden, st.scenario
        assert golden is not None
        golden_metrics = golden.verify_file(golden.manifest.get("metrics", "metrics.jsonl"))
        run = self.result(scenario)
        return check_metrics(
            run.run_dir / "metrics.jsonl",
            golden_metrics,
            scenario=scenario.name,
            policy=self._policy(st),
            rerun=self.rerun_command(scenario, "metrics"),
            changed=self._changed(st),
        )

    def _rel(self, p: Path) -> Path:
        try:
            return p.relative_to(self.rootdir)
        except ValueError:
            return p

    # -------------------------------------------------------------------------------- summary
    def summary_data(self) -> dict[str, Any]:
        """This process's share of the summary as plain JSON (what an xdist worker sends to the controller).

        Keys: ``recorded`` ``[[scenario, golden path, "recorded"|"unchanged", churn lines]]``, ``outcomes``
        ``[[scenario, passed, kind, text]]``, ``runs`` ``[[scenario, device, wall_s, run dir, timing text,
        compare_s]]``. A summary
        that must add up over workers takes its inputs from here, never from ``_states``.
        """
        recorded, runs = [], []
        for name, st in sorted(self._states.items()):
            if st.recorded:
                recorded.append(
                    [name, str(self._rel(self.store.path(name, st.device))), st.recorded, churn_lines(st.churn or [])]
                )
            if st.future is not None and st.future.done() and st.future.exception() is None:
                run = st.future.result()
                profiled = {f"step_{a}/{b}" for a in st.scenario.steps for b in st.scenario.stages}
                timing = progress.timing_line(run.manifest, profiled=profiled)
                runs.append([name, st.device, run.wall_s, str(self._rel(run.run_dir)), timing, st.compare_s])
        outcomes = [[name, o.passed, o.kind, o.text] for name, o in self.outcomes]
        return {"recorded": recorded, "outcomes": outcomes, "runs": runs}

    def merge_summary(self, data: dict[str, Any]) -> None:
        """Add a worker's :meth:`summary_data` (pytest-xdist ``workeroutput``) to this controller's summary."""
        self._merged.append(data)

    def summary_lines(self) -> list[str]:
        """Terminal-summary lines: goldens recorded (with churn), item counts, run and compare times,
        then unused goldens and report paths; merged over xdist workers."""
        parts = [self.summary_data(), *self._merged]
        recorded = sorted((r for d in parts for r in d["recorded"]), key=lambda r: r[0])
        outs = [o for d in parts for o in d["outcomes"]]
        runs = sorted((r for d in parts for r in d["runs"]), key=lambda r: r[0])
        lines: list[str] = []
        for _, path, state, churn in recorded:
            lines.append(f"golden {state}: {path}")
            lines += churn
        if outs:
            identical = sum(kind == "identical" for _, _, kind, _ in outs)
            compared = sum(kind == "compared" for _, _, kind, _ in outs)
            n_recorded = sum(kind == "recorded" for _, _, kind, _ in outs)
            failed = sum(not passed for _, passed, _, _ in outs)
            counts = (
                [f"{identical} identical to golden", f"{compared} within tolerance or compared"]
                if not n_recorded
                else [f"{n_recorded} recorded"]
            )
            lines.append(f"{len(outs)} precision items: {', '.join(counts)}, {failed} failed")
        for name, device, wall_s, run_dir, timing, compare_s in runs:
            lines.append(f"{name} on {device}: run {wall_s:.1f} s ({timing}), compare {compare_s:.1f} s -> {run_dir}")
        return lines + self.finish_lines

    # ----------------------------------------------------------------------- reports, unused goldens
    def record(
        self, *, nodeid: str, scenario: Scenario, step: int | None, stage: str | None, outcome: Outcome
    ) -> dict[str, Any]:
        """The report record of one item (plain JSON: it travels to the xdist controller on the TestReport)."""
        run = None
        st = self.state(scenario)
        if stage is None and st.future is not None and st.future.done() and st.future.exception() is None:
            res = st.future.result()
            run = {
                "wall_s": round(res.wall_s, 3),
                "timings": res.manifest.get("timings", {}),
                "run_dir": str(self._rel(res.run_dir)),
            }
        return report.item_record(
            nodeid=nodeid, scenario=scenario.name, step=step, stage=stage, outcome=outcome, run=run
        )

    def finish(self, *, scenario_dirs: list[str]) -> None:
        """End of the run (the xdist controller's, or the only process's): unused goldens, prune, report."""
        from precision_harness.usage import discover_scenarios

        if not self.usage.partial:
            self.usage.check_complete(discover_scenarios(self.rootdir, scenario_dirs), rootdir=self.rootdir)
        unused: list[dict[str, Any]] = []
        pruned: list[str] = []
        if self.usage.partial:
            if self.options.prune:
                self.finish_lines.append(
                    f"precision-prune: nothing removed, not a full run ({'; '.join(self.usage.partial)})"
                )
        else:
            for name, device in self.store.unused(self.usage.names):
                path = str(self._rel(self.store.path(name, device)))
                if self.options.prune:
                    self.store.remove(name, device)
                    pruned.append(path)
                    self.finish_lines.append(f"golden pruned: {path}")
                else:
                    unused.append({"scenario": name, "device": device, "path": path})
                    self.finish_lines.append(
                        f"golden unused: {path} (no collected scenario {name}; remove with --precision-prune)"
                    )
        if self.options.report is not None:
            t0 = time.perf_counter()
            doc = report.build_report(
                self.records, mode=self.options.golden_mode, unused=unused, pruned=pruned, partial=self.usage.partial
            )
            paths = report.write_report(self._abs(self.options.report), doc)
            self.finish_lines.append(
                f"precision report: {', '.join(str(self._rel(p)) for p in paths)} ({time.perf_counter() - t0:.1f} s)"
            )


def churn_lines(rows: list[churn_mod.ChurnRow]) -> list[str]:
    """Terminal lines of a scenario's churn table (only changed stages; a count of unchanged ones)."""
    if not rows:
        return []
    if all(r.status == "new" for r in rows):
        return [f"  new golden: {len(rows)} stage dumps"]
    changed = [r for r in rows if r.status != "unchanged"]
    lines = [f"  churn against the previous golden: {len(changed)} of {len(rows)} stage dumps changed"]
    return lines + ["    " + line for line in churn_mod.churn_table(changed)] if changed else lines
