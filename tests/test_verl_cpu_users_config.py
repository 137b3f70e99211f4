"""verl's trainer as users run it, on the CPU (issue 28): ``examples/verl_cpu/scenarios/grpo_dp2_bf16_cpu.yaml``.

Two ranks (FSDP2 over gloo), verl's default bf16 mixed precision, rollouts sampled from the policy by
the gate's CPU rollout server (``precision_harness.runs.verl.cpu.policy_server``), the actor's weights
synced into it every step through verl's ``update_weights``, rollout correction on. What is here:

- the scenario's bad input (ranks the machine cannot run; the CPU-only checks on another device);
- the rollout server's sampling and the GPU's autocast lists, run in subprocesses (the pytest
  process never imports torch);
- the committed golden holds a real training signal (read as JSON, no run);
- end to end (slow, minutes): five planted regressions, each failing the item it should and
  nothing earlier in the step's pipeline, and a run that fails mid-way leaving no process behind. Each plant
  is one verl run, only as far as it needs (``-k``: step 1, or step 2 for the weights not synced), checked
  without the L1 localisation and the judgement's rerun (``--precision-localize off``, ``--precision-judgement
  off``) where it reads which item fails, not the API inside it; the advantages plant shows verl run to the
  selected step and localised at L1 (its second run).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness_testing import has_cpu_flag, hooks_env, left_behind

from precision_harness.errors import ScenarioError
from precision_harness.runs import kind_runners
from precision_harness.runs.host.machine import cpu_fingerprint
from precision_harness.runs.verl import engine as verl_engine

#: these tests run examples/verl_cpu where it stands (its .precision/ and the processes a run leaves): one xdist
#: worker runs them all, one at a time
pytestmark = pytest.mark.xdist_group("verl_cpu_example")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "verl_cpu"
SCENARIO = EXAMPLE / "scenarios" / "grpo_dp2_bf16_cpu.yaml"
GOLDEN = EXAMPLE / "golden" / "grpo_dp2_bf16_cpu" / "cpu"
STEPS = (1, 2, 3)
#: a step's items in the order the trainer produces what they check: the sync before the rollout, the
#: rollout, the log-prob stages, the parity of their log-probs, the update
PIPELINE = (
    "weight_sync",
    "rollout_generate",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "rollout_log_prob_parity",
    "actor_update",
)


def _scenario():
    from precision_harness.scenarios.scenario import Scenario

    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    return Scenario.load(SCENARIO)


# --- bad input ----------------------------------------------------------------------------------------------


def test_more_ranks_than_the_machine_runs_is_one_line_naming_the_key_and_the_limit() -> None:
    with pytest.raises(ScenarioError) as err:
        verl_engine.cpu_ranks(SCENARIO, {"trainer.n_gpus_per_node": 4}, limit=2)
    text = str(err.value)
    assert text.count("\n") == 0
    assert "trainer.n_gpus_per_node: 4 ranks on cpu, but this machine runs at most 2" in text
    assert verl_engine.cpu_ranks(SCENARIO, {"trainer.n_gpus_per_node": 2}, limit=2) == 2
    assert verl_engine.cpu_ranks(SCENARIO, {}, limit=2) == 1  # verl's default (8) is not what a CPU runs


@pytest.mark.parametrize("ranks", [0, "2", True])
def test_ranks_that_are_not_a_positive_integer_are_one_line(ranks: object) -> None:
    with pytest.raises(ScenarioError, match=r"trainer.n_gpus_per_node: expected a positive integer$"):
        verl_engine.cpu_ranks(SCENARIO, {"trainer.n_gpus_per_node": ranks}, limit=2)


def test_the_cpu_only_checks_are_refused_on_another_device_in_one_line(tmp_path: Path) -> None:
    """weight_sync and rollout_generate read what the gate's CPU rollout server records: on cuda, one line."""
    scenario = _scenario()
    with pytest.raises(ScenarioError) as err:
        kind_runners.command_spec(scenario, tmp_path, device="cuda")
    text = str(err.value)
    assert text.count("\n") == 0 and "'rollout_generate' on cuda" in text and "--precision-device cpu" in text
    scenario.config["global_profiler"]["global_tool_config"]["precision_debugger"]["stages"].remove("rollout_generate")
    with pytest.raises(ScenarioError) as err:
        kind_runners.command_spec(scenario, tmp_path, device="npu")
    assert "invariants.weight_sync: verl's rollout engines record no per-parameter digests on npu" in str(err.value)


