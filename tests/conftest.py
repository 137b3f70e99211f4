"""Fixtures for the harness's own tests (plain helpers live in harness_testing.py)."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from harness_testing import base_data, make_project, run_pytest, write_dump

from precision_harness.runs.warm import shared as warm_shared


@pytest.fixture
def dumps():
    """Factory for (target, golden) synthetic stage dirs: ``dumps(tmp_path, mutate)``."""

    def make(root: Path, mutate=None, golden_mutate=None, rank: str = "rank0") -> tuple[Path, Path]:
        golden = copy.deepcopy(base_data())
        target = copy.deepcopy(base_data())
        if golden_mutate:
            golden_mutate(golden)
        if mutate:
            mutate(target)
        write_dump(root / "golden" / "step_1" / "actor_update", golden, rank)
        write_dump(root / "target" / "step_1" / "actor_update", target, rank)
        return root / "target" / "step_1" / "actor_update", root / "golden" / "step_1" / "actor_update"

    return make


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files each new skeleton template was built from, in order (the process's last template forgotten first)."""
    from precision_harness.dumps import skeleton

    monkeypatch.setattr(skeleton, "_last", None)
    monkeypatch.setattr(skeleton, "_refused", None)
    found: list[str] = []
    make = skeleton.Template.of.__func__

    def of(cls, parts: list[bytes], seen: skeleton.Skeleton, *, shown: str):
        found.append(shown)
        return make(cls, parts, seen, shown=shown)

    monkeypatch.setattr(skeleton.Template, "of", classmethod(of))
    return found


@pytest.fixture(scope="session")
def recorded_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose tiny scenario's golden was recorded once per test session (one real run)."""
    root = make_project(tmp_path_factory.mktemp("recorded"))
    proc = run_pytest(root, "--precision-golden", "update")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.fixture
def project(recorded_project: Path, pytester: pytest.Pytester) -> pytest.Pytester:
    """pytester whose directory holds a copy of the recorded project (golden included)."""
    shutil.copytree(recorded_project, pytester.path, ignore=shutil.ignore_patterns(".precision"), dirs_exist_ok=True)
    return pytester


#: modules whose module-scoped fixtures run a gate, a recording or a verl run, several tests reading each: under
#: ``make test``'s xdist workers (``--dist loadgroup``) each module stays on one worker, so each fixture runs once
ONE_WORKER_MODULES = frozenset(
    {
        "test_api_replay",
        "test_bisect",
        "test_code_path_planted",
        "test_golden_history",
        "test_judgement",
        "test_judgement_planted",
        "test_level_auto",
        "test_option_precision_ray_address",
        "test_option_precision_report",
        "test_real_upgrade",
        "test_rollout_is_gate",
        "test_wheel",
    }
)


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
        if module in ONE_WORKER_MODULES and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(module))


_WARM_FOLDER = pytest.StashKey[Path]()
#: the planted changes' variables (tests/hooks/precision_test_hooks.py)
HOOK_VARIABLES = ("PRECISION_TEST_PLANT", "PRECISION_TEST_PERTURB_RANK")
#: what pytester's subprocess sessions set to each test's folder
PYTESTER_VARIABLES = ("HOME", "USERPROFILE", "PYTEST_DEBUG_TEMPROOT")


def pytest_configure(config: pytest.Config) -> None:
    """The test session's ~80 inner pytest sessions and its xdist workers share warm servers, one per run
    environment (precision_harness.runs.warm.shared), owned by this controller: each would import torch,
    transformers and msprobe for its own server, ~10 s a time on 2 cores."""
    if hasattr(config, "workerinput") or os.environ.get(warm_shared.DIR_ENV):
        return  # an xdist worker inherits the controller's folder; an enclosing run's folder is kept
    folder = tempfile.mkdtemp(prefix="precision-warm-")
    os.environ[warm_shared.DIR_ENV], os.environ[warm_shared.OWNER_ENV] = folder, str(os.getpid())
    # the test hooks read their variables at each call (hooks/precision_test_hooks.py's factor()), never at import;
    # pytester points HOME at each test's folder, and no run of a built-in scenario reads a home folder
    os.environ[warm_shared.IGNORE_ENV] = ",".join((*HOOK_VARIABLES, *PYTESTER_VARIABLES))
    config.stash[_WARM_FOLDER] = Path(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_WARM_FOLDER, None)
    if folder is not None:
        warm_shared.stop_all(folder)
        shutil.rmtree(folder, ignore_errors=True)
        for name in (warm_shared.DIR_ENV, warm_shared.OWNER_ENV, warm_shared.IGNORE_ENV):
            os.environ.pop(name, None)
