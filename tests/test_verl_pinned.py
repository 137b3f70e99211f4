"""Pinned rollouts in verl's real trainer on the CPU (issue 55): ``examples/verl_cpu/pinned/grpo_pinned_cpu.yaml``.

Its golden holds the rollouts verl's rollout cache saved (``skip.rollout_tq``, action ``cache``) and every check
loads them. verl 0.9.1's cache saves every field of a trajectory, the reward included (``rm_scores`` and
``extra_fields.reward_extra_info``), and replays them; the gate computes the reward again from the pinned
responses (``precision_harness/runs/verl/rescore.py``), so an edit to the reward function is drift, not
invisible. One verl run (slow, minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness_testing import left_behind

from precision_harness.runs.verl import pinning

#: the e2e runs a copy of examples/verl_cpu, so it need not wait for the tests that run the example where it stands
#: (xdist_group "verl_cpu_example"): under xdist it runs beside them, on the other worker
pytestmark = pytest.mark.xdist_group("verl_pinned")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "verl_cpu"
SCENARIO = Path("pinned") / "grpo_pinned_cpu.yaml"
ROLLOUTS = EXAMPLE / "golden" / "grpo_pinned_cpu" / "cpu" / "rollouts"
#: the edit: each score rounded to one decimal, as a reward that reports coarse grades would; in a GRPO group
#: whose two non-zero scores differ (0.067 and 0.062 in the golden's rollouts) they become equal, which
#: moves the group's normalised advantages (a scale or a shift of every score would not: GRPO removes both)
#: no L1 localisation, no judgement rerun: each would be a further verl run; the L0 verdict names the advantages
LOCALIZE_OFF = ("--precision-localize", "off", "--precision-judgement", "off")
EXACT = "return sum(ch in letters for ch in text) / len(text)"
ROUNDED = "return round(sum(ch in letters for ch in text) / len(text), 1)"


def test_the_golden_holds_the_rollouts_verls_cache_saved() -> None:
    """What a check loads: verl's own layout (``{experiment}_{project}/GBS{n}_N{n}_in{n}_out{n}/{step}/0``)."""
    saved = sorted(p.relative_to(ROLLOUTS).as_posix() for p in ROLLOUTS.rglob("*.zst"))
    assert saved == [
        f"verl_cpu_grpo_pinned_precision_gate/GBS2_N4_in32_out16/{step}/0/{name}"
        for step in (1, 2, 3)
        for name in ("meta.json.zst", "tq_batch.pt.zst")
    ]


def test_the_pinned_scenario_runs_with_the_rescoring_loaded_and_its_log_says_so(tmp_path: Path) -> None:
    from precision_harness.runs import kind_runners
    from precision_harness.scenarios.scenario import Scenario

    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    spec = kind_runners.command_spec(Scenario.load(EXAMPLE / SCENARIO), tmp_path, device="cpu")
    assert spec.env["VERL_USE_EXTERNAL_MODULES"].split(",")[-1] == pinning.MODULE
    assert spec.header[1].startswith("precision gate: rollouts pinned: verl's cache replays the recorded rewards; ")
    assert f"skip.rollout_tq.dump_dir={tmp_path / 'rollouts'}" in spec.argv


def test_a_pinned_run_loads_the_rescoring_and_says_so_and_another_verl_is_told_it_replays_the_reward() -> None:
    variables = {"VERL_USE_EXTERNAL_MODULES": "precision_harness.runs.verl.rank_stack,users.own"}
    line = pinning.gate_env(variables, "0.9.1")
    assert variables["VERL_USE_EXTERNAL_MODULES"].split(",") == [
        "precision_harness.runs.verl.rank_stack",
        "users.own",
        pinning.MODULE,
    ]
    assert "the gate scores the pinned responses again with the scenario's reward function" in line
    other = {"VERL_USE_EXTERNAL_MODULES": "users.own"}
    line = pinning.gate_env(other, "0.10.0")
    assert other == {"VERL_USE_EXTERNAL_MODULES": "users.own"}
    assert line == (
        "precision gate: rollouts pinned under verl 0.10.0: its cache replays the recorded rewards, which the gate "
        "scores again only under verl 0.9.1: an edit to the reward function is not seen"
    )