def test_a_command_scenario_still_cannot_declare_weight_sync(tmp_path: Path) -> None:
    from precision_harness.scenarios.scenario import Scenario

    path = tmp_path / "c.yaml"
    path.write_text(
        "command: [python, train.py]\ninvariants: {weight_sync: exact}\n"
        "global_profiler:\n  steps: [1]\n  global_tool_config:\n    precision_debugger: {stages: [actor_update]}\n"
    )
    with pytest.raises(ScenarioError, match=r"invariants\.weight_sync: a command scenario's weight sync happens"):
        Scenario.load(path)


# --- the rollout server, the autocast lists, the batch order (torch in subprocesses) ------------------------


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_a_request_samples_the_same_tokens_from_its_seed_whatever_ran_before() -> None:
    """One seed, one response: the same tokens and log-probs after other requests or on its own; another seed
    samples others; one log-prob per token, the log of the processed distribution's probability."""
    code = """
import json, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from precision_harness.runs.verl.cpu.policy_server import sample_response, request_seed
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2)).to(torch.bfloat16).eval()
params = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "max_tokens": 12}
seed = request_seed(42, index=3, step=1, sample=0)
a = sample_response(model, [1, 2, 3], params, seed=seed, eos=set())
sample_response(model, [5, 6], params, seed=7, eos=set())
b = sample_response(model, [1, 2, 3], params, seed=seed, eos=set())
c = sample_response(model, [1, 2, 3], params, seed=request_seed(42, index=3, step=1, sample=1), eos=set())
eos = sample_response(model, [1, 2, 3], params, seed=seed, eos={a[0][2]})
print(json.dumps([a == b, a[0] != c[0], len(a[0]) == len(a[1]) == 12, all(lp < 0 for lp in a[1]), eos[0]]))
"""
    same, differs, lengths, negative, stopped = json.loads(_python(code))
    assert same and differs and lengths and negative
    assert len(stopped) == 3  # stopped after the EOS id, which it keeps


def test_top_k_and_top_p_remove_tokens_as_vllm_does() -> None:
    code = """
import json, torch
from precision_harness.runs.verl.cpu.policy_server import processed_logits
x = torch.tensor([4.0, 3.0, 2.0, 1.0])
k = processed_logits(x, {"temperature": 1.0, "top_k": 2})
p = processed_logits(x, {"temperature": 1.0, "top_p": 0.8})
t = processed_logits(x, {"temperature": 2.0})
print(json.dumps([torch.isinf(k).tolist(), torch.isinf(p).tolist(), t.tolist()]))
"""
    top_k, top_p, tempered = json.loads(_python(code))
    assert top_k == [False, False, True, True]
    assert top_p == [False, False, True, True]  # softmax 0.64, 0.24 (0.88 >= 0.8), then cut
    assert tempered == [2.0, 1.5, 1.0, 0.5]


def test_cpu_autocast_takes_the_gpus_float32_ops() -> None:
    """Under bf16 autocast: log_softmax, logsumexp, softmax, exp and sum give float32 (as on a GPU), linear stays
    bf16, an explicit dtype is honoured, and log_softmax's values are float32 log_softmax of the bf16 input."""
    code = """
import json, torch
from precision_harness.runs.verl.cpu import autocast_policy
autocast_policy.install()
x = torch.randn(3, 40).to(torch.bfloat16)
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = [torch.log_softmax(x, -1), torch.logsumexp(x, -1), torch.softmax(x, -1), x.exp(), x.sum(),
           torch.nn.Linear(40, 4)(x.float()), x.sum(-1, dtype=torch.bfloat16)]
    same = torch.equal(out[0], torch.log_softmax(x.float(), -1))
print(json.dumps([str(t.dtype) for t in out] + [same]))
"""
    result = json.loads(_python(code))
    assert result[:5] == ["torch.float32"] * 5
    assert result[5:] == ["torch.bfloat16", "torch.bfloat16", True]


