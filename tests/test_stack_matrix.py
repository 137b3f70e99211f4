"""The stack matrix's cheap rows in ``make test`` (issue 52): real mindstudio-probe and transformers releases.

``make test`` installs each ``constraints/stacks/`` file, without dependencies, into ``.venv/stacks/<stem>``
(``benchmarks/stack_matrix.py --install``). Each row here runs one scenario's first step
(``scenarios/grpo_tiny.yaml -k step_1``: actor and reference log-probs and the actor update, every stage kind a
model forward reaches) under that folder against the committed goldens, and asserts the true verdict:

- every release passes, the numbers it records unmoved, and the package's change is named: msprobe in the
  environment line, transformers as the cause of the changed code path;
- mindstudio-probe 8.3.3 (the 8.x line, numpy 1 only: its row's folder holds numpy 1.26.4 and pandas 2.0.3) besides
  names what it records that 26.2.0 does not: the calls of the low-risk APIs 26.x leaves out, the backward it records
  twice, the Mean and Norm of integer tensors (check/recording.py). Under numpy 2 it is refused in one line (a unit
  test here, no run).

The whole gate per row, and the torch rows, run from the benchmark (docs/stacks.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import stack_matrix  # noqa: E402

#: one scenario's first step: what each row costs in `make test` (docs/stacks.md has the whole gate)
ONE_SCENARIO = ("scenarios/grpo_tiny.yaml", "-k", "step_1")
STAGES = {"actor_compute_log_prob", "ref_compute_log_prob", "actor_update"}
ROWS = [s for s in stack_matrix.stacks() if s.kind != "pinned"]
MSPROBE_NUMPY1 = [s for s in ROWS if s.kind == "msprobe" and Version(s.version) < Version("26")]
MSPROBE = [s for s in ROWS if s.kind == "msprobe" and s not in MSPROBE_NUMPY1]
TRANSFORMERS = [s for s in ROWS if s.kind == "transformers"]
GOLDEN = stack_matrix.pins()


def _run(stack: stack_matrix.Stack, tmp_path: Path) -> stack_matrix.Row:
    settings = stack_matrix.MatrixSettings(gate=ONE_SCENARIO, out=tmp_path, timeout_s=1500)
    return stack_matrix.run_gate(stack, settings)


def _ids(stacks: list[stack_matrix.Stack]) -> list[str]:
    return [s.name for s in stacks]


@pytest.mark.slow
@pytest.mark.parametrize("stack", MSPROBE_NUMPY1, ids=_ids(MSPROBE_NUMPY1))
def test_an_msprobe_release_for_numpy_1_passes_with_its_recording_named(stack, tmp_path: Path) -> None:
    """The 8.x line runs the loop's stages (its debugger takes no rank_id: runs/msprobe_debugger.py) and passes: every
    statistic both releases record is the golden's, and what only 8.x records is named with the msprobe change."""
    row = _run(stack, tmp_path)
    assert row.ok, stack_matrix.table([row])
    stages = [i for i in row.report["items"] if i["stage"] in STAGES]
    assert {i["stage"] for i in stages} == STAGES, stack_matrix.table([row])
    change = f"mindstudio-probe {GOLDEN['msprobe']} -> {stack.version} records "
    for item in stages:
        assert item["kind"] == "compared" and item["worst_ratio"] == 0.0, item["text"]
        (recorded,) = [line for line in item["text"].splitlines() if line.strip().startswith("recorded")]
        assert change in recorded and "low-risk API(s) (msprobe 26.x's risk_level FOCUS leaves them out" in recorded
    assert "repeat the backward before them (Functional.dropout x" in next(
        i["text"] for i in stages if i["stage"] == "actor_update"
    )
    diffs = [d for sc in row.report["scenarios"] for d in sc["environment_diff"]]
    assert {"what": "mindstudio-probe", "golden": GOLDEN["msprobe"], "run": stack.version} in diffs, diffs


