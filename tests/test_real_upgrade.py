"""A real upgrade, end to end: two built-in scenarios under transformers 5.23.0 against goldens recorded with 5.10.4.

5.23.0 forms RoPE's frequencies with one ``Tensor.__mul__`` where 5.10.4 records a ``Tensor.__matmul__``: one
call per model forward, and msprobe renumbers every later ``Tensor.__mul__``. Paired by name, the gate failed 74
items and pointed upstream; paired by alignment every paired value is the golden's and every stage passes with its
changed code path reported, transformers named as the cause. ``make test`` installs 5.23.0 (and the tokenizers it
needs) from constraints/transformers-5.23.txt into ``.venv/transformers-5.23``; this test puts it first on
``PYTHONPATH`` for the gate it starts, so nothing else of the pinned environment moves.

Plant (a) of a changed code path, "a call replaced with the same values passes, reported", is this upgrade itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from precision_harness.scenarios.profiling import STAGES
from precision_harness.schemas import load_schema

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
UPGRADE = ROOT / ".venv" / "transformers-5.23"
CAUSE = "transformers 5.10.4 -> 5.23.0"
CHANGE = "Tensor.__matmul__ -> Tensor.__mul__"


#: two built-in scenarios that between them run every stage kind the gate dumps (the rest of scenarios/ adds
#: algorithm settings over the same model, which this upgrade does not reach; ``make gate`` checks them all)
SCENARIOS = ["scenarios/ppo_gae_tiny.yaml", "scenarios/grpo_bf16_rollout.yaml"]
STAGE_KINDS = {
    "rollout_generate",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
}


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    """The gate of :data:`SCENARIOS` under transformers 5.23.0: its output and report.json."""
    if not (UPGRADE / "transformers").is_dir():
        pytest.fail(f"{UPGRADE} holds no transformers: `make test` installs constraints/transformers-5.23.txt there")
    out = tmp_path_factory.mktemp("upgrade")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(UPGRADE), os.environ.get("PYTHONPATH")) if p)}
    args = [*SCENARIOS, "--precision-artifacts", str(out / "art"), "--precision-report"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(out / "rep")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    report = json.loads((out / "rep" / "report.json").read_text()) if (out / "rep" / "report.json").is_file() else {}
    return proc, report


def test_the_gate_passes_the_upgrade(upgraded) -> None:
    proc, report = upgraded
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    jsonschema.validate(report, load_schema("report"))
    assert report["summary"]["failed"] == 0
    assert {r["stage"] for r in report["items"]} >= STAGE_KINDS, "a stage kind went unchecked"


def test_every_stage_names_the_changed_code_path_and_its_cause(upgraded) -> None:
    proc, report = upgraded
    stages = [r for r in report["items"] if r["nodeid"].startswith("scenarios/") and r["stage"] in STAGES]
    assert stages, proc.stdout[-4000:]
    for record in stages:
        path = record["code_path"]
        assert path is not None, record["text"]
        assert path["what"] == [CHANGE] and path["failing"] == 0 and path["cause"].startswith(CAUSE)
        assert "every paired value identical" in path["line"], path["line"]
        assert "upstream" not in record["text"]
    lines = proc.stdout.splitlines()
    summary = next(line for line in lines if line.startswith(f"{CAUSE} changed the code path in "))
    assert "stage dump(s) of " in summary and CHANGE in summary and "re-record to refresh" in summary
    assert any(line.startswith("environment differs from the golden's") and CAUSE in line for line in lines)


def test_the_upgrade_was_really_installed(upgraded) -> None:
    """The run's environment is 5.23.0's (the check is not vacuous: every item compared against 5.10.4's goldens)."""
    _, report = upgraded
    diffs = [c for sc in report["scenarios"] for c in sc["environment_diff"]]
    assert {"what": "transformers", "golden": "5.10.4", "run": "5.23.0"} in diffs