def test_batches_come_in_prompt_then_sample_order_whatever_the_arrival() -> None:
    code = """
import json
from precision_harness.runs.verl.cpu.sampler import order
keys = ["u9_1_0", "u2_0_0", "u9_0_0", "u2_1_0"]
indices = [5, 3, 5, 3]
print(json.dumps([keys[i] for i in order(keys, indices)]))
"""
    assert json.loads(_python(code)) == ["u2_0_0", "u2_1_0", "u9_0_0", "u9_1_0"]


# --- the committed golden: a real training signal (JSON, no run) ---------------------------------------------


def _golden():
    from precision_harness.goldens.golden import Golden

    return Golden.from_dir(GOLDEN)


def _metrics(golden) -> dict[int, dict]:
    return {m["training/global_step"]: m for m in golden.metrics()}


def test_the_golden_holds_both_ranks_at_every_stage_and_step_at_both_levels() -> None:
    """``level: auto``: the L0 dump with the stage's inputs and outputs from verl's batch, and the L1 record."""
    golden = _golden()
    assert golden.level == "auto" and golden.localizes
    record = golden.localization()
    for step in STEPS:
        for stage in ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update"):
            for rank in ("rank0", "rank1"):
                l0 = golden.load_dump(step, stage, rank)["data"]
                assert any(k.startswith("Module.") for k in l0) and any(k.startswith("Stage.") for k in l0)
                assert not any(k.startswith(("Functional.", "Tensor.")) for k in l0), (step, stage, rank)
                assert any(k.startswith("Functional.") for k in record.load_dump(step, stage, rank)["data"])
        assert golden.load_dump(step, "rollout_generate", "rank0")["data"]
    rows = [k for k in golden.load_dump(1, "actor_update", "rank1")["data"] if k.startswith("Stage.")]
    assert rows[:4] == [f"Stage.{n}.0.forward" for n in ("old_log_probs", "advantages", "ref_log_prob")] + [
        "Stage.rollout_is_weights.0.forward"
    ]
    assert {"Stage.loss.1.forward", "Stage.kl_loss.1.forward", "Stage.grad_norm.0.forward"} <= set(rows)


def test_the_golden_trained_in_bf16_with_a_real_signal_every_step() -> None:
    """Rewards vary, the advantages are not 0, there is a policy loss and a gradient; the actor computes in bf16
    and its weights move from step to step on both ranks."""
    golden = _golden()
    metrics = _metrics(golden)
    assert sorted(metrics) == list(STEPS)
    for step, m in metrics.items():
        assert m["critic/score/min"] < m["critic/score/max"], step
        assert m["critic/advantages/min"] < 0 < m["critic/advantages/max"], step
        assert m["actor/grad_norm"] > 0, step
    for rank in ("rank0", "rank1"):
        rows = [golden.localization().load_dump(step, "actor_compute_log_prob", rank)["data"] for step in STEPS]
        linear = [k for k in rows[0] if k.startswith("Functional.linear.")]
        assert linear and all(rows[0][k]["input_args"][1]["dtype"] == "torch.bfloat16" for k in linear)
        for before, after in itertools.pairwise(rows):
            assert all(before[k]["input_args"][1] != after[k]["input_args"][1] for k in linear), rank


def test_rollout_correction_measured_a_real_mismatch_and_the_rollouts_follow_the_policy() -> None:
    """The rollout's log-probs (its own split-K kernels) differ from the training forward's by a little, never
    0: rollout_corr/* and the probability differences are small and non-zero; the sampled tokens differ
    between the samples of a prompt and from step to step."""
    from precision_harness.dumps.sampled_tokens import SAMPLED_TOKENS

    golden = _golden()
    for step, m in _metrics(golden).items():
        assert 0 < m["training/rollout_probs_diff_max"] < 1e-4, step
        assert m["rollout_corr/rollout_is_max"] > 1 > m["rollout_corr/rollout_is_min"], step
        assert m["rollout_corr/log_ppl_abs_diff"] > 0, step
    tokens = [
        json.loads(golden.read(f"step_{s}/rollout_generate/step0/rank0/{SAMPLED_TOKENS}"))["responses"] for s in STEPS
    ]
    assert all(len(rows) == 16 for rows in tokens)  # 4 prompts x 4 samples
    assert all(len({tuple(r) for r in rows[:4]}) == 4 for rows in tokens)
    assert tokens[0] != tokens[1] != tokens[2]


