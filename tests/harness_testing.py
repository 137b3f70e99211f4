"""Helpers shared by the harness's own tests: synthetic msprobe dumps, throwaway pytest projects.

A module, not conftest.py, so tests import it by a name no other conftest shadows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny_ppo.yaml"
#: the test hooks (planted changes), patched into the processes started with :func:`hooks_env`
HOOKS = Path(__file__).parent / "hooks"


def tensor(
    dtype: str = "torch.float32", shape=(2, 3), Max=1.0, Min=-1.0, Mean=0.1, Norm=2.0, requires_grad=False
) -> dict[str, Any]:
    """One msprobe statistics entry, as dump.json stores it."""
    return {
        "type": "torch.Tensor",
        "dtype": dtype,
        "shape": list(shape),
        "Max": Max,
        "Min": Min,
        "Mean": Mean,
        "Norm": Norm,
        "requires_grad": requires_grad,
    }


def api(inputs: list[dict], outputs: list[dict]) -> dict[str, Any]:
    return {"input_args": inputs, "input_kwargs": {}, "output": outputs}


def base_data() -> dict[str, Any]:
    """A small, realistic-looking L1 dump: three API calls in execution order."""
    return {
        "Functional.embedding.0.forward": api(
            [tensor("torch.int64", (2, 4), 9, 0, None, None), tensor(shape=(16, 8))], [tensor(shape=(2, 4, 8))]
        ),
        "Functional.linear.0.forward": api(
            [tensor(shape=(2, 4, 8)), tensor(shape=(8, 8))],
            [tensor(shape=(2, 4, 8), Max=3.0, Min=-2.5, Mean=0.01, Norm=12.5)],
        ),
        "Functional.softmax.0.forward": api(
            [tensor(shape=(2, 4, 8), Max=3.0, Min=-2.5, Mean=0.01, Norm=12.5)],
            [tensor(shape=(2, 4, 8), Max=0.9, Min=0.01, Mean=0.125, Norm=2.1)],
        ),
    }


def write_dump(stage_dir: Path, data: dict[str, Any], rank: str = "rank0") -> Path:
    """Write ``stage_dir/step0/<rank>/dump.json`` (msprobe's layout) and return its path."""
    path = stage_dir / "step0" / rank / "dump.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}, indent=1
        )
    )
    (path.parent / "construct.json").write_text("{}")
    (path.parent / "stack.json").write_text(json.dumps({"0": [["x"], ["File /tmp/somewhere.py, line 1"]]}))
    return path


def write_run_json(root: Path, scenario: Any, env: dict[str, Any]) -> Path:
    """A ``run.json`` for a run of ``scenario`` faked in ``root`` (its dumps written by the caller), on
    ``env["device"]``, with ``env`` as the run's fingerprint; returns ``root``."""
    run = {
        "format": 1,
        "scenario": scenario.name,
        "scenario_hash": scenario.hash,
        "device": env["device"],
        "level": scenario.level,
        "dump": True,
        "env": env,
        "steps": list(scenario.steps),
        "stages": list(scenario.stages),
        "timings": {"total_s": 0.0, "stages": {}},
        "numeric_settings": scenario.numeric_settings,
    }
    (root / "run.json").write_text(json.dumps(run))
    return root


def make_project(root: Path, scenario_text: str | None = None, name: str = "tiny_ppo") -> Path:
    """A pytest project dir with ``scenarios/<name>.yaml`` (the tiny scenario by default)."""
    (root / "scenarios").mkdir(parents=True, exist_ok=True)
    (root / "scenarios" / f"{name}.yaml").write_text(scenario_text if scenario_text is not None else TINY.read_text())
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return root


def hooks_env(**variables: str) -> dict[str, str]:
    """``variables`` (e.g. ``PRECISION_TEST_PLANT="loss"``) and a ``PYTHONPATH`` led by ``tests/hooks``, whose
    ``sitecustomize`` patches the test hooks into every process started with it (``hooks/precision_test_hooks.py``)."""
    path = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **variables}


#: a run's own patch of torch, as a user's ``sitecustomize.py`` on ``PYTHONPATH`` would bring it: the function
#: ``torch.nn.functional.{name}`` computes {scale} times its result, patched right after that module's first import
#: (so a process that never imports torch, as pytest's, stays torch-free)
PATCHING_SITECUSTOMIZE = """
import importlib.abc, importlib.machinery, sys


class _Patching(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path) if name == "torch.nn.functional" else None
        if spec is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            original = module.{name}
            module.{name} = lambda *args, **kwargs: original(*args, **kwargs) * {scale!r}

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patching())
"""


