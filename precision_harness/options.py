"""Options defined once, read by both the pytest plugin and ``precision-harness`` (as pytest-benchmark).

Each :class:`Option` says how it appears to pytest (``--precision-<name>`` or an ini key) and to
the CLI (``--<name>`` on the listed subcommands). :func:`add_pytest_options` and
:func:`add_cli_options` register the same definitions, so the flag, its choices, default and help
never drift apart; :func:`from_pytest` and :func:`from_cli` read them back into the keyword
arguments of :class:`~precision_harness.session.PrecisionOptions`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOLDEN_MODES = ("check", "update", "missing")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")


@dataclass(frozen=True)
class Option:
    """One option. ``pytest`` is ``"option"`` (``--precision-<name>``), ``"ini"`` (``precision_<name>``) or None."""

    name: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    flag: bool = False  #: store_true
    pytest: str | None = "option"
    cli: tuple[str, ...] = ()  #: subcommands of ``precision-harness`` that take ``--<name>``

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

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
    ),
    Option(
        "device",
        "device scenarios run on; auto uses each scenario's 'device' key (default cpu)",
        default="auto",
        choices=DEVICE_CHOICES,
        cli=("run", "calibrate"),
    ),
    Option(
        "artifacts",
        "where runs and compare tables go (default: .precision/artifacts under rootdir)",
        metavar="DIR",
        cli=("compare",),
    ),
    Option("jobs", "scenario runs in parallel in this process (default: CPU count)", type=int, metavar="N"),
    Option(
        "report",
        "write report.json, report.md and report.html (drift heatmap, drift plots) into DIR",
        metavar="DIR",
        cli=("compare",),
    ),
    Option("prune", "remove goldens whose scenario was not collected (only on a full, unfiltered run)", flag=True),
    Option(
        "ray-address",
        "submit scenario runs to this existing Ray cluster (e.g. 10.0.0.1:6379 or ray://head:10001) "
        "with the resources each scenario asks for; dumps are fetched back and compared here. Default: single-rank "
        "scenarios run as local subprocesses, multi-rank ones on a local Ray instance",
        metavar="ADDRESS",
        cli=("run",),
    ),
    Option(
        "golden-device",
        "compare against the golden recorded on DEVICE (e.g. an NPU run against the GPU golden) "
        "with the scenario's tolerance.cross_device rules",
        choices=("cpu", "cuda", "npu"),
        metavar="DEVICE",
    ),
    Option(
        "golden-dir",
        "directory holding goldens, relative to rootdir (or the working directory)",
        default="golden",
        pytest="ini",
        cli=("golden", "calibrate"),
    ),
    Option(
        "timeout", "seconds a scenario run may take (0: no limit)", default="0", pytest="ini", cli=("run", "calibrate")
    ),
)


def get(name: str) -> Option:
    return next(o for o in OPTIONS if o.name == name)


# ------------------------------------------------------------------------------------- pytest
def add_pytest_options(group: Any, parser: Any) -> None:
    """Register every option with a pytest ``OptionGroup`` / ``Parser``."""
    for opt in OPTIONS:
        if opt.pytest == "option":
            group.addoption(f"--precision-{opt.name}", dest=f"precision_{opt.dest}", **opt.argparse_kwargs())
        elif opt.pytest == "ini":
            parser.addini(f"precision_{opt.dest}", opt.help, default=opt.default)


def _timeout(value: Any) -> float | None:
    return float(value or 0) or None


def from_pytest(config: Any) -> dict[str, Any]:
    """``PrecisionOptions`` keyword arguments from a pytest ``Config``."""
    get_opt = lambda name: config.getoption(f"precision_{name}")  # noqa: E731
    report = get_opt("report")
    return {
        "golden_mode": get_opt("golden"),
        "device": get_opt("device"),
        "artifacts": Path(get_opt("artifacts") or ".precision/artifacts"),
        "golden_dir": Path(config.getini("precision_golden_dir")),
        "jobs": get_opt("jobs") or max(1, os.cpu_count() or 1),
        "timeout": _timeout(config.getini("precision_timeout")),
        "report": Path(report) if report else None,
        "prune": bool(get_opt("prune")),
        "ray_address": get_opt("ray_address"),
        "golden_device": get_opt("golden_device"),
        "worker_id": getattr(config, "workerinput", {}).get("workerid"),
    }


# ---------------------------------------------------------------------------------------- CLI
def add_cli_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the options shared with the plugin that ``command`` takes, as ``--<name>``."""
    for opt in OPTIONS:
        if command in opt.cli:
            parser.add_argument(f"--{opt.name}", dest=opt.dest, **opt.argparse_kwargs())


def from_cli(args: argparse.Namespace) -> dict[str, Any]:
    """``PrecisionOptions`` keyword arguments from parsed CLI arguments (absent options keep defaults)."""
    out: dict[str, Any] = {}
    if getattr(args, "device", None):
        out["device"] = args.device
    if getattr(args, "artifacts", None):
        out["artifacts"] = Path(args.artifacts)
    if getattr(args, "report", None):
        out["report"] = Path(args.report)
    if getattr(args, "golden_dir", None):
        out["golden_dir"] = Path(args.golden_dir)
    if getattr(args, "timeout", None) is not None:
        out["timeout"] = _timeout(args.timeout)
    if getattr(args, "ray_address", None):
        out["ray_address"] = args.ray_address
    return out
