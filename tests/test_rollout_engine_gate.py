"""The rollout engine in the gate (issue 56): ``rollout_compute_log_prob``, the engine scoring the pinned responses.

With rollouts pinned a check samples nothing; after each weight sync the rollout engine (on the CPU the gate's
rollout server, ``precision_harness/runs/verl/cpu/policy_server.py``) computes the log-probs of the pinned responses
teacher-forced, and the stage's dump holds them and their mismatch with ``actor_compute_log_prob``'s
(``precision_harness/runs/verl/engine_scoring.py``). The e2e plants change the engine only, one per step of one run
of ``examples/verl_cpu/pinned/grpo_pinned_cpu.yaml`` (tests/hooks: ``engine_logits_bf16`` at step 1,
``engine_temperature_twice`` at step 2, ``engine_stale_layer`` at step 3): each fails the engine's stage at its
step, naming the engine, and every training-side item passes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness_testing import hooks_env, left_behind

from precision_harness.errors import ScenarioError
from precision_harness.runs.verl.engine_scoring import response_log_probs
from precision_harness.scenarios.scenario import Scenario

#: a copy of examples/verl_cpu, beside the tests that run the example where it stands (another xdist group)
pytestmark = pytest.mark.xdist_group("verl_engine")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "verl_cpu"
SCENARIO = Path("pinned") / "grpo_pinned_cpu.yaml"
STAGE = "rollout_compute_log_prob"
#: the plant of each step (tests/hooks/precision_test_hooks.py, ENGINE_PLANT_STEPS)
PLANTS = {1: "engine_logits_bf16", 2: "engine_temperature_twice", 3: "engine_stale_layer"}
#: the example's fresh step (verl.fresh_steps: 1): the engine samples it, and its log-probs there are planted
#: (``rollout_logprobs``: the sampled tokens' log-probs rounded through bfloat16; tests/hooks), which no pinned step
#: can see: a pinned step samples nothing
FRESH = "fresh_rollout_mismatch[step_4]"
FRESH_PLANT = "rollout_logprobs"


def _pinned_yaml(tmp_path: Path, **changes: str) -> Path:
    text = (EXAMPLE / SCENARIO).read_text()
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    folder = tmp_path / "pinned"
    folder.mkdir(exist_ok=True)
    for name in ("data", "model"):
        (tmp_path / name).symlink_to(EXAMPLE / name)
    (tmp_path / "reward.py").symlink_to(EXAMPLE / "reward.py")
    path = folder / "grpo_pinned_cpu.yaml"
    path.write_text(text)
    return path


def test_the_stage_needs_pinned_rollouts_in_one_line(tmp_path: Path) -> None:
    path = _pinned_yaml(tmp_path, **{"pin_rollouts: true": "pin_rollouts: false"})
    with pytest.raises(ScenarioError) as err:
        Scenario.load(path)
    assert str(err.value) == (
        f"{path}: global_profiler.global_tool_config.precision_debugger.stages: rollout_compute_log_prob is the "
        "rollout engine scoring pinned responses, which only an engine: verl scenario with verl.pin_rollouts: true "
        "has; remove it from stages or pin them"
    )


def test_a_builtin_scenario_cannot_declare_the_stage(tmp_path: Path) -> None:
    path = tmp_path / "grpo.yaml"
    path.write_text(
        "global_profiler:\n  steps: [1]\n  global_tool_config:\n    precision_debugger:\n"
        "      stages: [rollout_compute_log_prob, actor_update]\n"
    )
    with pytest.raises(ScenarioError, match=r"grpo\.yaml: .*stages: rollout_compute_log_prob is the rollout engine"):
        Scenario.load(path)


#: a device scenario's rollout keys under which its engine scores the pinned responses (temperature 1, no top-k or
#: top-p: an engine's prompt log-probs are computed before its sampling processors)
DEVICE_ROLLOUT = {"actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.temperature": 1.0}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"actor_rollout_ref.rollout.name": "hf"},
            "verl.overrides: actor_rollout_ref.rollout.name is 'hf', and only the verl servers of vllm, sglang answer "
            "prompt_logprobs; remove rollout_compute_log_prob",
        ),
        (
            {"actor_rollout_ref.rollout.temperature": 0.8},
            "verl.overrides: actor_rollout_ref.rollout.temperature is 0.8, and vllm's prompt log-probs are computed "
            "before its sampling processors, so they score what it samples only at temperature 1, top_k -1 and "
            "top_p 1; set those, or remove rollout_compute_log_prob",
        ),
        (
            {"actor_rollout_ref.rollout.top_p": 0.9},
            "verl.overrides: actor_rollout_ref.rollout.top_p is 0.9, and vllm's prompt log-probs",
        ),
        (
            {
                "actor_rollout_ref.rollout.max_model_len": 48,
                "data.max_prompt_length": 32,
                "data.max_response_length": 16,
            },
            "verl.overrides: actor_rollout_ref.rollout.max_model_len is 48, and a scoring request of a full prompt and "
            "response (48 tokens) needs room for one more; set it to at least 49, or remove rollout_compute_log_prob",
        ),
    ],
    ids=["engine", "temperature", "top_p", "max_model_len"],
)
def test_off_the_cpu_an_engine_that_cannot_score_is_said_not_gated_in_one_line(
    tmp_path: Path, changes: dict, expected: str
) -> None:
    """Off the CPU the stage is refused, in one line saying the engine is not gated and why, for an engine whose verl
    server has no prompt log-probs, sampling params its prompt log-probs ignore, or no room for the scoring token."""
    from precision_harness.runs.verl import engine

    with pytest.raises(ScenarioError) as err:
        engine.check_device_stages(tmp_path / "s.yaml", [STAGE, "actor_update"], "cuda", {**DEVICE_ROLLOUT, **changes})
    message = str(err.value)
    assert "\n" not in message
    head = f"{tmp_path / 's.yaml'}: global_profiler.global_tool_config.precision_debugger.stages: "
    assert message.startswith(head + "rollout_compute_log_prob on cuda: the rollout engine is not gated in this run: ")
    assert expected in message


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_off_the_cpu_vllm_and_sglang_score_at_temperature_1_with_room_for_one_token(tmp_path: Path, name: str) -> None:
    """An engine whose verl 0.9.1 server answers prompt_logprobs, at temperature 1 (top-k and top-p off, as verl's
    defaults are), is allowed the stage on a device, with or without an explicit max_model_len that leaves room."""
    from precision_harness.runs.verl import engine

    overrides = {**DEVICE_ROLLOUT, "actor_rollout_ref.rollout.name": name, "actor_rollout_ref.rollout.top_k": -1}
    engine.check_device_stages(tmp_path / "s.yaml", [STAGE, "actor_update"], "npu", overrides)
    engine.check_device_stages(
        tmp_path / "s.yaml", [STAGE], "cuda", {**overrides, "actor_rollout_ref.rollout.max_model_len": 1025}
    )
    assert engine.score_refusal({"actor_rollout_ref.rollout.name": "hf"}, "cpu") is None


def test_the_stage_is_the_gates_own_and_verl_is_not_asked_for_it(tmp_path: Path) -> None:
    from precision_harness.runs import kind_runners

    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    scenario = Scenario.load(EXAMPLE / SCENARIO)
    assert scenario.stages == (STAGE, "actor_compute_log_prob", "actor_update")
    assert not scenario.localizes_stage(STAGE)
    spec = kind_runners.command_spec(scenario, tmp_path, device="cpu")
    stages = next(a for a in spec.argv if a.startswith("global_profiler.global_tool_config.precision_debugger.stages"))
    assert stages.endswith("=[actor_compute_log_prob,actor_update]")
    assert spec.env["PRECISION_STAGES"].split(",")[0] == STAGE


def test_teacher_forced_scores_are_the_log_probs_the_server_sampled_with() -> None:
    """A response the server sampled, scored back through the call the gate makes (prompt plus response asked for
    ``prompt_logprobs: 0``, answered in verl's layout, :func:`prompt_logprobs_fields`, read by
    :func:`~precision_harness.runs.verl.engine_scoring.response_log_probs`), gives the log-probs
    :func:`sample_response` returned for it (one forward of prompt + response against token-by-token decoding with a
    KV cache: equal to float32 rounding), and another temperature gives others. In a subprocess: torch stays out of
    pytest's process."""
    code = f"""
import json, torch
from transformers import AutoModelForCausalLM
from precision_harness.runs.verl.cpu import policy_server as ps
from precision_harness.runs.verl.engine_scoring import response_log_probs
model = AutoModelForCausalLM.from_pretrained({str(EXAMPLE / "model")!r}, torch_dtype=torch.float32).eval()
params = {{"temperature": 0.8, "top_k": -1, "top_p": 1.0, "max_tokens": 12}}
prompt = [3, 17, 42, 7, 99]
tokens, sampled, _ = ps.sample_response(model, prompt, params, seed=1234, eos=set())
def score(p):
    ids = prompt + tokens
    fields = ps.prompt_logprobs_fields(ids, ps.prompt_log_probs(model, ids, p))
    assert len(fields["prompt_logprobs"]) == len(ids) and fields["prompt_ids"][len(prompt) - 1] == [tokens[0]]
    return response_log_probs(fields, len(prompt), len(tokens))
gap = lambda xs: max(abs(a - b) for a, b in zip(xs, sampled, strict=True))
print(json.dumps([len(tokens), gap(score(params)), gap(score({{**params, "temperature": 0.4}}))]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, same, other = json.loads(proc.stdout.strip().splitlines()[-1])
    assert count == 12
    assert same < 1e-4
    assert other > 1e-2


def test_the_engines_answer_is_read_from_verls_prompt_logprobs_layout_or_refused_in_one_line() -> None:
    """verl's layout for a prompt of 3 and a response of 2 tokens: rows for positions 1 to 4, then a dummy row; the
    response's log-probs are rows 2 and 3. A missing or short answer is one line naming the stage and the counts."""
    fields = {"prompt_logprobs": [[-1.0], [-2.0], [-3.0], [-4.0], [0.0]]}
    assert response_log_probs(fields, 3, 2) == [-3.0, -4.0]
    for bad, got in (({}, "no prompt_logprobs"), ({"prompt_logprobs": [[-1.0]] * 4}, "4 prompt_logprobs rows")):
        with pytest.raises(RuntimeError) as info:
            response_log_probs(bad, 3, 2)
        assert str(info.value) == (
            f"rollout_compute_log_prob: the rollout engine answered {got} for 3 prompt and 2 response tokens, "
            "expected 5 (verl's prompt_logprobs layout)"
        )


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], str, Path]:
    """One check of a copy of the pinned example, the three engine plants each at its step: ``{item: outcome}``,
    stdout, the copy."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    example = tmp_path_factory.mktemp("engine") / "verl_cpu"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns(".precision", "__pycache__"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            str(SCENARIO),
            "--precision-localize",
            "off",
            "--precision-judgement",
            "off",
        ],
        cwd=example,
        env={**os.environ, **hooks_env(PRECISION_TEST_PLANT=",".join([*PLANTS.values(), FRESH_PLANT]))},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    outcomes = dict(re.findall(r"::(\S+) (PASSED|FAILED|ERROR)", proc.stdout))
    assert len(outcomes) == 11, proc.stdout[-4000:]  # 3 steps x 3 stages, the fresh step, and metrics
    assert not left_behind(example / ".precision")
    return outcomes, proc.stdout, example


def _engine_plant_fails_its_step_alone(run: tuple[dict[str, str], str, Path], step: int) -> str:
    """Asserts the engine's stage fails at ``step``, naming the engine, with both its parts moved (the engine's
    log-probs first, the mismatch with training the largest), and every training-side item passes; returns the
    verdict."""
    outcomes, out, _ = run
    assert outcomes[f"{STAGE}[step_{step}]"] == "FAILED", out[-4000:]
    training = {item: o for item, o in outcomes.items() if not item.startswith(STAGE) and item != FRESH}
    assert set(training.values()) == {"PASSED"}, training
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{STAGE} @ step_{step}, rank0"))
    assert re.match(r"rollout engine precision_cpu \S+: its log-probs of the pinned responses", lines[at - 1]), out
    end = next((i for i in range(at + 1, len(lines)) if " @ step_" in lines[i]), len(lines))
    verdict = "\n".join(lines[at:end])
    assert re.search(r"first divergence\s+Stage\.rollout_log_probs\.\d+\.forward", verdict), verdict
    assert re.search(r"largest\s+Stage\.(log_prob_mismatch\.\d+|rollout_corr_\w+\.0)\.forward", verdict), verdict
    return verdict


@pytest.mark.slow
def test_e2e_logits_in_bf16_fail_the_engines_stage_at_their_step_and_no_training_item(
    planted_run: tuple[dict[str, str], str, Path],
) -> None:
    """``engine_logits_bf16`` at step 1: the engine's log-probs lose float32's precision (its first divergence is a
    bfloat16 number); the mismatch moves too."""
    verdict = _engine_plant_fails_its_step_alone(planted_run, 1)
    first = re.search(r"first divergence\s+\S+\s+Max \S+ -> (\S+) ", verdict)
    assert first and float(first.group(1)) * 128 == int(float(first.group(1)) * 128), verdict  # 8 bits: -5.28125


@pytest.mark.slow
def test_e2e_a_temperature_applied_twice_fails_the_engines_stage_at_its_step_and_no_training_item(
    planted_run: tuple[dict[str, str], str, Path],
) -> None:
    """``engine_temperature_twice`` at step 2 (temperature 0.8): the engine scores from sharper distributions."""
    _engine_plant_fails_its_step_alone(planted_run, 2)


@pytest.mark.slow
def test_e2e_a_stale_sync_of_one_layer_fails_the_engines_stage_at_its_step_and_no_training_item(
    planted_run: tuple[dict[str, str], str, Path],
) -> None:
    """``engine_stale_layer`` at step 3: the sync before step 3 skips one MLP projection, so the engine scores with
    step 2's weights there. The run's dump names the engine that scored."""
    _engine_plant_fails_its_step_alone(planted_run, 3)
    _, _, example = planted_run
    run = example / ".precision" / "artifacts" / "grpo_pinned_cpu" / "run"
    dump = json.loads((run / "step_3" / STAGE / "step0" / "rank0" / "dump.json").read_text())
    assert dump["rollout_engine"] == {
        "name": "precision_cpu",
        "version": importlib.metadata.version("pytest-precision"),
    }


@pytest.mark.slow
def test_e2e_an_engine_whose_sampled_log_probs_lose_precision_fails_the_fresh_step_naming_the_engine(
    planted_run: tuple[dict[str, str], str, Path],
) -> None:
    """``rollout_logprobs`` at the fresh step: the engine's sampled log-probs rounded through bfloat16 move verl's
    rollout-training mismatch past the bound the recording observed (on the CPU, bitwise reruns: the 5 % floor),
    and the verdict names the engine first. The pinned steps' training items and the metrics of those steps pass
    (the first test of this run asserts that)."""
    outcomes, out, _ = planted_run
    assert outcomes[FRESH] == "FAILED", out[-4000:]
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("fresh_rollout_mismatch @ step_4: "))
    assert lines[at - 1] == "rollout engine precision_cpu: no version of vllm, vllm-ascend, sglang in the run's stack"
    assert re.search(r"training/rollout_probs_diff_max \S+ > \S+ \(recorded 1\.318\d*e-05\)", lines[at]), lines[at]
    assert outcomes["metrics"] == "PASSED"


def test_the_mismatch_rows_are_engine_minus_training_and_the_batch_rows_verls_own_diagnostics() -> None:
    """:func:`engine_scoring.mismatch_dump` of two trajectories (the second with a masked last token): each row's
    ``log_prob_mismatch`` bounds engine minus training over its valid tokens, and ``rollout_corr_kl`` is verl's
    masked mean of that difference (``compute_offpolicy_metrics``). In a subprocess: torch and verl stay out."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    code = """
