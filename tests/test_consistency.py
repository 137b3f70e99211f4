"""Training against rollout (precision_harness.check.tolerance.consistency): the ``invariants:`` key, its items,
planted faults.

Each planted fault (tests/hooks/precision_test_hooks.py) must fail the check that catches it, naming
the parameter or the token; an unplanted run passes every check.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path

import pytest
from harness_testing import base_data, hooks_env, make_project, run_cli, run_pytest, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.item_key import ItemKey
from precision_harness.check.tolerance import consistency
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import check_items
from precision_harness.dumps import sampled_tokens
from precision_harness.dumps.dump_index import INDEX
from precision_harness.errors import ScenarioError
from precision_harness.goldens.golden import Golden
from precision_harness.scenarios import invariant_declarations
from precision_harness.scenarios.scenario import Scenario

STAGES_KEY = "global_profiler.global_tool_config.precision_debugger.stages"
SCENARIO = """\
description: rollout consistency, GRPO n=2, 2 layers, 2 steps
seed: 3
model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1}
data: {train_batch_size: 2, max_prompt_length: 10, max_response_length: 4}
trainer: {total_training_steps: 2}
actor_rollout_ref:
  actor: {ppo_mini_batch_size: 1, ppo_micro_batch_size_per_gpu: 2, optim: {lr: 1.0e-3}}
  rollout: {n: 2, log_prob_mode: recompute}
algorithm: {adv_estimator: grpo}
global_profiler:
  steps: [1]
  global_tool_config: {precision_debugger: {stages: [actor_compute_log_prob], strict: true, level: L0}}
invariants:
  weight_sync: exact
  rollout_log_prob_parity: exact