# --- end to end: planted regressions (verl's real trainer, about a minute each on 2 cores) -------------------


def _outcomes(stdout: str) -> dict[str, str]:
    """``{item: PASSED|FAILED|ERROR}`` from a ``pytest -v`` run's output."""
    return dict(re.findall(r"::(\S+) (PASSED|FAILED|ERROR)", stdout))


def _check(steps: int | None, **plants: str) -> tuple[dict[str, str], str]:
    """Check the scenario from the example's folder with ``plants`` in every process, its items of steps 1 to
    ``steps`` selected (verl then runs only that far: None, the whole run and the metrics item): ``{item:
    outcome}``, stdout. No L1 localisation and no judgement rerun (``--precision-localize off``,
    ``--precision-judgement off``): each would cost a further verl run, and these plants read where a stage fails,
    not the API inside it (the advantages plant below shows verl's localisation)."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    select = ["-k", " or ".join(f"step_{step}" for step in range(1, steps + 1))] if steps else []
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            str(SCENARIO.relative_to(EXAMPLE)),
            "--precision-localize",
            "off",
            "--precision-judgement",
            "off",
            *select,
        ],
        cwd=EXAMPLE,
        env={**os.environ, **hooks_env(**plants)},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    outcomes = _outcomes(proc.stdout)
    assert len(outcomes) == (steps * len(PIPELINE) if steps else 19), proc.stdout[-4000:]
    if steps:
        assert f"grpo_dp2_bf16_cpu: run to step {steps} of 3, as selected" in proc.stdout, proc.stdout[-4000:]
    assert "localiz" not in proc.stdout, proc.stdout[-4000:]
    assert not left_behind(EXAMPLE / ".precision")
    return outcomes, proc.stdout


def _first_failure(outcomes: dict[str, str]) -> str:
    """The first failing item in the pipeline's order (steps, then :data:`PIPELINE`; ``metrics`` last)."""
    order = [f"{item}[step_{step}]" for step in STEPS for item in PIPELINE] + ["metrics"]
    failed = [item for item in order if outcomes.get(item, "PASSED") != "PASSED"]
    assert failed, "nothing failed"
    return failed[0]


@pytest.fixture(scope="module")
def rank_and_sync_run() -> tuple[dict[str, str], str]:
    """One verl run, to step 2, serving two plants that touch disjoint things: rank 1's loss scaled by 1+1e-3
    (its gradient before the reduce-scatter: actor_update of step 1 on) and the rollout ignoring the weight sync
    after step 1's update (tests/hooks). weight_sync is the run's own invariant, the rollout's weights against the
    actor's after the sync (no golden): a perturbed update moves both sides alike, a skipped sync only the rollout."""
    return _check(2, PRECISION_TEST_PERTURB_RANK="1", PRECISION_TEST_PLANT="rollout_stale_weights")


def _failed(outcomes: dict[str, str], step: int) -> set[str]:
    return {item for item, outcome in outcomes.items() if item.endswith(f"[step_{step}]") and outcome != "PASSED"}


def _verdict(out: str, head: str) -> str:
    """The verdict that starts with the line starting ``head``, up to the next item's (`` @ step_``)."""
    lines = out[out.index(head) :].splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if " @ step_" in line), len(lines))
    return "\n".join(lines[:end])