def patching_site(folder: Path, name: str, scale: float = 1.0 + 1e-4) -> Path:
    """``folder`` holding a ``sitecustomize.py`` that patches ``torch.nn.functional.<name>`` to compute ``scale``
    times its result (:data:`PATCHING_SITECUSTOMIZE`): put it on ``PYTHONPATH``, as a run that patches torch at the
    Python level does."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(PATCHING_SITECUSTOMIZE.format(name=name, scale=scale))
    return folder


def run_cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``precision-harness ARGS`` (``python -m precision_harness.cli``) in a subprocess, ``env`` over this one's."""
    return subprocess.run(
        [sys.executable, "-m", "precision_harness.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def run_pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """pytest in a subprocess (a fresh interpreter: sys.modules and msprobe state are clean)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def scenario_file(pytester: pytest.Pytester, name: str = "tiny_ppo") -> Path:
    return pytester.path / "scenarios" / f"{name}.yaml"


def edit_scenario(pytester: pytest.Pytester, old: str, new: str, name: str = "tiny_ppo") -> None:
    """Replace one exact snippet of the scenario YAML (fails loudly if it is not there)."""
    path = scenario_file(pytester, name)
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def export_golden(golden_dir: Path, out: Path) -> Path:
    """A recorded golden's payloads as plain files (verl's layout), e.g. to use as a compare target."""
    from precision_harness.goldens.golden import Golden

    return Golden.from_dir(golden_dir).export(out)


def replace_payload(golden_dir: Path, name: str, content: bytes) -> Path:
    """Store ``content`` as golden payload ``name`` with sound digests in the manifest (a bad golden, well signed)."""
    import hashlib

    from precision_harness.goldens import golden_codec

    stored = name + golden_codec.SUFFIX
    data = golden_codec.compress(content)
    (golden_dir / stored).write_bytes(data)
    manifest_path = golden_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][stored] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "content_sha256": hashlib.sha256(content).hexdigest(),
        "content_bytes": len(content),
    }
    manifest_path.write_text(json.dumps(manifest))
    return golden_dir / stored


def long_stage(tmp_path: Path, calls: int = 600, at: int = 450, factor: float = 1.1) -> tuple[Any, Any]:
    """Two ranks of ``calls`` linear calls each; from call ``at`` on, rank1's outputs drift (their Max times
    ``factor``), and rank0's from call ``at + 50`` on (rank1 diverges first); ``(run, golden)`` as
    :class:`~precision_harness.dumps.stage.DirStage` s."""
    from precision_harness.dumps.stage import DirStage

    for side in ("golden", "run"):
        for rank, start in (("rank0", at + 50), ("rank1", at)):
            data = {}
            for i in range(calls):
                moved = side == "run" and i >= start
                data[f"Functional.linear.{i}.forward"] = {
                    "input_args": [tensor(Max=1.0 + i)],
                    "output": [tensor(Max=(2.0 + i) * (factor if moved else 1.0))],
                }
            write_dump(tmp_path / side / "step_1" / "actor_update", data, rank)
    return DirStage(tmp_path / "run" / "step_1" / "actor_update"), DirStage(
        tmp_path / "golden" / "step_1" / "actor_update"
    )


def has_cpu_flag(flag: str) -> bool:
    """Whether this machine's CPU has ``flag`` among the ISA flags a manifest records (``cpu_flags``)."""
    from precision_harness.runs.host.machine import cpu_fingerprint

    return flag in cpu_fingerprint()["cpu_flags"].split()


def left_behind(under: Path, grace: float = 10.0) -> list[int]:
    """Processes of a gate run whose dumps went below ``under`` (their ``PRECISION_DUMP_DIR``) that still carry
    the run's ``PRECISION_RUN_ID`` mark after ``grace`` seconds: what a run left behind. Another run on the
    machine (another session's, another folder) is not this one's."""
    import time

    mark, prefix = b"PRECISION_RUN_ID=", b"PRECISION_DUMP_DIR=" + str(under).encode()
    deadline = time.monotonic() + grace
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(v.startswith(mark) for v in env) and any(v.startswith(prefix) for v in env):
                found.append(int(entry.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


#: Debian's chromium (``.ci/run`` installs it); the tests that render report.html skip without it
CHROMIUM = Path("/usr/bin/chromium")


def chromium_dom(page: Path, profile: Path) -> subprocess.CompletedProcess:
    """``page`` loaded offline by headless chromium (``--dump-dom``: stdout is the DOM after rendering);
    ``profile`` is a fresh user-data folder, so no state of another run leaks in."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    flags += ["--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}"]
    command = [str(CHROMIUM), *flags, "--dump-dom", page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
