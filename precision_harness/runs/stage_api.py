"""The stage API: dump one verl stage of any training loop in verl's layout, with msprobe.

::

    import precision_harness

    for step in range(1, steps + 1):
        with precision_harness.stage("actor_compute_log_prob", step=step, model=actor):
            old_log_probs = compute_log_prob(actor, batch)
        with precision_harness.stage("actor_update", step=step, model=actor):
            update_policy(actor, batch)

Run by the gate (a command scenario), :func:`stage` writes
``$PRECISION_DUMP_DIR/step_<step>/<stage>/step0/rank<r>/dump.json``, the layout verl's
``PrecisionDebuggerProfiler`` writes under ``global_profiler.save_path``, with the msprobe config
at ``$PRECISION_MSPROBE_CONFIG``, for the steps in ``$PRECISION_STEPS`` and the stages in
``$PRECISION_STAGES``. Outside the gate (``PRECISION_DUMP_DIR`` unset) it does nothing, so the
loop runs unchanged.

msprobe's debugger is a process-wide singleton with one level per process
(docs/msprobe.md#debugger-lifecycle), so a process builds one :class:`StageProbe` and re-points
``service.config.dump_path`` for every stage, as verl's profiler does:
``start(model, rank_id) -> stage -> stop -> reset_status``. The rank is passed explicitly
(``torch.distributed``'s rank when a process group is up, else ``$RANK``, else 0), so the folder
is always ``rank<r>``, never msprobe's ``proc<pid>``; msprobe's 8.x line takes no ``rank_id``, and
:mod:`~precision_harness.runs.msprobe_debugger` gives it the rank as that release reads it. The
built-in PPO loop (``runner/``) dumps through the same :class:`StageProbe`. This module imports
neither torch nor msprobe until a stage is dumped.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from precision_harness.errors import PrecisionError
from precision_harness.runs import msprobe_debugger
from precision_harness.runs.host import rank_env

#: the environment a command scenario's process gets from the gate
ENV_DUMP_DIR = "PRECISION_DUMP_DIR"
ENV_MSPROBE_CONFIG = "PRECISION_MSPROBE_CONFIG"
ENV_STEPS = "PRECISION_STEPS"
ENV_STAGES = "PRECISION_STAGES"
ENV_METRICS = "PRECISION_METRICS"

#: msprobe's path check (``check_path_pattern_valid``) rejects anything else in dump paths.
MSPROBE_PATH_RE = re.compile(r"^[a-zA-Z0-9_.:/-]+$")


class StageError(PrecisionError):
    """A stage name verl does not know, or a stage API call the gate cannot honour."""


def check_dump_path(path: Path) -> None:
    """Raise ``ValueError`` if msprobe would reject ``path`` (spaces, brackets, non-ASCII)."""
    real = str(Path(path).resolve())
    if not MSPROBE_PATH_RE.match(real):
        raise ValueError(
            f"msprobe rejects dump path {real!r}: only [A-Za-z0-9_.:/-] are allowed; "
            "use --precision-artifacts (or --out) with a path made of those characters"
        )


def check_stage_name(name: str) -> str:
    """Return ``name`` if it is one of verl's precision-debugger stages, else raise StageError."""
    from precision_harness.scenarios.profiling import STAGES

    if name not in STAGES:
        raise StageError(f"stage {name!r}: not a verl precision_debugger stage; expected one of {', '.join(STAGES)}")
    return name


