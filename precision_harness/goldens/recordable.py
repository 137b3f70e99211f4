"""What a run must hold to become a golden: statistics in every gated stage, and numbers.

A stage whose every rank dumped ``"data": {}`` (an msprobe ``list`` or ``scope`` filter that matches
nothing) would record a golden that passes forever, comparing nothing; a golden holding NaN passes a run
with NaN at the same place (NaN against NaN reads as no change). Recording refuses both, in one line naming
the scenario file, the field and what to do, before anything under ``golden/`` is written.

NaN/Inf are the lint of ``golden verify`` (:func:`~precision_harness.goldens.verification.non_finite`); a
scenario may declare where it expects them, with a reason, under ``tolerance.nonfinite``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from precision_harness.dumps.files import DUMP, load_dump
from precision_harness.errors import GoldenRefusedError
from precision_harness.goldens.manifest import LOCALIZE_DIR
from precision_harness.goldens.verification import NonFinite, non_finite
from precision_harness.paths import display_path
from precision_harness.scenarios import loading
from precision_harness.scenarios.scenario import Scenario

#: the scenario key that declares where a golden may hold NaN/Inf
NONFINITE_FIELD = "tolerance.nonfinite"
#: the scenario keys whose msprobe filters decide what a stage dumps
FILTER_FIELDS = "global_profiler.global_tool_config.precision_debugger.list/scope (or its config_path's)"


def declared_nonfinite(scenario: Scenario) -> tuple[NonFinite, ...]:
    """The scenario's ``tolerance.nonfinite`` entries (the schema requires ``where`` and ``reason``)."""
    return _nonfinite_entries(scenario.config)


def _nonfinite_entries(config: dict[str, Any]) -> tuple[NonFinite, ...]:
    """A scenario mapping's ``tolerance.nonfinite`` entries (the schema requires ``where`` and ``reason``)."""
    entries = (config.get("tolerance") or {}).get("nonfinite") or ()
    return tuple(NonFinite(e["where"], e["reason"]) for e in entries)


def declared_in_files(files: Iterable[Path], names: Collection[str]) -> dict[str, tuple[NonFinite, ...]]:
    """``{scenario name: its tolerance.nonfinite entries}`` of the scenario files among ``files`` whose name (their
    ``name`` key, else their stem) is in ``names``: what ``golden verify`` needs of a golden's scenario, read from
    the file as written and checked against the scenario schema, nothing else loaded (a scenario whose inputs
    name environment variables reads without them). Two files of one name: both files' entries.

    Raises:
        ScenarioError: a file is not readable YAML, or one of ``names`` breaks the schema (file and field).
    """
    found: dict[str, tuple[NonFinite, ...]] = {}
    for path in files:
        raw = loading.read_yaml(Path(path))
        name = raw.get("name", Path(path).stem)
        if name not in names:
            continue
        loading.validate_schema(raw, source=path)
        found[name] = found.get(name, ()) + _nonfinite_entries(raw)
    return found


def _holds_statistics(node: Any) -> bool:
    """Whether a dump's ``data`` (or part of it) holds any statistic: a tensor's Max/Min/Mean/Norm, or a scalar
    argument's value, that is not null."""
    if isinstance(node, dict):
        if "Max" in node or "value" in node:
            return any(node.get(k) is not None for k in ("Max", "Min", "Mean", "Norm", "value"))
        return any(_holds_statistics(v) for v in node.values())
    if isinstance(node, list):
        return any(_holds_statistics(v) for v in node)
    return False


def _stage_dirs(scenario: Scenario, run_dir: Path) -> Iterator[tuple[str, Path]]:
    """``(step_<n>/<stage>, folder)`` of every gated stage of the run, its ``L1/`` record included (level auto)."""
    roots = [("", run_dir)] + ([(f"{LOCALIZE_DIR}/", run_dir / LOCALIZE_DIR)] if scenario.localizes else [])
    for prefix, root in roots:
        for step in scenario.steps:
            for stage in scenario.stages:
                yield f"{prefix}step_{step}/{stage}", root / f"step_{step}" / stage


def check_recordable(scenario: Scenario, run_dir: Path) -> None:
    """Refuse a run that would make a golden comparing nothing, or holding undeclared NaN/Inf.

    Reads every rank's ``dump.json`` of each gated ``(step, stage)`` once (msprobe is not needed).

    Raises:
        GoldenRefusedError: one line naming the scenario file, the first stage or statistic refused, the field
            and what to do.
        GoldenCorruptError: a dump.json is not readable JSON.
    """
    declared = declared_nonfinite(scenario)
    empty: list[str] = []
    bad: list[str] = []
    for name, stage_dir in _stage_dirs(scenario, Path(run_dir)):
        dumps = {p.parent.name: load_dump(p) for p in sorted(stage_dir.glob(f"step0/rank*/{DUMP}"))}
        if dumps and not any(_holds_statistics(d.get("data")) for d in dumps.values()):
            empty.append(name)
        for rank, dump in dumps.items():
            bad += [
                f"{name}/{rank}: {where} {stat} is {value}"
                for where, stat, value in non_finite(dump)
                if not any(n.allows(where) for n in declared)
            ]
    head = f"{display_path(scenario.path)}: no golden written"
    if empty:
        more = f" (and {len(empty) - 1} more stage(s))" if len(empty) > 1 else ""
        raise GoldenRefusedError(
            f'{head}: {empty[0]} holds no statistics on any rank (its dump.json "data" is {{}}){more}, a golden that '
            f"would compare nothing; msprobe's filter matched no API there: fix {FILTER_FIELDS}, or remove the stage "
            "from precision_debugger.stages"
        )
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise GoldenRefusedError(
            f"{head}: {bad[0]}{more}; a golden must be made of numbers (NaN against NaN reads as no change): fix the "
            f"run, or declare where under {NONFINITE_FIELD} (where: a glob of the tensor, reason: why) and record again"
        )