"""


def _items(project: Path, *, plant: str | None = None) -> dict[str, dict]:
    """Record the golden (invariant items check in update mode too); the items by name, e.g. ``metrics``."""
    env = hooks_env(PRECISION_TEST_PLANT=plant) if plant else None
    proc = run_pytest(project, "--precision-golden", "update", "--precision-report", "rep", env=env)
    report = json.loads((project / "rep" / "report.json").read_text())
    items = {i["nodeid"].rsplit("::", 1)[-1]: i for i in report["items"]}
    assert items, proc.stdout + proc.stderr
    return {**items, "_stdout": {"text": proc.stdout}}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "p", SCENARIO, name="consistency")


def test_unchanged_run_passes_every_check(project: Path) -> None:
    items = _items(project)
    names = sorted(n for n in items if n != "_stdout")
    assert names == sorted(
        [
            "actor_compute_log_prob[step_1]",
            "weight_sync[step_1]",
            "rollout_log_prob_parity[step_1]",
            "weight_sync[step_2]",
            "rollout_log_prob_parity[step_2]",
            "metrics",
        ]
    )
    assert all(items[n]["passed"] for n in names), items["_stdout"]["text"]
    assert "parameters bit-identical to the actor's cast to float32" in items["weight_sync[step_2]"]["text"]
    assert "bit for bit" in items["rollout_log_prob_parity[step_2]"]["text"]


def test_sync_skipping_one_layer_fails_weight_sync_naming_it(project: Path) -> None:
    items = _items(project, plant="weight_sync")
    assert items["weight_sync[step_1]"]["passed"]  # step 1's rollout starts from the same weights
    text = items["weight_sync[step_2]"]["text"]
    assert not items["weight_sync[step_2]"]["passed"]
    assert text.startswith("weight_sync @ step_2: model.layers.1.mlp.up_proj.weight: "), text
    assert "first of 1 of" in text
    assert text in items["_stdout"]["text"]  # the item's failure is the verdict line


def test_rollout_temperature_off_by_1e_6_fails_log_prob_parity_naming_the_token(project: Path) -> None:
    items = _items(project, plant="rollout_temperature")
    assert items["weight_sync[step_1]"]["passed"] and items["weight_sync[step_2]"]["passed"]
    parity = items["rollout_log_prob_parity[step_1]"]
    assert not parity["passed"]
    assert parity["text"].startswith("rollout_log_prob_parity @ step_1: sample 0 position 0: rollout_log_prob ")
    assert "log_prob_mode: recompute" in parity["text"]


def test_bf16_cast_of_the_rollout_lm_head_fails_weight_sync_naming_it(project: Path) -> None:
    items = _items(project, plant="rollout_lm_head")
    text = items["weight_sync[step_1]"]["text"]
    assert not items["weight_sync[step_1]"]["passed"]
    assert text.startswith("weight_sync @ step_1: lm_head.weight: the rollout holds other values"), text


# ------------------------------------------------------------------------------ bounded (no run)
def _log_probs(run: Path, step: int, rollout: list[list[float]], old: list[list[float]]) -> None:
    (run / f"step_{step}").mkdir(parents=True, exist_ok=True)
    mask = [[1 if v else 0 for v in row] for row in old]
    data = {"response_mask": mask, "rollout_log_probs": rollout, "old_log_probs": old}
    (run / f"step_{step}" / "log_probs.json").write_text(json.dumps(data))


def test_bounds_report_the_measured_value_and_fail_past_it(tmp_path: Path) -> None:
    _log_probs(tmp_path, 1, [[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], [[-1.0, -2.1, 0.0], [-0.5, -0.5, -0.25]])
    loose = invariant_declarations.parse(
        {"rollout_log_prob_parity": {"max_abs": 0.5, "token_mult_prob_error_median": 1.1}},
        source="s.yaml",
        kind="builtin",
        records_rollout=True,
    )
    verdict = consistency.check(tmp_path, 1, "rollout_log_prob_parity", loose)
    assert verdict.passed and "max_abs 0.25 <= 0.5" in verdict.text, verdict.text
    tight = invariant_declarations.parse(
        {"rollout_log_prob_parity": {"max_abs": 0.2}}, source="s.yaml", kind="builtin", records_rollout=True
    )
    verdict = consistency.check(tmp_path, 1, "rollout_log_prob_parity", tight)
    assert not verdict.passed and verdict.text == "rollout_log_prob_parity @ step_1: max_abs 0.25 > 0.2"


def test_token_mult_prob_error_is_nemo_rls_mean_of_exp_abs_diff() -> None:
    m = consistency.log_prob_measures(
        {
            "response_mask": [[1, 1], [1, 0]],
            "rollout_log_probs": [[0.0, 0.0], [0.0, 0.0]],
            "old_log_probs": [[0.1, 0.3], [0.2, 0.0]],
        }
    )
    assert m["max_abs"] == pytest.approx(0.3)
    assert m["token_mult_prob_error"] == pytest.approx(sum(map(math.exp, (0.1, 0.3, 0.2))) / 3)
    per_seq = [(math.exp(0.1) + math.exp(0.3)) / 2, math.exp(0.2)]
    assert m["token_mult_prob_error_median"] == pytest.approx(sum(per_seq) / 2)


def test_command_scenario_bounds_verl_metrics_from_metrics_jsonl(tmp_path: Path) -> None:
    rows = [{"step": 1, "training/rollout_probs_diff_max": 0.004}, {"step": 2, "training/rollout_probs_diff_max": 0.03}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    inv = invariant_declarations.parse(
        {"rollout_log_prob_parity": {"training/rollout_probs_diff_max": 1.0e-2}},
        source="v.yaml",
        kind="verl",
        records_rollout=False,
    )
    assert consistency.check(tmp_path, 1, "rollout_log_prob_parity", inv).passed
    verdict = consistency.check(tmp_path, 2, "rollout_log_prob_parity", inv)
    assert not verdict.passed
    assert verdict.text == "rollout_log_prob_parity @ step_2: training/rollout_probs_diff_max 0.03 > 0.01"


# ------------------------------------------------------------------------------ bad input
def _load(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return Scenario.load(path)


@pytest.mark.parametrize(
    ("invariants", "message"),
    [
        ("  weight_synk: exact\n", "invariants.weight_synk: unknown check; expected one of weight_sync, "),
        (
            "  rollout_log_prob_parity: {max_abs: 1e-2}\n",
            "invariants.rollout_log_prob_parity.max_abs: expected a "
            "finite number, got '1e-2' (YAML reads 1e-2 as text: write 1.0e-2)",
        ),
        ("  rollout_log_prob_parity: {max_abs: true}\n", "rollout_log_prob_parity.max_abs: expected a finite number"),
        ("  rollout_log_prob_parity: {max_diff: 0.1}\n", "invariants.rollout_log_prob_parity.max_diff: unknown bound"),
        ("  rollout_log_prob_parity: close\n", "invariants.rollout_log_prob_parity: expected exact or a mapping"),
        ("  weight_sync: true\n", "invariants.weight_sync: expected exact, got True"),
    ],
)
def test_bad_invariants_are_one_line_naming_file_and_key(tmp_path: Path, invariants: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _load(tmp_path, SCENARIO.split("invariants:")[0] + "invariants:\n" + invariants)
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(tmp_path / "bad.yaml") + ": ") and message in text, text


COMMAND = """\
command: [python, train.py]
global_profiler:
  steps: [1]
  global_tool_config: {precision_debugger: {stages: [actor_update]}}
