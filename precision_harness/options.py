"""Options defined once, read by both the pytest plugin and ``precision-harness`` (as pytest-benchmark).

Each :class:`Option` says how it appears to pytest (``--precision-<name>`` or an ini key), to the
CLI (``--<name>`` on the listed subcommands), which :class:`PrecisionOptions` field it fills, its one
default and how a raw value becomes that field. :func:`add_pytest_options` and
:func:`add_cli_options` register the same definitions, and :meth:`PrecisionOptions.from_pytest` and
:meth:`PrecisionOptions.from_cli` read them back through the same table, so a flag, its choices,
default and help never drift apart.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from precision_harness.scenarios.scenario import Scenario

GOLDEN_MODES = ("check", "update", "missing")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")
WORKER_MODES = ("warm", "fresh")
JUDGEMENT_MODES = ("replay", "off")
#: seconds msprobe's worker has to answer on a failing stage (precision_harness.check.localize.msprobe_worker): its
#: reading of a 60,000-call window takes under a second, so this is only ever reached by a worker that hangs
MSPROBE_TIMEOUT_S = 600
LOCALIZE_MODES = ("rerun", "off")


def _path_or_none(value: Any) -> Path | None:
    return Path(value) if value else None


def _timeout(value: Any) -> float | None:
    return float(value or 0) or None


def _jobs(value: Any) -> int | None:
    """``--precision-jobs``, or None when the user did not set it (:meth:`PrecisionOptions.jobs_for` decides)."""
    return int(value) if value else None


def _flag(value: Any) -> bool:
    """A flag or its ini key: ``True``, or ``true``/``1``/``yes``/``on`` (any case) in the ini file."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes", "on")


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Option:
    """One option: its flag or ini key, its CLI subcommands, its :class:`PrecisionOptions` field.

    ``pytest`` is ``"option"`` (``--precision-<name>``), ``"ini"`` (``precision_<name>``), ``"both"`` (the
    flag, else the ini key) or None.
    ``default`` is the raw default (as typed); ``convert`` turns a raw value into the field's value.
    """

    name: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    flag: bool = False  #: store_true
    pytest: str | None = "option"
    cli: tuple[str, ...] = ()  #: subcommands of ``precision-harness`` that take ``--<name>``
    field: str = ""  #: the PrecisionOptions field (default: the name with ``_``)
    convert: Callable[[Any], Any] = _same

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def target(self) -> str:
        return self.field or self.dest

    def value(self, raw: Any) -> Any:
        """The field value of ``raw`` (None: this option's default)."""
        return self.convert(self.default if raw is None else raw)

    def argparse_kwargs(self) -> dict[str, Any]:
        if self.flag:
            return {"action": "store_true", "default": False, "help": self.help}
        kw: dict[str, Any] = {"default": self.default, "help": self.help}
        for key in ("choices", "type", "metavar"):
            if getattr(self, key) is not None:
                kw[key] = getattr(self, key)
        return kw