@pytest.mark.slow
@pytest.mark.parametrize("stack", MSPROBE, ids=_ids(MSPROBE))
def test_an_msprobe_release_passes_with_the_numbers_unmoved(stack, tmp_path: Path) -> None:
    row = _run(stack, tmp_path)
    assert row.ok, stack_matrix.table([row])
    stages = [i for i in row.report["items"] if i["stage"] in STAGES]
    assert {i["stage"] for i in stages} == STAGES, stack_matrix.table([row])
    for item in stages:
        assert item["kind"] == "identical" or item["worst_ratio"] == 0.0, item["text"]
    diffs = [d for sc in row.report["scenarios"] for d in sc["environment_diff"]]
    assert {"what": "mindstudio-probe", "golden": GOLDEN["msprobe"], "run": stack.version} in diffs, diffs


@pytest.mark.slow
@pytest.mark.parametrize("stack", TRANSFORMERS, ids=_ids(TRANSFORMERS))
def test_a_transformers_release_passes_with_its_code_path_named(stack, tmp_path: Path) -> None:
    row = _run(stack, tmp_path)
    assert row.ok, stack_matrix.table([row])
    cause = f"transformers {GOLDEN['transformers']} -> {stack.version}"
    stages = [i for i in row.report["items"] if i["stage"] in STAGES]
    assert {i["stage"] for i in stages} == STAGES, stack_matrix.table([row])
    for item in stages:
        assert "upstream" not in item["text"], item["text"]
        if item["kind"] != "identical":
            path = item["code_path"]
            assert path is not None and path["failing"] == 0 and path["cause"].startswith(cause), item["text"]
    diffs = [d for sc in row.report["scenarios"] for d in sc["environment_diff"]]
    assert {"what": "transformers", "golden": GOLDEN["transformers"], "run": stack.version} in diffs, diffs


def test_every_row_is_installed_where_the_gate_looks() -> None:
    """``make test`` installed each row's release (the rows above are not vacuous: each runs that release)."""
    for stack in ROWS:
        probe = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
        argv = [sys.executable, "-c", probe, stack.package]
        proc = subprocess.run(argv, env=stack_matrix.environment(stack), capture_output=True, text=True, check=False)
        assert proc.stdout.strip() == stack.version, f"{stack.target}: `make .venv/.test` installs {stack.name}"


