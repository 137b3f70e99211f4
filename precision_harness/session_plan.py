"""A scenario's plan and state within one gate session (:class:`~precision_harness.session.PrecisionSession`).

The golden action decided once per scenario (:class:`Plan`, :class:`GoldenAction`), what recording
a golden did (:class:`Recording`, :func:`record_run`), and the state a scenario moves through
(:class:`ScenarioState`; the states table is :mod:`precision_harness.session`'s docstring), with the
checks the session makes before a run and before a promotion.
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.item_key import ItemKey
from precision_harness.check.localize import msprobe_release
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.errors import GoldenDeviceModelError, PrecisionError, ProbeUnavailableError, RunFailedError
from precision_harness.goldens import churn as churn_mod
from precision_harness.goldens.churn import ChurnRow
from precision_harness.goldens.golden import Golden, update_command
from precision_harness.goldens.manifest import LOCALIZE_DIR, MANIFEST
from precision_harness.goldens.recordable import check_recordable
from precision_harness.goldens.store import GoldenStore
from precision_harness.history import golden_history
from precision_harness.paths import display_path
from precision_harness.runs.host import stack
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.scenario import Scenario


class GoldenAction(str, Enum):
    """What a session does with a scenario's golden."""

    CHECK = "check"  #: run, then compare every item against the golden
    RECORD = "record"  #: run, then promote the run to the golden (update, or missing with none on disk)
    #: the scenario cannot run here (device absent, verl missing, no golden in check mode): its items fail with
    #: the reason, or skip under --precision-allow-skip
    SKIP = "skip"
    ERROR = "error"  #: no usable golden (or no msprobe): its items fail with the error, nothing runs


@dataclass(frozen=True)
class Plan:
    """A scenario's golden action, decided once per session (:meth:`PrecisionSession.plan`)."""

    action: GoldenAction
    runs: Scenario  #: the scenario as it runs (an auto one whose golden predates auto: at L1)
    golden: Golden | None = None  #: CHECK: the golden compared against
    error: PrecisionError | None = None  #: ERROR: what every item reports
    reason: str = ""  #: SKIP: why it cannot run here (one line)
    pinned: Golden | None = None  #: a verl scenario's golden whose rollouts a check run loads

    @property
    def needs_run(self) -> bool:
        return self.action in (GoldenAction.CHECK, GoldenAction.RECORD)


@dataclass
class Recording:
    """RECORD: what promoting the run to the golden did."""

    status: str  #: "recorded", or "unchanged" (the golden already held the same)
    size_note: str = ""  #: the golden's stored size and what the update added
    churn: list[ChurnRow] = field(default_factory=list)  #: against the previous golden


@dataclass
class ScenarioState:
    """One scenario's run and golden within a session (the module docstring's states)."""

    scenario: Scenario
    device: str
    golden_device: str  #: the device whose golden is checked (== device unless --precision-golden-device)
    #: the golden folder under ``golden/<scenario>/``: ``golden_device`` or ``<device>@<model>`` (:func:`model_folder`)
    folder: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    plan: Plan | None = None  #: planned
    future: Future | None = None  #: running
    settled: bool = False  #: settled: the run's result taken in
    recording: Recording | PrecisionError | None = None  #: settled, RECORD: the promotion or why it failed
    environment: EnvironmentDiff | None = None  #: settled, CHECK: the run's environment against the golden's
    localized: ItemKey | None = None  #: level auto: the failing stage this session reran at L1
    judged: ItemKey | None = None  #: the failing stage whose API this session replayed (check.rerun.replay)
    identical: int | None = None  #: CHECK, environment differs: stage dumps of the run identical to the golden's
    progress_shown: bool = False  #: the run's stage starts were reported (once, by the first item waiting)

    @property
    def cross_device(self) -> bool:
        """Another device's golden, or another accelerator model's (allowed by --precision-golden-device)."""
        model = self.environment.device_model if self.environment is not None else None
        return self.golden_device != self.device or model is not None


