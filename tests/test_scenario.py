"""Scenario loading: schema validation, defaults, verl strict semantics, hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_testing import TINY

from precision_harness.errors import ScenarioError
from precision_harness.scenarios.profiling import STAGES
from precision_harness.scenarios.scenario import Scenario

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_committed_scenarios_load(path: Path) -> None:
    s = Scenario.load(path)
    assert s.stages and s.steps
    assert set(s.stages) <= set(STAGES)


def test_defaults_are_resolved(tmp_path: Path) -> None:
    s = Scenario.load(write(tmp_path, "seed: 1\n"))
    assert s.name == "s"
    assert s.level == "L1"
    assert s.config["actor_rollout_ref"]["actor"]["clip_ratio"] == 0.2
    # gae by default: critic on, no reference (no KL anywhere)
    assert s.stages == ("actor_compute_log_prob", "compute_values", "critic_update", "actor_update")


def test_unknown_key_names_file_and_field(tmp_path: Path) -> None:
    p = write(tmp_path, "actor_rollout_ref:\n  actor:\n    clip_ration: 0.2\n")
    with pytest.raises(ScenarioError) as exc:
        Scenario.load(p)
    msg = str(exc.value)
    assert str(p) in msg and "actor_rollout_ref.actor" in msg and "clip_ration" in msg
    assert "\n" not in msg


def test_wrong_type_names_field(tmp_path: Path) -> None:
    p = write(tmp_path, "actor_rollout_ref:\n  rollout:\n    n: two\n")
    with pytest.raises(ScenarioError, match=r"actor_rollout_ref\.rollout\.n: 'two' is not of type 'integer'"):
        Scenario.load(p)


def test_malformed_yaml_gives_line(tmp_path: Path) -> None:
    p = write(tmp_path, "seed: 1\nmodel: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"malformed YAML: line \d+, column \d+"):
        Scenario.load(p)


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="expected a mapping"):
        Scenario.load(write(tmp_path, "- a\n- b\n"))


def test_unknown_stage_strict_is_error(tmp_path: Path) -> None:
    text = (
        "global_profiler:\n  global_tool_config:\n    precision_debugger:\n"
        "      strict: true\n      stages: [actor_update, train_batch]\n"
    )
    with pytest.raises(ScenarioError, match="unknown stage 'train_batch' \\(strict: true\\)"):
        Scenario.load(write(tmp_path, text))


def test_unknown_stage_not_strict_is_ignored(tmp_path: Path) -> None:
    text = (
        "global_profiler:\n  global_tool_config:\n    precision_debugger:\n"
        "      strict: false\n      stages: [actor_update, train_batch]\n"
    )
    s = Scenario.load(write(tmp_path, text))
    assert s.stages == ("actor_update",)
    assert s.ignored_stages == ("train_batch",)


def test_rollout_generate_is_a_stage_only_when_listed(tmp_path: Path) -> None:
    text = (
        "global_profiler:\n  global_tool_config:\n    precision_debugger:\n"
        "      strict: true\n      stages: [actor_update, rollout_generate]\n"
    )
    assert Scenario.load(write(tmp_path, text)).stages == ("rollout_generate", "actor_update")
    assert "rollout_generate" not in Scenario.load(write(tmp_path, "seed: 1\n")).stages


def test_stage_that_never_runs_strict(tmp_path: Path) -> None:
    text = (
        "algorithm:\n  adv_estimator: grpo\nactor_rollout_ref:\n  rollout:\n    n: 2\n"
        "global_profiler:\n  global_tool_config:\n    precision_debugger:\n"
        "      strict: true\n      stages: [compute_values]\n"
    )
    with pytest.raises(ScenarioError, match="'compute_values' never runs"):
        Scenario.load(write(tmp_path, text))


def test_grpo_needs_group(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"rollout\.n: GRPO needs n >= 2"):
        Scenario.load(write(tmp_path, "algorithm:\n  adv_estimator: grpo\n"))


def test_mini_batch_must_divide(tmp_path: Path) -> None:
    text = "data:\n  train_batch_size: 4\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 3\n"
    with pytest.raises(ScenarioError, match=r"ppo_mini_batch_size: 3 must divide data\.train_batch_size=4"):
        Scenario.load(write(tmp_path, text))


def test_profiled_step_past_end(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"step 3 is past trainer\.total_training_steps=2"):
        Scenario.load(write(tmp_path, "global_profiler:\n  steps: [1, 3]\n"))


def test_numeric_change_keeps_hash_structural_change_does_not(tmp_path: Path) -> None:
    base = Scenario.load(TINY)
    lr = Scenario.load(write(tmp_path, TINY.read_text().replace("lr: 1.0e-3", "lr: 2.0e-3", 1), "a.yaml"))
    layers = Scenario.load(
        write(tmp_path, TINY.read_text().replace("num_hidden_layers: 1", "num_hidden_layers: 2"), "b.yaml")
    )
    level = Scenario.load(write(tmp_path, TINY.read_text().replace("level: L1", "level: mix"), "c.yaml"))
    assert lr.hash == base.hash
    assert (
        lr.numeric_settings["actor_rollout_ref.actor.optim.lr"]
        == 2e-3
        != base.numeric_settings["actor_rollout_ref.actor.optim.lr"]
    )
    assert layers.hash != base.hash
    # the level has its own stale check (and message), so it stays out of the structural hash
    assert level.hash == base.hash and level.level == "mix"


def test_tolerance_and_description_do_not_change_hash(tmp_path: Path) -> None:
    base = Scenario.load(TINY)
    text = TINY.read_text().replace("description: tiny", "description: other") + "tolerance:\n  mode: exact\n"
    other = Scenario.load(write(tmp_path, text))
    assert other.hash == base.hash


def test_msprobe_config_path(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text(
        json.dumps(
            {
                "task": "statistics",
                "level": "mix",
                "statistics": {"scope": [], "list": ["linear"], "data_mode": ["forward"], "summary_mode": "statistics"},
            }
        )
    )
    s = Scenario.load(
        write(
            tmp_path, "global_profiler:\n  global_tool_config:\n    precision_debugger:\n      config_path: cfg.json\n"
        )
    )
    assert s.level == "mix"
    cfg = s.msprobe_config()
    assert cfg["statistics"]["list"] == ["linear"] and cfg["statistics"]["data_mode"] == ["forward"]


def test_msprobe_config_with_dump_path_rejected(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": "/x"}))
    with pytest.raises(ScenarioError, match="dump_path: must not be set"):
        Scenario.load(
            write(
                tmp_path,
                "global_profiler:\n  global_tool_config:\n    precision_debugger:\n      config_path: cfg.json\n",
            )
        )


def test_msprobe_config_bad_level_rejected(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text(json.dumps({"task": "statistics", "level": "L9"}))
    with pytest.raises(
        ScenarioError, match=r"cfg.json: global_profiler.global_tool_config.precision_debugger.level: 'L9'"
    ):
        Scenario.load(
            write(
                tmp_path,
                "global_profiler:\n  global_tool_config:\n    precision_debugger:\n      config_path: cfg.json\n",
            )
        )


def test_rollout_is_defaults_follow_verl_pr_3694(tmp_path: Path) -> None:
    algo = Scenario.load(write(tmp_path, "seed: 1\n")).config["algorithm"]
    assert algo["rollout_is_threshold"] is None and algo["rollout_is"] is False
    assert (
        algo["rollout_is_veto_threshold"] == 1e-4
        and algo["rollout_is_level"] == "token"
        and algo["rollout_is_mode"] == "truncate"
    )


def test_rollout_is_settings_are_compared_not_stale(tmp_path: Path) -> None:
    base = Scenario.load(REPO / "scenarios" / "grpo_is_token_truncate.yaml")
    text = base.path.read_text()
    for old, new in (
        ("rollout_is: true", "rollout_is: false"),
        ("rollout_is_level: token", "rollout_is_level: geometric"),
        ("rollout_is_mode: truncate", "rollout_is_mode: clip"),
        ("rollout_is_threshold: 2.0", "rollout_is_threshold: 3.0"),
        ("rollout_is_veto_threshold: 1.0e-4", "rollout_is_veto_threshold: null"),
    ):
        other = Scenario.load(write(tmp_path, text.replace(old, new)))
        assert other.hash == base.hash, old
        assert other.numeric_settings != base.numeric_settings, old


def test_rollout_is_without_threshold_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(
        ScenarioError,
        match=r"s.yaml: algorithm.rollout_is: true applies IS weights but algorithm.rollout_is_threshold is null",
    ):
        Scenario.load(write(tmp_path, "algorithm:\n  rollout_is: true\n"))


def test_rollout_is_lower_above_upper_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(
        ScenarioError, match=r"algorithm.rollout_is_threshold_lower: 3.0 is above rollout_is_threshold=2.0"
    ):
        Scenario.load(write(tmp_path, "algorithm:\n  rollout_is_threshold: 2.0\n  rollout_is_threshold_lower: 3.0\n"))


@pytest.mark.parametrize(
    "key,value",
    [
        ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-mean"),
        ("actor_rollout_ref.actor.kl_loss_type", "mse"),
        ("algorithm.kl_penalty", "low_var_kl"),
        ("algorithm.rollout_is_level", "geometric"),
        ("actor_rollout_ref.actor.dtype", "bfloat16"),
        ("reward_model.enable", True),
    ],
)
def test_breadth_settings_are_covered_by_a_committed_scenario(key: str, value) -> None:
    """Each verl option the PPO-breadth issue asks for is exercised by at least one gated scenario."""
    from precision_harness.scenarios.settings import flatten

    assert any(flatten(Scenario.load(p).config).get(key) == value for p in (REPO / "scenarios").glob("*.yaml")), (
        f"no scenario sets {key}: {value}"
    )


@pytest.mark.parametrize("name", [".", "..", "../elsewhere", "a/b", ".hidden", "", "x y"])
def test_name_that_would_leave_golden_is_rejected(tmp_path: Path, name: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: {json.dumps(name)}\n")
    with pytest.raises(ScenarioError) as err:
        Scenario.load(path)
    assert str(err.value).startswith(f"{path}: name: {name!r} is not a valid scenario name")


def test_file_stem_that_would_leave_golden_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "..yaml"  # stem "."
    path.write_text("seed: 1\n")
    with pytest.raises(ScenarioError, match=r"name \(file stem\): '\.' is not a valid scenario name"):
        Scenario.load(path)


def test_with_overrides_writes_a_validated_variant(tmp_path: Path) -> None:
    scenario = Scenario.load(TINY)
    variant = scenario.with_overrides({"actor_rollout_ref.actor.optim.lr": 0.002}, directory=tmp_path, tag="lr")
    assert variant.name == "tiny_ppo.lr" and variant.path == tmp_path / "tiny_ppo.lr.yaml"
    assert variant.config["actor_rollout_ref"]["actor"]["optim"]["lr"] == 0.002 and variant.hash == scenario.hash
    with pytest.raises(
        ScenarioError, match=r"tiny_ppo\.bad\.yaml: actor_rollout_ref\.actor: .*'optimm' was unexpected"
    ):
        scenario.with_overrides({"actor_rollout_ref.actor.optimm.lr": 1.0}, directory=tmp_path, tag="bad")


def test_msprobe_rank_filter_reaches_the_config_and_the_identity(tmp_path: Path) -> None:
    """``rank: [0]`` (msprobe's rank filter: only rank 0 dumps) goes into the msprobe config and the scenario's
    identity; the default (every rank) keeps the hashes recorded before the filter existed."""
    plain = Scenario.load(write(tmp_path, "seed: 1\n"))
    assert plain.msprobe_config()["rank"] == []
    filtered = Scenario.load(
        write(
            tmp_path,
            "seed: 1\nglobal_profiler:\n  global_tool_config:\n    precision_debugger: {rank: [0]}\n",
            "r.yaml",
        )
    )
    assert filtered.msprobe_config()["rank"] == [0]
    assert filtered.hash != plain.hash
    with pytest.raises(ScenarioError, match=r"rank"):
        Scenario.load(
            write(tmp_path, "global_profiler:\n  global_tool_config:\n    precision_debugger: {rank: [-1]}\n", "b.yaml")
        )


def test_an_unknown_name_in_the_unchecked_allowance_names_file_and_field(tmp_path: Path) -> None:
    p = write(tmp_path, "tolerance:\n  unchecked: ['npu_rms_norm']\n")
    with pytest.raises(ScenarioError) as exc:
        Scenario.load(p)
    msg = str(exc.value)
    assert str(p) in msg and "tolerance.unchecked.0" in msg and "npu_rms_norm" in msg and "\n" not in msg
    assert Scenario.load(write(tmp_path, "tolerance:\n  unchecked: ['NPU.npu_rms_norm.*']\n", "ok.yaml"))
