"""pytest-precision: gate msprobe stage statistics of short PPO scenarios against goldens.

The pytest side of the gate: hooks (options from :mod:`precision_harness.options` plus the
``precision_scenario_dirs`` ini key, collection of scenario ``*.yaml`` files into items, one per
(step, stage) plus one for ``metrics.jsonl``, xdist grouping, the terminal summary), the item and
file classes, the public ``precision_run`` fixture, and :func:`precision_session` for a conftest.
The work is done by :class:`precision_harness.session.PrecisionSession`. This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from precision_harness import options
from precision_harness.check.item_key import METRICS_ITEM, ItemKey
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.errors import PrecisionError
from precision_harness.options import PrecisionOptions
from precision_harness.paths import display_path
from precision_harness.report.item_record import ItemRecord
from precision_harness.runs.host import device_availability
from precision_harness.runs.kind_runners import collect_scenario
from precision_harness.runs.launch import RunResult
from precision_harness.runs.processes import stop_on_signals
from precision_harness.scenarios.fresh_steps import FRESH_CHECK
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session import PrecisionSession

_SESSION_KEY = pytest.StashKey[PrecisionSession]()
_RECORD_KEY = pytest.StashKey[dict]()


def precision_session(config: pytest.Config) -> PrecisionSession:
    """The run's PrecisionSession (created in ``pytest_configure``), e.g. for a conftest that wraps its
    ``runner`` from a ``pytest_configure(trylast=True)`` of its own.

    Raises:
        KeyError: called before this plugin's ``pytest_configure``.
    """
    return config.stash[_SESSION_KEY]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--precision-*`` options and ini keys."""
    group = parser.getgroup("precision", "pytest-precision: msprobe stage gate")
    options.add_pytest_options(group, parser)
    parser.addini(
        "precision_scenario_dirs",
        "directory names whose *.yaml files are scenarios",
        type="args",
        default=["scenarios"],
    )


def _rerun_args(config: pytest.Config) -> tuple[str, ...]:
    """The options of this invocation a pasted rerun line needs to find the same ini, golden and device:
    ``-c``, ``--rootdir``, ``-o precision_*=...``, ``--precision-device``, ``--precision-golden-device``."""
    args: list[str] = []
    option = config.option
    if getattr(option, "inifilename", None):
        args += ["-c", display_path(option.inifilename)]
    if getattr(option, "rootdir", None):
        args += ["--rootdir", display_path(option.rootdir)]
    for item in getattr(option, "override_ini", None) or ():
        if item.startswith("precision_"):
            args += ["-o", item]
    for flag in ("device", "golden_device"):
        value = config.getoption(f"precision_{flag}")
        if value not in (None, "auto"):
            args += [f"--precision-{flag.replace('_', '-')}", value]
    return tuple(args)


def pytest_configure(config: pytest.Config) -> None:
    """Create the run's PrecisionSession."""
    config.addinivalue_line("markers", "precision_scenario(name): item of a pytest-precision scenario")
    precision_options = PrecisionOptions.from_pytest(config)
    _check_device_options(precision_options, is_worker=_is_xdist_worker(config))
    if getattr(config, "workerinput", {}).get("precision_dist") == "loadgroup":
        config.option.loadgroup = True  # read by xdist's worker when it collects
    precision = config.stash[_SESSION_KEY] = PrecisionSession(
        precision_options, rootdir=config.rootpath, rerun_args=_rerun_args(config)
    )
    stop_on_signals()  # a CI cancel (SIGTERM) ends the session as Ctrl-C does: its runs are stopped, none outlives it
    for flag, why in (
        ("keyword", "-k"),
        ("markexpr", "-m"),
        ("ignore", "--ignore"),
        ("ignore_glob", "--ignore-glob"),
        ("lf", "--lf"),
    ):
        if getattr(config.option, flag, None):
            precision.usage.mark_partial(f"{why} given")
    if not _is_xdist_worker(config):
        config.pluginmanager.register(_RecordCollector(precision), "precision-records")
    if config.get_verbosity() >= 0 and not _is_xdist_worker(config):
        precision.on_progress = lambda line: _progress(config, line)