OPTIONS: tuple[Option, ...] = (
    Option(
        "golden",
        "check (default): compare against golden/; update: re-record every selected scenario's golden "
        "(prints the churn against the previous one); missing: record only goldens that do not exist yet",
        default="check",
        choices=GOLDEN_MODES,
        field="golden_mode",
    ),
    Option(
        "device",
        "device scenarios run on; auto uses each scenario's 'device' key (default cpu). For compare: the "
        "device the target ran on; auto reads it from the target's run.json, else takes the golden's",
        default="auto",
        choices=DEVICE_CHOICES,
        cli=("run", "calibrate", "compare", "export", "portability", "history", "bisect"),
    ),
    Option(
        "artifacts",
        "where runs and compare tables go (default: .precision/artifacts under rootdir)",
        default=".precision/artifacts",
        metavar="DIR",
        cli=("compare", "bisect"),
        convert=Path,
    ),
    Option(
        "jobs",
        "scenario runs in parallel in this process (default: the CPU count for cpu runs, 1 for npu and cuda "
        "runs: a device run, verl's above all, takes the host's accelerators)",
        type=int,
        metavar="N",
        convert=_jobs,
    ),
    Option(
        "report",
        "write report.json, report.md and report.html (drift heatmap, drift plots) into DIR",
        metavar="DIR",
        cli=("compare",),
        convert=_path_or_none,
    ),
    Option(
        "prune",
        "remove goldens whose scenario was not collected (only on a full, unfiltered run)",
        flag=True,
        convert=bool,
    ),
    Option(
        "ray-address",
        "submit scenario runs to this existing Ray cluster (e.g. 10.0.0.1:6379 or ray://head:10001) "
        "with the resources each scenario asks for; a built-in scenario's dumps are fetched back and compared here, "
        "a command or verl run's ranks write into the run folder, which every node must mount at the same path "
        "(checked before the run). Default: single-rank scenarios run as local subprocesses, multi-rank ones on a "
        "local Ray instance",
        metavar="ADDRESS",
        cli=("run", "calibrate", "bisect"),
    ),
    Option(
        "golden-device",
        "compare against the golden recorded on DEVICE (e.g. an NPU run against the GPU golden), or on "
        "another GPU/NPU model (refused without this flag), with the scenario's tolerance.cross_device rules",
        choices=("cpu", "cuda", "npu"),
        metavar="DEVICE",
    ),
    Option(
        "golden-dir",
        "directory holding goldens, relative to rootdir (or the working directory)",
        default="golden",
        pytest="ini",
        cli=("golden", "calibrate", "portability"),
        convert=Path,
    ),
    Option(
        "history-window",
        "golden versions (commits that changed a golden) an update looks back over for creep: the new golden "
        "is compared with the oldest of them too, and the churn names it when beyond tolerance (default 10)",
        default="10",
        pytest="ini",
        convert=int,
    ),
    Option(
        "worker",
        "warm (default): single-rank built-in runs are forked from a server that has torch, transformers "
        "and msprobe imported; fresh: a new interpreter per run (for debugging and benchmarks). "
        "precision-harness run and calibrate always use fresh interpreters",
        default="warm",
        choices=WORKER_MODES,
    ),
    Option(
        "judgement",
        "replay (default): a failing stage whose change entered at an API is rerun to that step with the API's "
        "tensors captured (msprobe task: tensor), and the API replayed on the CPU in float64 to judge which "
        "side is right (docs/triage.md); off: the verdict classifies where the change entered, without a rerun",
        default="replay",
        choices=JUDGEMENT_MODES,
    ),
    Option(
        "localize",
        "rerun (default): a level: auto scenario's first failing stage is rerun to its step dumping that stage at L1, "
        "and its verdict names the first divergent API; off: the L0 verdict with the stage's inputs and outputs, "
        "no rerun (a quick triage run, or a CI job where a rerun costs minutes: the item fails all the same)",
        default="rerun",
        choices=LOCALIZE_MODES,
    ),
    Option(
        "allow-skip",
        "skip, instead of failing, the items of a scenario that cannot run here: its device is absent, verl is "
        "not installed (engine: verl), or it has no golden in check mode; the summary says how many were skipped "
        "and why. Without it such items fail the run (a gate that checked nothing is not green)",
        flag=True,
        pytest="both",
        convert=_flag,
    ),
    Option(
        "allow-uncompared",
        "pass a check that compared less of its golden than the golden holds for a reason nothing declares (the "
        "coverage ledger: a golden rank, row, statistic or metric the run did not give); without it such an item "
        "fails with one line naming what was not compared. Re-recording the golden is the other way",
        flag=True,
        pytest="both",
        cli=("compare",),
        convert=_flag,
    ),
    Option(
        "msprobe-full",
        "on a failing stage, run msprobe's compare table and first-diff analysis over every failing rank's whole "
        "dump; without it they read the first divergent rank only, the calls around its first divergence "
        "(seconds instead of hours at a 7B model's 65,000 calls a rank), and the verdict says what they read",
        flag=True,
        pytest="both",
        cli=("compare",),
        convert=_flag,
    ),
    Option(
        "msprobe-timeout",
        "seconds msprobe's worker process has to answer on a failing stage before it is killed and the verdict says "
        f"msprobe did not answer, its log kept in the stage's artifacts (default {MSPROBE_TIMEOUT_S}; 0: no limit; "
        "--precision-msprobe-full over a large model's dumps may need more)",
        default=str(MSPROBE_TIMEOUT_S),
        pytest="ini",
        cli=("compare",),
        convert=_timeout,
    ),
    Option(
        "timeout",
        "seconds a scenario run may take (0: no limit)",
        default="0",
        pytest="ini",
        cli=("run", "calibrate", "portability", "bisect"),
        convert=_timeout,
    ),
)


def get(name: str) -> Option:
    return next(o for o in OPTIONS if o.name == name)


def _default(name: str) -> Any:
    """The :class:`PrecisionOptions` default of option ``name`` (its raw default, converted)."""
    return get(name).value(None)