def test_the_unimportable_line_names_what_the_release_needs(tmp_path: Path) -> None:
    """The refusal's line, without running anything: msprobe 8.3.3's own numpy requirement, read from its metadata
    (the row's, without the row's numpy 1: the pinned numpy 2 is found)."""
    (stack,) = [s for s in MSPROBE_NUMPY1 if s.version == "8.3.3"]
    (tmp_path / "mindstudio_probe-8.3.3.dist-info").symlink_to(stack.target / "mindstudio_probe-8.3.3.dist-info")
    code = (
        "from precision_harness.runs.host.msprobe_release import unimportable;"
        "print(unimportable(AttributeError('`np.unicode_` was removed in the NumPy 2.0 release.')))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    line = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert line.count("\n") == 1 and line.startswith("mindstudio-probe 8.3.3 does not import here (AttributeError:")
    assert "numpy<2.0,>=1.23.0 (numpy 2." in line and "(docs/stacks.md): pip install 'mindstudio-probe>=" in line


def test_a_stacks_file_names_its_package_and_release(tmp_path: Path) -> None:
    good = tmp_path / "msprobe-x.txt"
    good.write_text("# a row\nmindstudio-probe==26.1.0  # the release\nnumpy==1.26.4\n")
    assert stack_matrix.load_stack(good) == stack_matrix.Stack(
        "msprobe-x", "msprobe", "mindstudio-probe", "26.1.0", good
    )
    loose = tmp_path / "loose.txt"
    loose.write_text("transformers>=4.57\n")
    with pytest.raises(ValueError, match=r"loose.txt: first requirement 'transformers>=4.57' is not name==version"):
        stack_matrix.load_stack(loose)


def _item(kind: str, passed: bool, text: str) -> dict:
    return {"kind": kind, "passed": passed, "text": text, "stage": "actor_update", "nodeid": "x"}


def test_a_row_counts_items_and_refuses_where_nothing_was_gated() -> None:
    stack = stack_matrix.Stack("s", "msprobe", "mindstudio-probe", "1")
    env = "environment differs from the golden's: mindstudio-probe 26.2.0 -> 1"
    items = [_item("identical", True, ""), _item("compared", True, ""), _item("compared", False, f"{env}\nbad Max")]
    row = stack_matrix.row_from_report(stack, {"items": [*items, _item("compared", False, "bad Max")]}, 1.0)
    assert (row.status, row.passed, row.identical, row.within, row.failed) == ("ran", 2, 1, 1, 2)
    assert row.verdicts == [(2, "bad Max")]
    refused = stack_matrix.row_from_report(stack, {"items": [_item("error", False, "cannot run\ntraceback")]}, 1.0)
    assert (refused.status, refused.reason, refused.ok) == ("refused", "cannot run", False)
    assert "| msprobe 1 | refused: cannot run | 0 | 0 | 0 | 1 |  | 1 |" in stack_matrix.table([refused])


def test_the_docs_page_is_the_scripts(tmp_path: Path) -> None:
    """docs/stacks.md is generated (``--write-docs``): its table rows are those the script writes for its rows."""
    text = (ROOT / "docs" / "stacks.md").read_text()
    assert "Generated by `python benchmarks/stack_matrix.py --write-docs`" in text
    for stack in stack_matrix.stacks():
        label = "pinned (constraints/cpu.txt)" if stack.kind == "pinned" else f"{stack.kind} {stack.version}"
        assert f"| {label} |" in text, f"docs/stacks.md has no row for {stack.name}: run the script with --write-docs"


def test_the_warm_preload_leaves_out_a_module_that_raises(tmp_path: Path, monkeypatch) -> None:
    """A preloaded module raising other than ImportError (msprobe 8.3.3's AttributeError under numpy 2) once ended the
    forkserver, and every run read ``EOFError``; now it is left to the run, and the rest is still imported."""
    from precision_harness.runs.warm import workers as warm

    (tmp_path / "raises_on_import.py").write_text("raise AttributeError('`np.unicode_` was removed')\n")
    (tmp_path / "imports_fine.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(warm, "PRELOAD", ("raises_on_import", "imports_fine"))
    warm.preload()
    assert sys.modules.pop("imports_fine").LOADED and "raises_on_import" not in sys.modules


@pytest.mark.parametrize(
    ("numpy", "refused"), [("2.4.6", True), ("1.26.4", False), (None, False)], ids=["numpy-2", "numpy-1", "no-numpy"]
)
def test_the_8x_line_is_refused_in_one_line_only_under_numpy_2(monkeypatch, numpy: str | None, refused: bool) -> None:
    """msprobe_release.run_problem, no run: 8.3.3 under numpy 2 is one line that names both, why and what to do (the
    numpy 1 row, or a 26.x release); under numpy 1 it runs (the row above)."""
    from importlib import metadata

    from precision_harness.check.localize import msprobe_release

    real = metadata.version
    versions = {"mindstudio-probe": "8.3.3", "numpy": numpy}

    def version(name: str) -> str:
        if name in versions and versions[name] is None:
            raise metadata.PackageNotFoundError(name)
        return versions.get(name) or real(name)

    monkeypatch.setattr(metadata, "version", version)
    line = msprobe_release.run_problem()
    if not refused:
        assert line is None
        return
    assert line is not None and "\n" not in line
    assert line.startswith("mindstudio-probe 8.3.3 cannot run under numpy 2.4.6: it uses np.unicode_"), line
    assert "docs/stacks.md" in line and line.endswith("pip install 'mindstudio-probe>=26.1.0'"), line
