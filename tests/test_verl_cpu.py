"""verl's real trainer on the CPU (``engine: verl``, issue 19): the [verl] extra runs ``main_ppo``, the CPU
support (precision_harness/verl_cpu) and its bad input.

The end-to-end tests start ``python -m verl.trainer.main_ppo`` for real (Ray, TransferQueue, FSDP2 on
gloo): they are marked slow and take minutes on a 2-core CPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from precision_harness import command, verl_engine

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "verl_cpu"


def _pins(text: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def test_verl_extra_pins_what_main_ppo_imports() -> None:
    """The [verl] extra names verl at the supported version and TransferQueue (main_ppo's v1 trainer imports
    transfer_queue), and constraints/cpu.txt pins the same versions."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["verl"]
    declared = {re.split(r"[=<>!~\[; ]", req, maxsplit=1)[0].lower(): req for req in extra}
    for name in ("verl", "transferqueue", "pyzmq", "msgspec"):
        assert name in declared, f"[verl] extra lacks {name}"
    assert declared["verl"] == f"verl=={verl_engine.SUPPORTED_VERSIONS[0]}"
    pins = _pins((ROOT / "constraints" / "cpu.txt").read_text())
    assert pins["verl"] == verl_engine.SUPPORTED_VERSIONS[0]
    assert declared["transferqueue"] == f"TransferQueue=={pins['transferqueue']}"
    assert "pyzmq" in pins and "msgspec" in pins


def test_transfer_queue_is_installed_with_verl() -> None:
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    import importlib.util

    assert importlib.util.find_spec("transfer_queue") is not None, "pip install 'pytest-precision[verl]'"


def _run_marked(argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str]:
    """Run ``argv`` as the gate does (own session, marked); kill everything marked afterwards."""
    run_id = uuid.uuid4().hex
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **env, command.ENV_RUN_ID: run_id},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            command._kill_group(proc)
        left = command.reap(run_id)
    assert not left, f"processes left behind: {left}"
    return proc.returncode, out


@pytest.mark.slow
def test_main_ppo_starts_and_gets_past_the_transfer_queue_import(tmp_path: Path) -> None:
    """verl's real entry point, in this venv: Hydra, validation, Ray and the TaskRunner start, and the run reaches
    ``import transfer_queue`` and the v1 trainer registry (an unknown trainer mode stops it right after)."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    overrides = {
        "trainer.v1.trainer_mode": "precision_probe_no_such_trainer",
        "algorithm.adv_estimator": "grpo",
        "data.train_files": str(EXAMPLE / "data" / "train.parquet"),
        "data.val_files": str(EXAMPLE / "data" / "train.parquet"),
        "data.train_batch_size": 4,
        "actor_rollout_ref.model.path": str(EXAMPLE / "model"),
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
        "ray_kwargs.ray_init.num_cpus": 2,
        "trainer.n_gpus_per_node": 1,
        "trainer.logger": ["console"],
    }
    argv = verl_engine.argv(None, overrides)
    assert argv[:3] == [sys.executable, "-m", "verl.trainer.main_ppo"]
    code, out = _run_marked(argv, env={"RAY_DEDUP_LOGS": "0"}, cwd=tmp_path, timeout=300)
    assert "No module named 'transfer_queue'" not in out
    assert "Unknown trainer 'precision_probe_no_such_trainer'" in out, out[-3000:]
    assert code != 0
