"""pytest-precision: gate msprobe stage statistics of short PPO scenarios against goldens.

Hooks only: options, ini keys, collection of ``scenarios/*.yaml`` into items (one per
(step, stage) plus one for ``metrics.jsonl``), and the terminal summary. The work is done by
:class:`precision_harness.session.PrecisionSession`. This module never imports torch.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from precision_harness import device_check
from precision_harness.errors import PrecisionError
from precision_harness.scenario import Scenario
from precision_harness.session import DEVICE_CHOICES, GOLDEN_MODES, PrecisionOptions, PrecisionSession

_SESSION_KEY = pytest.StashKey[PrecisionSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--precision-*`` options and ini keys."""
    group = parser.getgroup("precision", "pytest-precision: msprobe stage gate")
    group.addoption("--precision-golden", choices=GOLDEN_MODES, default="check",
                    help="check (default): compare against golden/; update: re-record every selected scenario's golden; "
                         "missing: record only goldens that do not exist yet")
    group.addoption("--precision-device", choices=DEVICE_CHOICES, default="auto",
                    help="device scenarios run on; auto uses each scenario's 'device' key (default cpu)")
    group.addoption("--precision-artifacts", metavar="DIR", default=None,
                    help="where runs and compare tables go (default: .precision/artifacts under rootdir)")
    group.addoption("--precision-jobs", metavar="N", type=int, default=None,
                    help="scenario runs in parallel in this process (default: CPU count)")
    group.addoption("--precision-ray-address", metavar="ADDRESS", default=None,
                    help="submit scenario runs to this existing Ray cluster (e.g. 10.0.0.1:6379 or ray://head:10001) "
                         "with the resources each scenario asks for; dumps are fetched back and compared here. "
                         "Default: single-rank scenarios run as local subprocesses, multi-rank ones on a local Ray instance")
    group.addoption("--precision-golden-device", choices=("cpu", "cuda", "npu"), default=None, metavar="DEVICE",
                    help="compare against the golden recorded on DEVICE (e.g. an NPU run against the GPU golden) "
                         "with the scenario's tolerance.cross_device rules")
    parser.addini("precision_golden_dir", "directory holding goldens, relative to rootdir", default="golden")
    parser.addini("precision_scenario_dirs", "directory names whose *.yaml files are scenarios", type="args", default=["scenarios"])
    parser.addini("precision_timeout", "seconds a scenario run may take (0: no limit)", default="0")


def pytest_configure(config: pytest.Config) -> None:
    """Create the run's PrecisionSession."""
    config.addinivalue_line("markers", "precision_scenario(name): item of a pytest-precision scenario")
    artifacts = config.getoption("precision_artifacts") or ".precision/artifacts"
    jobs = config.getoption("precision_jobs") or max(1, os.cpu_count() or 1)
    timeout = float(config.getini("precision_timeout") or 0) or None
    options = PrecisionOptions(
        golden_mode=config.getoption("precision_golden"), device=config.getoption("precision_device"),
        artifacts=Path(artifacts), golden_dir=Path(config.getini("precision_golden_dir")), jobs=jobs, timeout=timeout,
        ray_address=config.getoption("precision_ray_address"), golden_device=config.getoption("precision_golden_device"),
        worker_id=getattr(config, "workerinput", {}).get("workerid"),
    )
    _check_device_options(options, is_worker=hasattr(config, "workerinput"))
    if getattr(config, "workerinput", {}).get("precision_dist") == "loadgroup":
        config.option.loadgroup = True  # read by xdist's worker when it collects
    config.stash[_SESSION_KEY] = PrecisionSession(options, rootdir=config.rootpath)