@pytest.mark.slow
def test_e2e_one_ranks_gradient_perturbed_before_the_reduction_fails_actor_update_naming_that_rank(
    rank_and_sync_run: tuple[dict[str, str], str],
) -> None:
    """Rank 1's gradient perturbed: of step 1, actor_update alone fails, its verdict naming rank 1 (the skipped
    sync comes after step 1's update)."""
    outcomes, out = rank_and_sync_run
    assert _failed(outcomes, 1) == {"actor_update[step_1]"}, out[-4000:]
    verdict = _verdict(out, "actor_update @ step_1, rank1 ")
    assert re.search(r"actor_update @ step_1, rank1 .*statistics beyond tolerance", verdict), verdict
    assert re.search(r"first divergence\s+rank1", verdict), verdict


@pytest.mark.slow
def test_e2e_the_rollouts_log_probs_shifted_fail_rollout_generate_and_the_parity() -> None:
    """The rollout returns its log-probs rounded through bf16 (a rollout kernel change); the tokens stay. Step 1
    shows it: rollout_generate fails first, and the parity bound on verl's own rollout_probs_diff metrics."""
    outcomes, out = _check(1, PRECISION_TEST_PLANT="rollout_logprobs")
    assert _first_failure(outcomes) == "rollout_generate[step_1]"
    assert outcomes["rollout_log_prob_parity[step_1]"] == "FAILED"
    assert "changed token" not in out  # the same tokens: the statistics of their log-probs moved
    assert re.search(r"training/rollout_probs_diff_m\w+ \S+ > ", out), out[-4000:]


@pytest.mark.slow
def test_e2e_weights_not_synced_at_step_2_fail_weight_sync_at_step_2(
    rank_and_sync_run: tuple[dict[str, str], str],
) -> None:
    """The rollout ignores the sync after step 1's update and samples step 2 from step 1's weights: weight_sync of
    step 1 passes, and step 2's first failing item is its weight_sync, naming the parameters."""
    outcomes, out = rank_and_sync_run
    assert outcomes["weight_sync[step_1]"] == "PASSED"
    assert _first_failure({k: v for k, v in outcomes.items() if k.endswith("[step_2]")}) == "weight_sync[step_2]"
    assert re.search(r"weight_sync @ step_2: .*model\.\S+", out), out[-4000:]


@pytest.mark.slow
def test_e2e_a_norm_without_its_fp32_upcast_fails_the_first_forward_stage_of_step_1() -> None:
    """Qwen2's RMSNorm with its variance rounded to bf16, in every process: the rollout's forward, the first of
    step 1, fails first (step 1 selected)."""
    outcomes, _ = _check(1, PRECISION_TEST_PLANT="norm_precision")
    assert _first_failure(outcomes) == "rollout_generate[step_1]"
    assert outcomes["actor_compute_log_prob[step_1]"] == "FAILED"


@pytest.mark.slow
def test_e2e_a_two_rank_run_that_fails_midway_leaves_no_process_behind() -> None:
    """A plant site no hook knows makes every patched model forward raise: the run fails in its workers after
    Ray, TransferQueue and both ranks started; the verdict is one line and nothing is left running."""
    outcomes, out = _check(None, PRECISION_TEST_PLANT="no_such_site")
    assert set(outcomes.values()) == {"FAILED"}
    assert re.search(r"grpo_dp2_bf16_cpu\.yaml: command exited with \d+; last lines:", out), out[-3000:]