def model_folder(device: str, model: str) -> str:
    """``cuda@H100-80GB-HBM3``: the folder of ``device``'s golden recorded on ``model`` (``model`` as
    :func:`~precision_harness.runs.host.stack.model_name` gives it; each run of characters other than letters,
    digits, ``.``, ``_`` and ``-`` becomes one ``-``, at most 64 kept), or ``device`` where nothing is left."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model)[:64].strip("-.")
    return f"{device}@{safe}" if safe else device


def checked_folder(store: GoldenStore, scenario: str, device: str, model: str | None) -> str:
    """The golden a check of ``device`` on ``model`` reads: ``<device>@<model>/`` where one is recorded, else
    ``<device>/`` (docs/goldens.md, "Another accelerator model")."""
    if model:
        folder = model_folder(device, model)
        if store.exists(scenario, folder):
            return folder
    return device


def recorded_folder(store: GoldenStore, scenario: str, device: str, model: str | None) -> str:
    """Where ``--precision-golden update`` of a run on ``model`` writes: the model's own golden where there is one,
    or a new one where ``<device>/`` records another model (never replaced by another model's run); else
    ``<device>/`` (none yet, the same model, a golden that does not record its model, or a model not read)."""
    if not model:
        return device
    folder = model_folder(device, model)
    return folder if store.exists(scenario, folder) or other_models_golden(store, scenario, device, model) else device


def other_models_golden(store: GoldenStore, scenario: str, device: str, model: str | None) -> bool:
    """``<device>/`` records a model other than ``model`` (False where there is none, or either model is unknown):
    a run on ``model`` has no golden of its own there."""
    if not model:
        return False
    previous = store.previous(scenario, device)
    recorded = stack.model_of(previous.env or {}) if previous is not None else None
    return bool(recorded) and recorded != model


def device_model_error(st: ScenarioState, golden_path: Path) -> GoldenDeviceModelError:
    """The error of a check against a golden recorded on another GPU/NPU model, without --precision-golden-device,
    where this model has no golden of its own (:func:`checked_folder`)."""
    model = st.environment.device_model if st.environment is not None else None
    assert model is not None and model.run is not None
    own_path = golden_path.parent / model_folder(st.device, model.run)
    own = f"{display_path(own_path)}/"
    head = (
        f"recorded on {model.golden}, checked on {model.run}: {display_path(golden_path)}/ is another accelerator "
        "model's golden, not used silently"
    )
    if (own_path / MANIFEST).is_file():  # the host's vendor tool did not answer before the run (stack.host_model)
        tool = "npu-smi" if st.device == "npu" else "nvidia-smi"
        return GoldenDeviceModelError(
            f"{head}; {own} holds this model's golden, but this host's model could not be read before the run "
            f"({tool} did not answer): put {tool} on PATH so that the check reads it"
        )
    return GoldenDeviceModelError(
        f"{head}; record this model's own ({own}, beside it) with: {update_command(st.scenario)}, or gate across "
        f"models with --precision-golden-device {st.golden_device} (tolerance.cross_device rules)"
    )


def last_step_needed(keys: Iterable[ItemKey]) -> int | None:
    """The last step the selected items of one scenario check, or None where one of them needs the whole run
    (``metrics``): a check runs the scenario only that far (:meth:`ScenarioBase.run_to`)."""
    steps = [key.step for key in keys]
    return None if not steps or None in steps else max(steps)


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


def no_msprobe() -> ProbeUnavailableError:
    """The error of a gate that cannot dump: msprobe is not installed, or its release cannot dump here (the 8.x line
    under numpy 2: :func:`~precision_harness.check.localize.msprobe_release.run_problem`), in one line."""
    why = msprobe_release.run_problem()
    return ProbeUnavailableError(why or "mindstudio-probe (msprobe) is not installed; pip install mindstudio-probe")


def msprobe_available() -> bool:
    """True if ``msprobe.core`` can be found and its release can dump here (reads package metadata: imports neither
    msprobe.pytorch nor torch)."""
    try:
        found = importlib.util.find_spec("msprobe.core") is not None
    except (ImportError, ValueError):
        return False
    return found and msprobe_release.run_problem() is None


def record_run(store: GoldenStore, st: ScenarioState, run: RunResult, *, history_window: int) -> Recording:
    """Promote the run to the golden (never from a partial run); its churn against the previous golden,
    with the creep alarm (:func:`golden_history.creep_review`), and its size.

    Raises:
        RunFailedError: a declared (step, stage) has no dump.
        GoldenRefusedError: a stage holds no statistics, or the run holds NaN/Inf the scenario does not declare
            (:func:`~precision_harness.goldens.recordable.check_recordable`); nothing is written.
        GoldenError: the golden cannot be written, or read back.
    """
    scenario = st.scenario
    missing = missing_dumps(scenario, run.run_dir)
    if scenario.localizes:
        missing += [f"{LOCALIZE_DIR}/{m}" for m in missing_dumps(scenario, run.run_dir / LOCALIZE_DIR)]
    if missing:
        raise RunFailedError(
            f"{display_path(scenario.path)}: no golden written: the run dumped no {missing[0]} "
            f"({len(missing)} declared (step, stage) missing); a verl run dumps nothing when "
            "precision_debugger.config_path is unset or msprobe is missing with strict: false"
        )
    check_recordable(scenario, run.run_dir)  # statistics in every stage, no undeclared NaN/Inf: else nothing written
    # a golden per accelerator model: the run's own model, as its golden will record it (recorded_folder)
    st.folder = recorded_folder(store, scenario.name, st.device, stack.model_of(run.run_json.get("env") or {}))
    previous = store.previous(scenario.name, st.folder)
    churn = churn_mod.run_churn(scenario.name, run.run_dir, previous, scenario.steps, scenario.stages)
    policy = TolerancePolicy.for_golden(
        scenario.config["tolerance"], noise=previous.noise if previous else None, cross_device=False
    )
    creep = golden_history.CreepSettings(store.path(scenario.name, st.folder), history_window, policy, scenario.hash)
    keys = [(step, stage) for step in scenario.steps for stage in scenario.stages]
    golden_history.with_creep(churn, golden_history.creep_review(run.run_dir, previous, keys, creep))
    status = "recorded" if store.promote(run.run_dir, scenario, st.device, folder=st.folder) else "unchanged"
    golden = store.load(scenario, st.folder)
    before = previous.size_bytes if previous is not None else 0
    return Recording(status, size_note(golden.size_bytes, before), churn)