import json, torch
from precision_harness.runs.verl import engine_scoring
rows = [
    {"responses": torch.tensor([5, 6, 7]), "response_mask": torch.tensor([1, 1, 1]),
     "old_log_probs": torch.tensor([-1.0, -2.0, -3.0])},
    {"responses": torch.tensor([8, 9]), "response_mask": torch.tensor([1, 0]),
     "old_log_probs": torch.tensor([-0.5, -0.25])},
]
engine = [[-1.25, -2.0, -2.5], [-0.25, -9.0]]
data = engine_scoring.mismatch_dump(rows, engine)
print(json.dumps({k: v["output"][0] for k, v in data.items()}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    mismatch = stats["Stage.log_prob_mismatch.0.forward"]
    assert (mismatch["Max"], mismatch["Min"]) == (0.5, -0.25)
    assert stats["Stage.log_prob_mismatch.1.forward"]["shape"] == [1]  # the masked token is not a row's value
    assert stats["Stage.rollout_log_probs.1.forward"]["Max"] == -0.25
    assert stats["Stage.rollout_corr_kl.0.forward"]["Mean"] == pytest.approx((-0.25 + 0 + 0.5 + 0.25) / 4)
    assert stats["Stage.rollout_corr_kl.0.forward"]["dtype"] == "torch.float64"