def _check_device_options(options: PrecisionOptions, *, is_worker: bool) -> None:
    """One-line usage errors for device flags that cannot work (checked once, on the controller)."""
    if options.golden_device and options.golden_mode != "check":
        raise pytest.UsageError(
            f"--precision-golden-device {options.golden_device} compares against another device's golden; "
            f"it cannot be combined with --precision-golden {options.golden_mode} (drop one of the two)"
        )
    if options.device != "auto" and not options.ray_address and not is_worker:
        reason = device_check.unavailable_reason(options.device)
        if reason:
            raise pytest.UsageError(f"--precision-device {options.device}: {reason.removeprefix(f'device {options.device}: ')}")


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Any:
    """``-n N`` without ``--dist`` means ``--dist loadgroup``: a scenario's items stay on one worker, so it runs once.

    A wrapper, so it runs before xdist's own (tryfirst) hook turns ``-n`` into ``--dist load``.
    """
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) == "no" and not getattr(config.option, "distload", False):
        config.option.dist = "loadgroup"
    return (yield)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under loadgroup: make sure each scenario item's node id ends in ``@<scenario>``.

    xdist 3.8 groups by that suffix but writes it to ``item._nodeid``, which pytest >= 9.2 no longer reads
    (structured node ids; pytest-dev/pytest-xdist#1386): without this a scenario's items spread over workers.
    """
    if not (hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False)):
        return
    for item in items:
        if isinstance(item, PrecisionItem) and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            grouped = f"{item.nodeid}@{item.scenario.name}"
            node_id = getattr(item, "_id", None)
            if node_id is not None and hasattr(type(node_id), "parse"):
                item._id = type(node_id).parse(grouped)
            else:  # pragma: no cover - pytest < 9.2 reads _nodeid (and xdist already set it)
                item._nodeid = grouped


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each xdist worker the controller's ``--dist``: a worker re-parses the command line, where a
    defaulted loadgroup is absent, and xdist only groups items by ``xdist_group`` when it knows."""
    node.workerinput["precision_dist"] = node.config.option.dist


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand this worker's summary to the controller (``workeroutput``)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    precision = session.config.stash.get(_SESSION_KEY, None)
    if workeroutput is not None and precision is not None:
        workeroutput["precision_summary"] = json.dumps(precision.summary_data())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the xdist controller: merge a finished worker's summary (as syrupy merges its snapshot reports)."""
    data = getattr(node, "workeroutput", {}).get("precision_summary")
    if data:
        node.config.stash[_SESSION_KEY].merge_summary(json.loads(data))


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        session.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Collect ``*.yaml`` files inside a directory named in ``precision_scenario_dirs``."""
    if file_path.suffix in (".yaml", ".yml") and file_path.parent.name in parent.config.getini("precision_scenario_dirs"):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


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
            precision.submit(item.scenario)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Goldens recorded, items identical/compared/failed, run times."""
    lines = config.stash[_SESSION_KEY].summary_lines()
    if lines:
        terminalreporter.write_sep("-", "precision")
        for line in lines:
            terminalreporter.write_line(line)


class ScenarioFile(pytest.File):
    """A scenario YAML file: one item per profiled (step, stage), then one for metrics.jsonl."""

    def collect(self) -> Iterator[pytest.Item]:
        try:
            scenario = Scenario.load(self.path)
        except PrecisionError as exc:
            raise self.CollectError(str(exc)) from None
        for stage in scenario.ignored_stages:
            self.warn(pytest.PytestWarning(
                f"precision_debugger.stages: {stage!r} is unknown or never runs in this scenario; ignored (strict: false)"
            ))
        for step in scenario.steps:
            for stage in scenario.stages:
                yield StageItem.from_parent(self, name=f"{stage}[step_{step}]", scenario=scenario, step=step, stage=stage)
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

    def _verdict(self, **where: Any) -> None:
        __tracebackhide__ = True
        reason = self.config.stash[_SESSION_KEY].device_unavailable(self.scenario)
        if reason:
            pytest.skip(f"{self.scenario.name}: {reason}")
        outcome = self.config.stash[_SESSION_KEY].outcome(self.scenario, **where)
        self.user_properties.append(("precision_verdict", outcome.kind))
        if outcome.verdict is not None and hasattr(outcome.verdict, "worst_ratio"):
            self.user_properties.append(("precision_worst_ratio", f"{outcome.verdict.worst_ratio:.6g}"))
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

    def runtest(self) -> None:
        self._verdict(step=self.step, stage=self.stage)


class MetricsItem(PrecisionItem):
    """Compare the scenario's metrics.jsonl against the golden's."""

    def runtest(self) -> None:
        self._verdict()
