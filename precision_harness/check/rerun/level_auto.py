"""``level: auto``: record both levels on update, and localise a failing stage at L1.

An ``auto`` scenario's gate run dumps every profiled stage at L0 plus the stage's own inputs and
outputs (``stage_outputs.json``), which is cheap at any depth. Its golden also holds the same
stages at :data:`~precision_harness.scenarios.profiling.LOCALIZE_LEVEL` (under ``L1/``), recorded by a second
run on update (:func:`run_recording`). When a stage fails, :func:`localize` reruns the scenario up
to that step in a new worker, dumping that one stage at L1, and compares it against the golden's L1
record: the verdict then names the first divergent API, as an L1 gate's would. A rerun that cannot
finish (crash, timeout, corrupt record) leaves the L0 verdict standing and says why
(:func:`with_localization`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.item_key import ItemKey
from precision_harness.check.verdicts.items import Outcome, OutcomeKind, check_items
from precision_harness.errors import GoldenMissingError, PrecisionError
from precision_harness.goldens.golden import Golden
from precision_harness.goldens.manifest import LOCALIZE_DIR
from precision_harness.paths import display_path
from precision_harness.runs.kind_runners import Run
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.profiling import LEVEL_KEY, LOCALIZE_LEVEL
from precision_harness.scenarios.scenario import Scenario


def at_localize_level(scenario: Scenario, directory: Path) -> Scenario:
    """``scenario`` at :data:`LOCALIZE_LEVEL`, same name and hash (the level is not in the hash)."""
    return scenario.with_overrides({LEVEL_KEY: LOCALIZE_LEVEL}, directory=directory, name=scenario.name, tag="L1")


def run_recording(scenario: Scenario, *, out_dir: Path, variants: Path, run: Run) -> RunResult:
    """The gate run of an ``auto`` scenario into ``out_dir``, then its L1 run into ``out_dir/L1`` (what update records).

    Raises:
        RunFailedError: either run failed.
    """
    result = run(scenario, Path(out_dir))
    run(at_localize_level(scenario, variants), Path(out_dir) / LOCALIZE_DIR)
    return result


def localize(
    scenario: Scenario,
    key: ItemKey,
    golden: Golden,
    settings: CheckSettings,
    *,
    out_dir: Path,
    run: Run,
) -> Outcome:
    """Rerun ``scenario`` to ``key.step`` dumping only ``key.stage`` at L1, and check it against ``golden``'s L1 record.

    Args:
        out_dir: ``<artifacts>/<scenario>/localize``: the variant file, the run (``run/``) and the
            compare's artifacts (``step_<n>/<stage>/``) go there.
        run: how the rerun is started (:func:`~precision_harness.runs.kind_runners.bind`; the session binds its
            own runner).

    Raises:
        PrecisionError: the rerun failed (RunFailedError), or the golden's L1 record is missing or corrupt.
    """
    assert key.step is not None and key.stage is not None
    record = golden.localization()
    if not record.has_stage(key.step, key.stage):
        raise GoldenMissingError(f"{display_path(record.path)}: no {key.stage} @ step_{key.step} in the L1 record")
    record.verify_stage(key.step, key.stage)  # before the rerun: a corrupt record wastes no run
    variant = scenario.with_overrides(
        scenario.localize_overrides(key.step, key.stage),
        directory=out_dir,
        name=scenario.name,
        tag=f"{LOCALIZE_LEVEL}-step_{key.step}-{key.stage}",
    )
    t0 = time.perf_counter()
    result = run(variant, Path(out_dir) / "run")
    # the L0 verdict gives the rerun command and the environment line
    local_settings = replace(settings, artifacts=Path(out_dir), rerun=None, environment=EnvironmentDiff())
    outcome = next(check_items(result.run_dir, record, [key], local_settings))[1]
    outcome.seconds = time.perf_counter() - t0
    return outcome


def with_localization(l0: Outcome, key: ItemKey, attempt: Callable[[], Outcome]) -> Outcome:
    """``l0`` (a failing L0 + stage-outputs outcome) with the L1 localisation's verdict appended.

    The item stays failed whatever the rerun finds. A rerun that raises a PrecisionError (worker
    crash, timeout, a missing or corrupt L1 record) is one line, "localization failed: <why>".
    """
    try:
        local = attempt()
    except PrecisionError as exc:
        return replace(l0, text=f"{l0.text}\n  localization failed: {exc}")
    if local.kind is OutcomeKind.ERROR:
        return replace(l0, text=f"{l0.text}\n  localization failed: {local.text}")
    if local.passed:
        found = f"no divergence at {LOCALIZE_LEVEL} ({local.text}); the change is in what only the stage outputs see"
        text = f"{l0.text}\n  localized at {LOCALIZE_LEVEL} ({local.seconds:.1f} s): {found}"
        return replace(l0, text=text, localized=local)
    body = "\n".join(f"  {line}" for line in local.text.splitlines())
    text = f"{l0.text}\n  localized at {LOCALIZE_LEVEL} (rerun to step_{key.step}, {local.seconds:.1f} s):\n{body}"
    return replace(l0, text=text, localized=local)


def not_rerun(l0: Outcome, first: ItemKey) -> Outcome:
    """``l0`` for a failing stage after the run's first failing stage, which was the one localised."""
    line = (
        f"  localization: not rerun; {first.stage} @ step_{first.step} failed first in this run and was localized "
        "(rerun this item alone to localize it)"
    )
    return replace(l0, text=f"{l0.text}\n{line}")