@dataclass(frozen=True)
class PrecisionOptions:
    """Options of one gate run, shared by the pytest plugin and the CLI (defaults from :data:`OPTIONS`)."""

    golden_mode: str = field(default=_default("golden"))
    device: str = field(default=_default("device"))
    artifacts: Path = field(default=_default("artifacts"))
    jobs: int | None = field(default=_default("jobs"))  #: None: not set (:meth:`jobs_for` picks per device)
    report: Path | None = field(default=_default("report"))  #: directory for report.json/.md/.html
    prune: bool = field(default=_default("prune"))  #: remove unused goldens on a full run
    ray_address: str | None = field(default=_default("ray-address"))  #: None: local subprocess / local Ray
    golden_device: str | None = field(default=_default("golden-device"))  #: compare against this device's golden
    golden_dir: Path = field(default=_default("golden-dir"))
    history_window: int = field(default=_default("history-window"))  #: versions the creep alarm looks back
    timeout: float | None = field(default=_default("timeout"))
    worker: str = field(default=_default("worker"))  #: warm | fresh (precision_harness.runs.warm.workers)
    judgement: str = field(default=_default("judgement"))  #: replay | off (precision_harness.check.rerun.replay)
    localize: str = field(default=_default("localize"))  #: rerun | off (precision_harness.check.rerun.level_auto)
    #: items of a scenario that cannot run here skip instead of failing (session.PrecisionSession.plan)
    allow_skip: bool = field(default=_default("allow-skip"))
    #: a check that compared less than its golden holds passes (check.coverage)
    allow_uncompared: bool = field(default=_default("allow-uncompared"))
    #: msprobe's table and first diff over every failing rank, whole (check.localize.msprobe_window)
    msprobe_full: bool = field(default=_default("msprobe-full"))
    #: seconds msprobe's worker has to answer on a failing stage (None: no limit; check.localize.msprobe_worker)
    msprobe_timeout: float | None = field(default=_default("msprobe-timeout"))
    #: pytest-xdist worker id (``gw0``): runs go to ``run-gw0`` so a scenario split over workers
    #: by an explicit ``--dist load`` cannot race on one run directory
    worker_id: str | None = None

    @classmethod
    def from_pytest(cls, config: Any) -> PrecisionOptions:
        """The options of a pytest ``Config`` (``--precision-*`` flags and ``precision_*`` ini keys)."""
        values = {}
        for opt in OPTIONS:
            if opt.pytest == "option":
                raw = config.getoption(f"precision_{opt.dest}")
            elif opt.pytest == "both":
                raw = config.getoption(f"precision_{opt.dest}") or config.getini(f"precision_{opt.dest}")
            elif opt.pytest == "ini":
                raw = config.getini(f"precision_{opt.dest}")
            else:
                raw = None
            values[opt.target] = opt.value(raw)
        return cls(**values, worker_id=getattr(config, "workerinput", {}).get("workerid"))

    @classmethod
    def from_cli(cls, args: argparse.Namespace) -> PrecisionOptions:
        """The options of parsed ``precision-harness`` arguments (options a subcommand lacks keep defaults)."""
        return cls(**{opt.target: opt.value(getattr(args, opt.dest, None)) for opt in OPTIONS})

    def jobs_for(self, device: str) -> int:
        """Runs on ``device`` at a time: ``--precision-jobs`` when set, else the CPU count on cpu and 1 on
        npu or cuda (a verl run asks for every accelerator its ``trainer.n_gpus_per_node`` names, and two
        built-in runs on one accelerator would race for its memory)."""
        if self.jobs is not None:
            return self.jobs
        return max(1, os.cpu_count() or 1) if device == "cpu" else 1

    def run_flags(self) -> list[str]:
        """The gate's flags that make a pytest run of a scenario run it as these options do: ``--precision-device``
        (unless ``auto``), ``--precision-ray-address`` and ``precision_timeout``. What ``bisect`` passes each commit's
        gate, so that triage runs where and how the check ran (``calibrate`` reads the same fields)."""
        flags = [] if self.device == "auto" else ["--precision-device", self.device]
        flags += ["--precision-ray-address", self.ray_address] if self.ray_address else []
        return flags + (["-o", f"precision_timeout={self.timeout:g}"] if self.timeout else [])

    def device_for(self, scenario: Scenario) -> str:
        """Where ``scenario`` runs: ``--precision-device``, or the scenario's ``device`` key under ``auto``."""
        return scenario.config["device"] if self.device == "auto" else self.device


# ------------------------------------------------------------------------------------- pytest
def add_pytest_options(group: Any, parser: Any) -> None:
    """Register every option with a pytest ``OptionGroup`` / ``Parser``."""
    for opt in OPTIONS:
        if opt.pytest in ("option", "both"):
            group.addoption(f"--precision-{opt.name}", dest=f"precision_{opt.dest}", **opt.argparse_kwargs())
        if opt.pytest == "both":
            parser.addini(f"precision_{opt.dest}", opt.help, type="bool", default=False)
        elif opt.pytest == "ini":
            parser.addini(f"precision_{opt.dest}", opt.help, default=opt.default)


# ---------------------------------------------------------------------------------------- CLI
def add_cli_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the options shared with the plugin that ``command`` takes, as ``--<name>``."""
    for opt in OPTIONS:
        if command in opt.cli:
            parser.add_argument(f"--{opt.name}", dest=opt.dest, **opt.argparse_kwargs())