invariants:
"""


@pytest.mark.parametrize(
    ("invariants", "message"),
    [
        ("  weight_sync: exact\n", "invariants.weight_sync: a command scenario's weight sync happens in its own code"),
        ("  rollout_log_prob_parity: exact\n", "invariants.rollout_log_prob_parity: exact needs the per-token"),
        ("  rollout_log_prob_parity: {max_abs: 0.1}\n", "max_abs: unknown bound; expected one of mismatch/<metric>"),
    ],
)
def test_command_scenario_refuses_what_verl_does_not_record(tmp_path: Path, invariants: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _load(tmp_path, COMMAND + invariants)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_invariants_stay_out_of_the_scenario_hash(tmp_path: Path) -> None:
    with_checks = _load(tmp_path, SCENARIO)
    without = _load(tmp_path, SCENARIO.split("invariants:")[0])
    assert with_checks.hash == without.hash and with_checks.invariants.names == (
        "weight_sync",
        "rollout_log_prob_parity",
    )


# ------------------------------------------------------------------------------ rollout_generate
def _generate_stage(root: Path, step: int, responses: list[list[int]], linear_max: float) -> None:
    data = base_data()
    data["Functional.linear.0.forward"]["output"][0]["Max"] = linear_max
    stage = root / f"step_{step}" / "rollout_generate"
    write_dump(stage, data)
    (stage / "step0" / "rank0" / sampled_tokens.SAMPLED_TOKENS).write_text(sampled_tokens.payload(responses))


def test_changed_token_is_the_rollout_generate_verdict_before_any_statistic(tmp_path: Path) -> None:
    recorded = [[1, 2, 3, 4, 5, 6, 7, 8]] * 3 + [[9, 9, 9, 9, 9, 17, 9, 9]]
    sampled = [row[:] for row in recorded]
    sampled[3][5] = 42
    sampled[3][6:] = [1, 2]
    sampled[2][7] = 0
    _generate_stage(tmp_path / "golden", 2, recorded, linear_max=3.0)
    _generate_stage(tmp_path / "run", 2, sampled, linear_max=30.0)  # statistics drift as well
    golden = Golden.from_run_dir(tmp_path / "golden")
    settings = CheckSettings(scenario="s", policy=TolerancePolicy(), msprobe=False)
    [(_, out)] = check_items(tmp_path / "run", golden, [ItemKey(2, "rollout_generate")], settings)
    assert not out.passed
    first, *statistics = out.text.splitlines()
    # row-major: sample 2 position 7 comes before sample 3 position 5
    assert first == "rollout_generate @ step_2: sample 2 position 7: token 8 -> 0 (first of 4 changed tokens)"
    assert "Functional.linear.0.forward" in "\n".join(statistics), out.text  # the statistics follow
    sampled[2][7] = 8
    _generate_stage(tmp_path / "run", 2, sampled, linear_max=30.0)
    [(_, out)] = check_items(tmp_path / "run", golden, [ItemKey(2, "rollout_generate")], settings)
    first = out.text.splitlines()[0]
    assert first == "rollout_generate @ step_2: sample 3 position 5: token 17 -> 42 (first of 3 changed tokens)"


def test_changed_token_fails_the_item_even_with_statistics_within_tolerance(tmp_path: Path) -> None:
    _generate_stage(tmp_path / "golden", 1, [[1, 2], [3, 4]], linear_max=3.0)
    _generate_stage(tmp_path / "run", 1, [[1, 2], [3, 5]], linear_max=3.0)
    settings = CheckSettings(scenario="s", policy=TolerancePolicy(), msprobe=False)
    golden = Golden.from_run_dir(tmp_path / "golden")
    [(_, out)] = check_items(tmp_path / "run", golden, [ItemKey(1, "rollout_generate")], settings)
    assert not out.passed
    assert (
        out.text.splitlines()[0]
        == "rollout_generate @ step_1: sample 1 position 1: token 4 -> 5 (first of 1 changed tokens)"
    )


def test_rollout_sampling_change_fails_rollout_generate_with_the_first_changed_token(project: Path) -> None:
    """A real run: the rollout samples at temperature 0.2 instead of 1.0 (tests/hooks ``rollout_sampling``)
    against a golden recorded without it; the item's first line names the token, the statistics follow."""
    path = project / "scenarios" / "consistency.yaml"
    path.write_text(path.read_text().replace("stages: [actor_compute_log_prob]", "stages: [rollout_generate]"))
    assert run_pytest(project, "--precision-golden", "update").returncode == 0
    env = hooks_env(PRECISION_TEST_PLANT="rollout_sampling")
    proc = run_pytest(project, "--precision-report", "rep", env=env)
    items = {
        i["nodeid"].rsplit("::", 1)[-1]: i for i in json.loads((project / "rep" / "report.json").read_text())["items"]
    }
    item = items["rollout_generate[step_1]"]
    assert not item["passed"], proc.stdout
    first, *statistics = item["text"].splitlines()
    golden = Golden.from_dir(project / "golden" / "consistency" / "cpu")
    recorded = json.loads(golden.read("step_1/rollout_generate/step0/rank0/sampled_tokens.json"))["responses"]
    run = (
        project / ".precision" / "artifacts" / "consistency" / "run" / "step_1" / "rollout_generate" / "step0" / "rank0"
    )
    sampled = json.loads((run / "sampled_tokens.json").read_text())["responses"]
    changed = [(i, t) for i, row in enumerate(sampled) for t, tok in enumerate(row) if tok != recorded[i][t]]
    assert changed, "the plant changed no sampled token"
    i, t = changed[0]
    expected = f"rollout_generate @ step_1: sample {i} position {t}: token {recorded[i][t]} -> {sampled[i][t]} "
    assert first == expected + f"(first of {len(changed)} changed tokens)", item["text"]
    assert statistics and "statistics" in "\n".join(statistics), item["text"]
    verdict = project / ".precision" / "artifacts" / "consistency" / "step_1" / "rollout_generate" / "verdict.txt"
    assert verdict.read_text().splitlines()[0] == first
    # sampling alone changed: the weights and the recomputed log-probs still agree with the actor
    assert all(items[n]["passed"] for n in items if n.startswith(("weight_sync", "rollout_log_prob_parity")))