def test_the_pinned_fields_scored_again_give_the_recorded_reward_and_an_edited_function_another() -> None:
    """The golden's cached trajectories through :func:`rescore.reward_input` and verl's own reward manager (the
    example's ``reward.custom_reward_function``, as its reward loop worker runs it): the example's function gives
    back each recorded ``rm_scores`` and ``reward_extra_info`` bit for bit; the edited one (:data:`ROUNDED`) other
    scores. In a subprocess: torch and verl stay out of pytest's process."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    batch = ROLLOUTS / "verl_cpu_grpo_pinned_precision_gate" / "GBS2_N4_in32_out16" / "1" / "0" / "tq_batch.pt.zst"
    code = f"""
import io, json, torch, zstandard
from transformers import AutoTokenizer
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from precision_harness.runs.verl import rescore
with open({str(batch)!r}, "rb") as f:
    payload = torch.load(io.BytesIO(zstandard.ZstdDecompressor().stream_reader(f).read()), weights_only=False)
rows = rescore.rows(payload["tensordict"])
tokenizer = AutoTokenizer.from_pretrained({str(EXAMPLE / "model")!r})
source = open({str(EXAMPLE / "reward.py")!r}).read()
out = []
for text in (source, source.replace({EXACT!r}, {ROUNDED!r})):
    scope = {{}}
    exec(compile(text, "reward.py", "exec"), scope)
    manager = NaiveRewardManager(None, tokenizer, scope["compute_score"])
    results = [manager.loop.run_until_complete(manager.run_single(rescore.reward_input(r))) for r in rows]
    new = [rescore.scored(r, result) for r, result in zip(rows, results)]
    out.append([[torch.equal(n["rm_scores"], r["rm_scores"]), n["extra_fields"] == r["extra_fields"]]
                for n, r in zip(new, rows)])
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same, edited = json.loads(proc.stdout.strip().splitlines()[-1])
    assert same == [[True, True]] * 8
    assert [s for s, _ in edited].count(False) >= 2  # 0.067 and 0.062 become 0.1; a 0 stays 0


@pytest.mark.slow
def test_e2e_a_reward_function_edit_under_pinned_rollouts_fails_actor_update_at_the_advantages(
    tmp_path: Path,
) -> None:
    """A copy of the example with reward.py edited (:data:`ROUNDED`), checked against the committed golden, step 1's
    items selected (verl runs to step 1). The check loads the golden's 8 trajectories (verl's cache says so in the
    run's log; nothing is sampled), the gate scores them again with the edited function, and:
    actor_compute_log_prob[step_1], which reads no reward, passes; so does rollout_compute_log_prob[step_1], the
    engine's scores of the same responses; actor_update[step_1] fails, its verdict saying the change entered upstream,
    at its input Stage.advantages. Under verl's cache alone the recorded scores come back and every item passes."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    example = tmp_path / "verl_cpu"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns(".precision", "__pycache__"))
    reward = example / "reward.py"
    assert EXACT in reward.read_text()
    reward.write_text(reward.read_text().replace(EXACT, ROUNDED))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", str(SCENARIO), "-k", "step_1", *LOCALIZE_OFF],
        cwd=example,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    out = proc.stdout
    outcomes = dict(re.findall(r"::(\S+) (PASSED|FAILED|ERROR)", out))
    assert outcomes == {
        "rollout_compute_log_prob[step_1]": "PASSED",
        "actor_compute_log_prob[step_1]": "PASSED",
        "actor_update[step_1]": "FAILED",
    }, out[-4000:]
    assert "grpo_pinned_cpu: run to step 1 of 4, as selected" in out, out[-4000:]
    log = (example / ".precision" / "artifacts" / "grpo_pinned_cpu" / "run" / "worker.log").read_text()
    assert re.search(r"\[RolloutTqSkip\(\)\] .*Injected 8 cached trajectories from step 1 \(2 prompts x 4\)", log)
    assert "Dump TQ batch" not in log  # loaded, not generated and saved
    assert "precision gate: pinned rollouts of step 1: 8 of 8 trajectories scored again by the reward function" in log
    assert re.search(
        r"change entered\s+the change is upstream of actor_update: its input Stage\.advantages\.0\.forward\.input\.0 "
        r"is the first value that differs",
        out,
    ), out[-4000:]
    assert not left_behind(example / ".precision")