@pytest.mark.slow
@pytest.mark.xdist_group("verl_advantages")  # a copy of the example: beside the runs where it stands, not after them
def test_e2e_verls_advantages_scaled_read_upstream_of_actor_update_and_not_the_cpu(tmp_path: Path) -> None:
    """verl's GRPO advantages x (1 + 1e-4) in every verl process (tests/hooks ``advantages``), checked against a
    copy of the golden whose manifest says it was recorded on another CPU, step 1's items selected. The rollout and
    the log-prob stages of step 1 pass; actor_update[step_1] fails, and its verdict leads with where the change
    entered, upstream of actor_update (its input, the advantages, is the first value that differs: at level auto
    the stage input Stage.advantages, invisible to its L0 dump, and in its rerun to step 1 at L1, the localisation,
    the loss's input, the first API of the update the advantages moved). The environment's line comes first, as in
    every failing item, and says it does not explain the drift alone: the run's other stage dumps are bit-identical
    to their goldens on this machine. No replay: nothing to judge at an API. (Issue 31's level-auto plant and
    issue 52's verdict order, one verl run and its localisation.)
    """
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    example = tmp_path / "verl_cpu"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns(".precision", "__pycache__"))
    manifest_path = example / "golden" / "grpo_dp2_bf16_cpu" / "cpu" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["env"].update(
        cpu_vendor="GenuineIntel", cpu_model="Intel Xeon Platinum 8480+", cpu_flags="avx2 fma amx_bf16"
    )
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    select = ["-k", "step_1", "--junitxml", "junit.xml", "--precision-report", "rep"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "scenarios/grpo_dp2_bf16_cpu.yaml", *select],
        cwd=example,
        env={**os.environ, **hooks_env(PRECISION_TEST_PLANT="advantages")},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    out = proc.stdout
    assert "grpo_dp2_bf16_cpu: run to step 1 of 3, as selected" in out, out[-4000:]
    outcomes = _outcomes(out)
    failed = {item for item, outcome in outcomes.items() if outcome != "PASSED"}
    assert failed == {"actor_update[step_1]"}, out[-4000:]
    passed = {f"{item}[step_1]" for item in PIPELINE if item != "actor_update"}
    assert passed <= set(outcomes), out[-4000:]
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("actor_update @ step_1, rank0 ("))
    assert lines[head + 1].startswith("  environment differs"), out[-4000:]
    # level auto: the L0 verdict's first differing value is the stage input the gate takes from verl's batch
    assert lines[head + 2].startswith(
        "  change entered    the change is upstream of actor_update: its input Stage.advantages.0.forward.input.0 "
        "is the first value that differs"
    ), out[-4000:]
    assert re.search(r"first divergence\s+rank\d\s+Stage\.advantages\.0\.forward\.input\.0", out), out[-4000:]
    # and its L1 localisation names the first API input that differs: the advantages entering the loss
    localized = next(i for i, line in enumerate(lines) if line.startswith("  localized at L1 (rerun to step_1, "))
    entered = next(line for line in lines[localized + 1 : localized + 6] if line.startswith("    change entered "))
    assert entered.startswith(
        "    change entered    the change is upstream of actor_update: its input Tensor.__mul__.23.forward.input.0 "
        "is the first value that differs"
    ), out[-4000:]
    first_at_l1 = re.search(
        r"localized at L1 \(rerun to step_1, [0-9.]+ s\):\n(.*\n){0,2}.*first divergence\s+(?:rank\d\s+)?(\S+)", out
    )
    assert first_at_l1 and not first_at_l1.group(2).startswith("Stage."), out[-4000:]
    verdict = lines[head : next(i for i in range(head, len(lines)) if lines[i].startswith("  rerun "))]
    environment = next(i for i, line in enumerate(verdict) if line.startswith("  environment differs"))
    assert environment == 1 < next(i for i, line in enumerate(verdict) if line.startswith("  first divergence "))
    # the run side is whatever CPU this is (CI's changes between runs): its model, and amx_bf16 on the golden's side
    # only where this one lacks it
    golden_side = "Intel Xeon Platinum 8480+" + ("" if has_cpu_flag("amx_bf16") else " (amx_bf16)")
    assert f"CPU {golden_side} -> {cpu_fingerprint()['cpu_model']}" in verdict[environment], verdict[environment]
    assert re.search(
        r"alone it does not explain this drift: \d+ other stage dump\(s\) of this run are identical",
        verdict[environment],
    )
    assert not any(line.startswith("  judgement ") for line in verdict)
    records = json.loads((example / "rep" / "report.json").read_text())["items"]
    (record,) = [r for r in records if r["nodeid"].endswith("::actor_update[step_1]")]
    assert record["origin"]["kind"] == "upstream" and record["judgement"] is None
    assert not (example / ".precision" / "artifacts" / "grpo_dp2_bf16_cpu" / "judge").exists()
    assert not left_behind(example / ".precision")