class StageProbe:
    """Collects one msprobe ``dump.json`` per (step, stage) under ``root`` in verl's layout.

    Args:
        root: run directory; stage dumps go to ``root/step_<n>/<stage>/step0/rank<r>/``.
        msprobe_config: the msprobe ``config.json`` contents (written to ``root/msprobe_config.json``),
            or ``config_path``: an existing one. ``dump_path`` is managed here.
        rank: the rank its dumps are on (``start(rank_id=...)``, :mod:`.msprobe_debugger`).

    Raises:
        ValueError: msprobe would reject ``root``.
        ImportError: mindstudio-probe is not installed.
    """

    def __init__(
        self,
        *,
        root: Path,
        rank: int = 0,
        msprobe_config: dict[str, Any] | None = None,
        config_path: Path | None = None,
    ) -> None:
        from msprobe.pytorch import PrecisionDebugger

        check_dump_path(root)
        self.root, self.rank = Path(root).resolve(), rank
        self.root.mkdir(parents=True, exist_ok=True)
        if config_path is None:
            config_path = self.root / "msprobe_config.json"
            config_path.write_text(json.dumps(msprobe_config or {}, indent=2, sort_keys=True))
        self.debugger = PrecisionDebugger(config_path=str(config_path), dump_path=str(self.root / "_unused"))

    @contextmanager
    def stage(self, step: int, stage: str, model: Any) -> Iterator[Path]:
        """Dump everything the body runs to ``step_<step>/<stage>``; always stops and resets."""
        dump_dir = self.root / f"step_{step}" / stage
        service = self.debugger.service
        service.config.dump_path = str(dump_dir)
        try:
            msprobe_debugger.start(self.debugger, model, self.rank)
            yield dump_dir
        finally:
            # a failed start() leaves msprobe marked running: stop() regardless (docs/msprobe.md#debugger-lifecycle)
            self.debugger.stop()
            service.reset_status()


def _env_list(name: str) -> list[str]:
    return [x for x in os.environ.get(name, "").split(",") if x]


def current_rank() -> int:
    """torch.distributed's rank when a process group is up, else ``$RANK``, else 0."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


class _EnvProbe:
    """The process's probe as the gate's environment describes it (built at the first dumped stage)."""

    def __init__(self) -> None:
        self.root = Path(os.environ[ENV_DUMP_DIR])
        self.config_path = os.environ.get(ENV_MSPROBE_CONFIG)
        self.steps = {int(s) for s in _env_list(ENV_STEPS)}
        self.stages = set(_env_list(ENV_STAGES))
        self._probe: StageProbe | None = None

    def wants(self, step: int, stage: str) -> bool:
        return (not self.steps or step in self.steps) and (not self.stages or stage in self.stages)

    def probe(self) -> StageProbe:
        if self._probe is None:
            if not self.config_path:
                raise StageError(f"{ENV_DUMP_DIR} is set but {ENV_MSPROBE_CONFIG} is not: no msprobe config to use")
            rank = current_rank()
            self._probe = StageProbe(root=self.root, rank=rank, config_path=Path(self.config_path))
            # this process's stack, for the golden's env (the gate cannot import the loop's packages)
            rank_env.write(self.root, rank, os.environ.get(rank_env.ENV_DEVICE, "cpu"))
        return self._probe


_ENV_PROBE: _EnvProbe | None = None


@contextmanager
def stage(name: str, *, step: int, model: Any = None) -> Iterator[Path | None]:
    """Dump the body as verl stage ``name`` of global step ``step`` when the gate asks for it.

    Args:
        name: one of verl's stages (``actor_compute_log_prob``, ``ref_compute_log_prob``,
            ``compute_values``, ``critic_update``, ``actor_update``, ``compute_rm_score``).
        step: the global training step, 1-based (verl's ``global_steps``).
        model: the ``torch.nn.Module`` the stage runs (needed for msprobe's L0/mix module hooks).

    Yields:
        The stage's dump folder, or None when nothing is dumped (outside the gate, or a step or
        stage the scenario does not profile).

    Raises:
        StageError: ``name`` is not a verl stage (always, in or outside the gate).
    """
    global _ENV_PROBE
    check_stage_name(name)
    if not os.environ.get(ENV_DUMP_DIR):
        yield None
        return
    if _ENV_PROBE is None or _ENV_PROBE.root != Path(os.environ[ENV_DUMP_DIR]):
        _ENV_PROBE = _EnvProbe()
    if not _ENV_PROBE.wants(step, name):
        yield None
        return
    with _ENV_PROBE.probe().stage(step, name, model) as dump_dir:
        yield dump_dir
