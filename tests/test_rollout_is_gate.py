"""Changing one rollout-IS setting of a committed scenario fails exactly the gate items it should.

IS runs between stages (on the driver, as verl's trainer), after ``actor_compute_log_prob`` and
``ref_compute_log_prob`` and before ``actor_update``; every IS setting is a numeric setting (compared,
not stale). So at step 1 the log-prob stages always pass; ``actor_update`` fails only when the
setting changes the weights applied to the loss; step 2 follows from the changed actor; and
``metrics.jsonl`` always fails (the ``mismatch/`` metrics move), naming the changed setting.

One pytest run checks every edit: each edited copy of the scenario gets a copy of the committed
golden under its own name (the name is not part of the scenario hash). The frozen reference at
step 2 moves only when the changed actor samples other tokens; that is read from the runs'
``step_2/log_probs.json`` against the control edit, whose training is unchanged.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from harness_testing import make_project, run_pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
APPLIED = "grpo_is_token_truncate"  # rollout_is: true, token/truncate, threshold 2.0, veto 1e-4
METRICS_ONLY = "grpo_is_metrics_only"  # rollout_is: false, token/truncate, threshold 2.0

STEP1_LOGPROB = {"actor_compute_log_prob[step_1]", "ref_compute_log_prob[step_1]"}
ALL = STEP1_LOGPROB | {
    "actor_update[step_1]",
    "actor_compute_log_prob[step_2]",
    "ref_compute_log_prob[step_2]",
    "actor_update[step_2]",
    "metrics",
}
#: the weights reach the loss: the actor trains differently from step 1's update on (the frozen
#: reference at step 2 moves only if the changed actor samples other tokens; checked separately)
WEIGHTS_MOVE = {"actor_update[step_1]", "actor_compute_log_prob[step_2]", "actor_update[step_2]", "metrics"}

# name: (base scenario, old snippet, new snippet, items that must fail, setting the verdict names)
EDITS = {
    "threshold": (
        APPLIED,
        "rollout_is_threshold: 2.0",
        "rollout_is_threshold: 1.0005",
        WEIGHTS_MOVE,
        "algorithm.rollout_is_threshold: 2.0 -> 1.0005",
    ),
    "threshold_lower": (
        APPLIED,
        "rollout_is_threshold: 2.0\n",
        "rollout_is_threshold: 2.0\n  rollout_is_threshold_lower: 0.9995\n",
        {"metrics"},
        "algorithm.rollout_is_threshold_lower: None -> 0.9995",
    ),
    "level": (
        APPLIED,
        "rollout_is_level: token",
        "rollout_is_level: sequence",
        WEIGHTS_MOVE,
        "algorithm.rollout_is_level: token -> sequence",
    ),
    "mode": (
        APPLIED,
        "rollout_is_mode: truncate",
        "rollout_is_mode: clip",
        {"metrics"},
        "algorithm.rollout_is_mode: truncate -> clip",
    ),
    "veto": (
        APPLIED,
        "rollout_is_veto_threshold: 1.0e-4",
        "rollout_is_veto_threshold: 0.999",
        WEIGHTS_MOVE,
        "algorithm.rollout_is_veto_threshold: 0.0001 -> 0.999",
    ),
    "apply": (APPLIED, "rollout_is: true", "rollout_is: false", WEIGHTS_MOVE, "algorithm.rollout_is: True -> False"),
    "metrics_only_threshold": (
        METRICS_ONLY,
        "rollout_is_threshold: 2.0",
        "rollout_is_threshold: 1.0005",
        {"metrics"},
        "algorithm.rollout_is_threshold: 2.0 -> 1.0005",
    ),
}
#: an edit whose actor trains exactly as the golden's: its step-2 samples are the golden's samples
CONTROL = "mode"
ITEM_RE = re.compile(r"^(PASSED|FAILED) scenarios/(?P<scenario>[a-z_]+)\.yaml::(?P<item>\S+)")


@pytest.fixture(scope="module")
def gate_outcomes(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, str]], str, Path]:
    """Run the gate once over every edited scenario: ``({edit: {item: PASSED|FAILED}}, stdout, project)``."""
    root = make_project(tmp_path_factory.mktemp("is_gate"), "", name="unused")
    (root / "scenarios" / "unused.yaml").unlink()
    for edit, (base, old, new, _, _) in EDITS.items():
        text = (REPO / "scenarios" / f"{base}.yaml").read_text()
        assert text.count(old) == 1, f"{old!r} not once in {base}.yaml"
        (root / "scenarios" / f"{edit}.yaml").write_text(text.replace(old, new))
        shutil.copytree(REPO / "golden" / base, root / "golden" / edit)
    proc = run_pytest(root, "-rA", "--precision-jobs", "2")
    outcomes: dict[str, dict[str, str]] = {edit: {} for edit in EDITS}
    for line in proc.stdout.splitlines():
        m = ITEM_RE.match(line)
        if m:
            outcomes[m["scenario"]][m["item"]] = m.group(1)
    return outcomes, proc.stdout, root


def verdicts(stdout: str, scenario: str) -> str:
    """The FAILURES sections of ``scenario``'s items: what an unexpected outcome needs to be understood."""
    kept, keep = [], False
    for line in stdout.splitlines():
        if line.startswith(("____", "====")):
            keep = f" {scenario}::" in line
        if keep:
            kept.append(line)
    return "\n".join(kept)[:8000]


def step2_responses(root: Path, scenario: str) -> list[list[int]]:
    return json.loads((root / ".precision/artifacts" / scenario / "run/step_2/log_probs.json").read_text())["responses"]


def test_control_edit_trains_like_the_golden(gate_outcomes) -> None:
    """The "mode" edit (truncate -> clip, no weight outside [0.5, 2]) keeps training unchanged: the control."""
    outcomes, stdout, _ = gate_outcomes
    assert outcomes[CONTROL] == {**dict.fromkeys(ALL, "PASSED"), "metrics": "FAILED"}, stdout[-3000:]


@pytest.mark.parametrize("edit", list(EDITS))
def test_one_is_setting_fails_exactly_its_items(gate_outcomes, edit: str) -> None:
    outcomes, stdout, root = gate_outcomes
    base, _, _, must_fail, setting = EDITS[edit]
    assert set(outcomes[edit]) == ALL, stdout[-3000:]
    if base == APPLIED and step2_responses(root, edit) != step2_responses(root, CONTROL):
        must_fail = must_fail | {"ref_compute_log_prob[step_2]"}
    failed = {item for item, result in outcomes[edit].items() if result == "FAILED"}
    why = f"{edit}: failed {sorted(failed)}, expected {sorted(must_fail)}\n{verdicts(stdout, edit)}"
    assert failed == must_fail, why
    # the verdict says which setting changed (numeric setting: drift, not a stale golden)
    assert f"setting changed  {setting}" in stdout or f"setting changed   {setting}" in stdout
    assert "golden is stale" not in stdout