def _progress(config: pytest.Config, line: str) -> None:
    """Write a progress line to the terminal while an item runs (capture suspended, as live logging does)."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if terminal is None:
        return
    if capture is not None:
        with capture.global_and_fixture_disabled():
            terminal.write_line(f"[precision] {line}")
    else:
        terminal.write_line(f"[precision] {line}")


def _is_xdist_worker(config: pytest.Config) -> bool:
    return getattr(config, "workerinput", None) is not None


def pytest_deselected(items: list[pytest.Item]) -> None:
    """A deselected item makes the run partial: no golden is called unused."""
    if items:
        items[0].config.stash[_SESSION_KEY].usage.mark_partial(
            f"{len(items)} item{'s' if len(items) != 1 else ''} deselected"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Carry the item's report record on its TestReport (so it reaches the xdist controller)."""
    outcome = yield
    record = item.stash.get(_RECORD_KEY, None)
    if record is not None and call.when == "call":
        outcome.get_result().precision_record = record


class _RecordCollector:
    """Collects report records where the report is written (this process, or the xdist controller)."""

    def __init__(self, precision: PrecisionSession) -> None:
        self.precision = precision

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "precision_record", None)
        if record is not None and report.when == "call":
            self.precision.report.records.append(ItemRecord.from_json(record))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Unused goldens, --precision-prune and --precision-report.

    An xdist worker only hands what it collected to the controller, which finishes the run.
    """
    config = session.config
    precision = config.stash[_SESSION_KEY]
    if _is_xdist_worker(config):
        config.workeroutput["precision_usage"] = precision.usage.to_json()  # type: ignore[attr-defined]
        config.workeroutput["precision_notes"] = list(precision.report.notes)  # type: ignore[attr-defined]
        return
    if config.option.collectonly:
        return
    try:
        precision.finish(scenario_dirs=config.getini("precision_scenario_dirs"))
    except PrecisionError as exc:
        precision.report.notes.append(f"precision report failed: {exc}")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: merge which scenarios a worker collected (each worker collects every scenario) and the
    summary notes its runs wrote ("run to step N of M, as selected").

    Item records need no merging: they reach the controller on each TestReport.
    """
    output = getattr(node, "workeroutput", {})
    precision = node.config.stash[_SESSION_KEY]
    if output.get("precision_usage") is not None:
        precision.usage.merge(output["precision_usage"])
    precision.report.add_notes(output.get("precision_notes", ()))