def test_same_tokens_leave_the_verdict_to_the_statistics(tmp_path: Path) -> None:
    tokens = [[1, 2], [3, 4]]
    _generate_stage(tmp_path / "golden", 1, tokens, linear_max=3.0)
    _generate_stage(tmp_path / "run", 1, tokens, linear_max=30.0)
    settings = CheckSettings(scenario="s", policy=TolerancePolicy(), msprobe=False)
    [(_, out)] = check_items(
        tmp_path / "run", Golden.from_run_dir(tmp_path / "golden"), [ItemKey(1, "rollout_generate")], settings
    )
    assert not out.passed and "token" not in out.text.splitlines()[0] and "Functional.linear.0.forward" in out.text


def test_rollout_generate_is_opt_in_and_refused_on_command_scenarios(tmp_path: Path) -> None:
    assert "rollout_generate" not in _load(tmp_path, SCENARIO).stages
    with pytest.raises(ScenarioError) as err:
        command = COMMAND.split("invariants:")[0]
        _load(tmp_path, command.replace("stages: [actor_update]", "stages: [rollout_generate, actor_update]"))
    text = str(err.value)
    assert "\n" not in text and "rollout_generate is not dumped by verl" in text, text


def test_rollout_generate_run_records_its_tokens_and_passes_unchanged(project: Path) -> None:
    path = project / "scenarios" / "consistency.yaml"
    path.write_text(path.read_text().replace("stages: [actor_compute_log_prob]", "stages: [rollout_generate]"))
    assert run_pytest(project, "--precision-golden", "update").returncode == 0
    golden = Golden.from_dir(project / "golden" / "consistency" / "cpu")
    tokens = json.loads(golden.read("step_1/rollout_generate/step0/rank0/sampled_tokens.json"))
    assert len(tokens["responses"]) == 4 and all(len(row) == 4 for row in tokens["responses"])
    proc = run_pytest(project, "-k", "rollout_generate")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout


def test_rollout_generate_at_level_auto_keeps_rollout_log_probs_in_its_stage_outputs(project: Path) -> None:
    path = project / "scenarios" / "consistency.yaml"
    text = path.read_text().replace("stages: [actor_compute_log_prob]", "stages: [rollout_generate]")
    path.write_text(text.replace("level: L0", "level: auto"))
    assert run_pytest(project, "--precision-golden", "update").returncode == 0
    golden = Golden.from_dir(project / "golden" / "consistency" / "cpu")
    outputs = json.loads(golden.read("step_1/rollout_generate/step0/rank0/stage_outputs.json"))
    assert [k for k in outputs["data"] if "rollout_log_probs" in k], list(outputs["data"])
    assert golden.localizes and golden.localization().has_stage(1, "rollout_generate")
    proc = run_pytest(project, "-k", "rollout_generate")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout


def test_dumping_rollout_generate_leaves_every_other_file_of_a_golden_identical(tmp_path: Path) -> None:
    """msprobe hooking the rollout consumes no random numbers and changes no later op: grpo_tiny's
    golden (every other stage's dump and metrics.jsonl) is byte-identical with the stage on."""
    from precision_harness.runs import kind_runners

    repo = Path(__file__).resolve().parent.parent
    base = Scenario.load(repo / "scenarios" / "grpo_tiny.yaml")
    on = base.with_overrides({STAGES_KEY: ["rollout_generate", *base.stages]}, directory=tmp_path)
    run = kind_runners.run_scenario(on, out_dir=tmp_path / "run", device="cpu")
    golden = Golden.from_dir(repo / "golden" / "grpo_tiny" / "cpu")
    # a rank's dump.index is the record's parse of its dump.json, written into the golden, not by a run
    produced = [name for name in golden.contents if Path(name).name != INDEX]
    assert len(produced) >= 10 and len(produced) < len(golden.contents)
    for name in produced:
        assert hashlib.sha256((run.run_dir / name).read_bytes()).hexdigest() == golden.content_sha256(name), name
    assert (run.run_dir / "step_2" / "rollout_generate" / "step0" / "rank0" / "dump.json").is_file()


# ------------------------------------------------------------------------------ the CLI
def _cli(project: Path, *args: str, plant: str | None = None) -> subprocess.CompletedProcess:
    return run_cli(project, *args, env=hooks_env(PRECISION_TEST_PLANT=plant) if plant else None)


def test_cli_run_and_compare_hold_a_run_to_its_invariants(project: Path) -> None:
    """``precision-harness run`` and ``compare --scenario`` report the invariant items the gate does (no golden)."""
    scenario = "scenarios/consistency.yaml"
    clean = _cli(project, "run", scenario, "--out", "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "PASS weight_sync @ step_2: 27 parameters bit-identical" in clean.stdout, clean.stdout
    assert "PASS rollout_log_prob_parity @ step_2: rollout_log_probs == old_log_prob bit for bit" in clean.stdout

    planted = _cli(project, "run", scenario, "--out", "planted", plant="weight_sync")
    assert planted.returncode == 1, planted.stdout + planted.stderr
    fail = "FAIL weight_sync @ step_2: model.layers.1.mlp.up_proj.weight: the rollout holds other values"
    assert fail in planted.stdout and "PASS weight_sync @ step_1:" in planted.stdout, planted.stdout

    # the planted run against itself: every dump is identical, so only the invariants can fail
    compare = _cli(project, "compare", "planted", "planted", "--scenario", scenario, "--report", "rep")
    assert compare.returncode == 1, compare.stdout + compare.stderr
    assert fail in compare.stdout, compare.stdout
    records = json.loads((project / "rep" / "report.json").read_text())["items"]
    failed = sorted(r["nodeid"] for r in records if not r["passed"])
    # the stale up_proj also moves the rollout's log-probs away from the actor's
    assert failed == ["planted::rollout_log_prob_parity[step_2]", "planted::weight_sync[step_2]"], failed
    without = _cli(project, "compare", "planted", "planted")  # no --scenario: no invariants to hold it to
    assert without.returncode == 0 and "weight_sync" not in without.stdout, without.stdout