def _check_device_options(options: PrecisionOptions, *, is_worker: bool) -> None:
    """One-line usage errors for device flags that cannot work (checked once, on the controller)."""
    if options.golden_device and options.golden_mode != "check":
        raise pytest.UsageError(
            f"--precision-golden-device {options.golden_device} compares against another device's golden; "
            f"it cannot be combined with --precision-golden {options.golden_mode} (drop one of the two)"
        )
    if options.device != "auto" and not options.ray_address and not is_worker:
        reason = device_availability.unavailable_reason(options.device)
        if reason:
            raise pytest.UsageError(
                f"--precision-device {options.device}: {reason.removeprefix(f'device {options.device}: ')}"
            )


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Any:
    """``-n N`` without ``--dist`` means ``--dist loadgroup``: a scenario's items stay on one worker, so it runs once.

    A wrapper, so it runs before xdist's own (tryfirst) hook turns ``-n`` into ``--dist load``.
    """
    if (
        getattr(config.option, "numprocesses", None)
        and getattr(config.option, "dist", None) == "no"
        and not getattr(config.option, "distload", False)
    ):
        config.option.dist = "loadgroup"
    return (yield)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under loadgroup: make sure each scenario item's node id ends in ``@<scenario>``, and
    any other item's in ``@<its xdist_group mark's name>``.

    xdist 3.8 groups by that suffix but writes it to ``item._nodeid``, which pytest >= 9.2 no longer reads
    (structured node ids; pytest-dev/pytest-xdist#1386): without this a scenario's items spread over workers,
    and so do the tests of a project's own ``xdist_group`` (a suite that runs beside its gate under ``-n``).
    """
    if not (hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False)):
        return
    for item in items:
        group = _xdist_group(item)
        if group and "@" not in item.nodeid.rsplit("]", 1)[-1].rsplit("::", 1)[-1]:
            grouped = f"{item.nodeid}@{group}"
            node_id = getattr(item, "_id", None)
            if node_id is not None and hasattr(type(node_id), "parse"):
                item._id = type(node_id).parse(grouped)
            else:  # pragma: no cover - pytest < 9.2 reads _nodeid (and xdist already set it)
                item._nodeid = grouped


def _xdist_group(item: pytest.Item) -> str | None:
    if isinstance(item, PrecisionItem):
        return item.scenario.name
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each xdist worker the controller's ``--dist``: a worker re-parses the command line, where a
    defaulted loadgroup is absent, and xdist only groups items by ``xdist_group`` when it knows."""
    node.workerinput["precision_dist"] = node.config.option.dist


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        session.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Collect ``*.yaml`` files inside a directory named in ``precision_scenario_dirs``."""
    if file_path.suffix in (".yaml", ".yml") and file_path.parent.name in parent.config.getini(
        "precision_scenario_dirs"
    ):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tell the session each scenario's selected items, so a check runs it only as far as they need (``-k step_1``,
    a pasted rerun line). Not where a test takes ``precision_run``: it is given the gate's run, whole."""
    if any("precision_run" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    selected: dict[str, list[ItemKey]] = {}
    for item in session.items:
        if isinstance(item, PrecisionItem):
            selected.setdefault(item.scenario.name, []).append(item.key)
    for name, keys in selected.items():
        session.config.stash[_SESSION_KEY].select(name, keys)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Start every selected scenario's run up front so runs overlap (bounded by --precision-jobs)."""
    if session.config.option.collectonly or session.testsfailed or not session.items:
        return
    if getattr(session.config, "workerinput", None) is not None:
        return  # under xdist a worker learns its items one by one: runs start lazily
    precision = session.config.stash[_SESSION_KEY]
    seen: set[str] = set()
    for item in session.items:
        if isinstance(item, PrecisionItem) and item.scenario.name not in seen:
            seen.add(item.scenario.name)
            precision.schedule(item.scenario)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Goldens recorded, items identical/compared/failed, run times."""
    lines = list(config.stash[_SESSION_KEY].report.lines)
    if lines:
        terminalreporter.write_sep("-", "precision")
        for line in lines:
            terminalreporter.write_line(line)


class PrecisionRuns:
    """What the ``precision_run`` fixture returns: scenario runs shared with the gate, one per session.

    ``precision_run("grpo_tiny")`` waits for and returns the :class:`~precision_harness.runs.launch.RunResult`
    of ``scenarios/grpo_tiny.yaml`` (the run the gate's items use, started if the gate did not);
    ``precision_run("grpo_tiny", {"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1})``
    runs that variant once. ``start(...)`` takes the same arguments and returns at once, so several
    runs can overlap (up to ``--precision-jobs``). A scenario that cannot run fails the test in one line.
    """

    def __init__(self, session: PrecisionSession, dirs: list[str]) -> None:
        self._session, self._dirs = session, dirs

    def _scenario(self, name: str, overrides: dict[str, Any] | None) -> Scenario:
        scenario = self._session.scenario_named(name, self._dirs)
        return self._session.variant(scenario, overrides) if overrides else scenario

    def start(self, name: str, overrides: dict[str, Any] | None = None) -> None:
        """Start the run of scenario ``name`` (or of its variant) without waiting."""
        try:
            self._session.start(self._scenario(name, overrides))
        except PrecisionError as exc:
            pytest.fail(str(exc), pytrace=False)

    def __call__(self, name: str, overrides: dict[str, Any] | None = None) -> RunResult:
        __tracebackhide__ = True
        try:
            return self._session.run(self._scenario(name, overrides))
        except PrecisionError as exc:
            pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def precision_run(request: pytest.FixtureRequest) -> PrecisionRuns:
    """Scenario runs (dumps, metrics.jsonl, log_probs.json) by scenario name, shared with the gate."""
    return PrecisionRuns(request.config.stash[_SESSION_KEY], list(request.config.getini("precision_scenario_dirs")))


class ScenarioFile(pytest.File):
    """A scenario YAML file: one item per profiled (step, stage), per (step, invariant), per fresh step, then one for
    metrics.jsonl."""

    def collect(self) -> Iterator[pytest.Item]:
        usage = self.config.stash[_SESSION_KEY].usage
        try:
            scenario = collect_scenario(self.path)  # without verl: collected, its items say they cannot run
        except PrecisionError as exc:
            usage.mark_partial(f"{self.path.name} failed to collect")
            raise self.CollectError(str(exc)) from None
        usage.names.add(scenario.name)
        usage.files.add(str(self.path.resolve()))
        for stage in scenario.ignored_stages:
            self.warn(
                pytest.PytestWarning(
                    f"precision_debugger.stages: {stage!r} is unknown or never runs in this scenario; "
                    "ignored (strict: false)"
                )
            )
        for step in scenario.steps:
            for stage in scenario.stages:
                yield StageItem.from_parent(
                    self, name=f"{stage}[step_{step}]", scenario=scenario, step=step, stage=stage
                )
        for step, check in scenario.invariant_items:
            yield InvariantItem.from_parent(
                self, name=f"{check}[step_{step}]", scenario=scenario, step=step, stage=check
            )
        for step in scenario.fresh_steps:
            yield FreshStepItem.from_parent(
                self, name=f"{FRESH_CHECK}[step_{step}]", scenario=scenario, step=step, stage=FRESH_CHECK
            )
        if scenario.gates_metrics:
            yield MetricsItem.from_parent(self, name="metrics", scenario=scenario)


class PrecisionFailure(Exception):
    """Raised by an item whose verdict failed; its message is the whole verdict text."""


class PrecisionItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        # keep a scenario's items on one xdist worker (--dist loadgroup), so it runs once
        self.add_marker(pytest.mark.xdist_group(name=scenario.name))
        self.add_marker(pytest.mark.precision_scenario(scenario.name))

    #: what the item checks
    key: ItemKey = METRICS_ITEM

    def runtest(self) -> None:
        self._verdict(self.key)

    def _verdict(self, key: ItemKey) -> None:
        __tracebackhide__ = True
        precision = self.config.stash[_SESSION_KEY]
        outcome = precision.outcome(self.scenario, key)
        record = precision.record(outcome, nodeid=self.nodeid, scenario=self.scenario, key=key)
        self.stash[_RECORD_KEY] = record.to_json()
        self.user_properties.extend(record.user_properties())
        if outcome.kind is OutcomeKind.SKIPPED:  # cannot run here, and --precision-allow-skip was given
            pytest.skip(outcome.text)
        if not outcome.passed:
            raise PrecisionFailure(outcome.text)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, (PrecisionFailure, PrecisionError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.scenario.name}::{self.name}"


class StageItem(PrecisionItem):
    """Compare one stage's dump.json (every rank) against the golden."""

    def __init__(self, *, step: int, stage: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step, self.stage = step, stage
        self.key = ItemKey(step, stage)


class InvariantItem(StageItem):
    """One ``invariants:`` check at one step (``weight_sync``, ``rollout_log_prob_parity``): no golden."""


class FreshStepItem(StageItem):
    """One ``verl.fresh_steps`` step: the mismatch of its fresh rollouts with training, against the bounds."""


class MetricsItem(PrecisionItem):
    """Compare the scenario's metrics.jsonl against the golden's."""
