"""engine: verl scenarios: the overrides the gate owns compose against the installed verl, bad input is
one line, and rollout pinning is what makes a sampled run gate-able.

These tests swap verl's entrypoint (``verl.entrypoint``) for a fake trainer, which takes seconds
where verl's real trainer takes minutes (that one runs on CPU in tests/test_verl_cpu.py). The fake
reads the same Hydra overrides, writes the profiler's layout under ``global_profiler.save_path``,
logs through ``$VERL_FILE_LOGGER_PATH`` as verl's ``FileLogger`` does, and samples a random rollout
unless ``skip.rollout_tq`` gives it a saved one.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testing import base_data

from precision_harness.errors import ScenarioError
from precision_harness.goldens.golden import Golden
from precision_harness.runs.kind_runners import load_scenario
from precision_harness.runs.verl import engine as verl_engine

pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
pytest.importorskip("hydra", reason="verl's config is composed with hydra")

USER = {
    "data.train_files": "/data/gsm8k/train.parquet",
    "data.train_batch_size": 8,
    "algorithm.adv_estimator": "grpo",
    "actor_rollout_ref.model.path": "/models/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.n": 4,
}


def _gate(tmp_path: Path, rollouts: bool = True) -> dict:
    return verl_engine.gate_overrides(
        steps=[1, 2],
        stages=["actor_compute_log_prob", "actor_update"],
        strict=True,
        save_path=tmp_path / "run",
        config_path=tmp_path / "run" / "msprobe_config.json",
        rollouts=tmp_path / "run" / "rollouts" if rollouts else None,
    )


def test_gate_overrides_compose_into_verls_own_dataclasses(tmp_path: Path) -> None:
    """Every key exists in verl's ppo_trainer config and each section instantiates as verl's trainer does."""
    from omegaconf import OmegaConf
    from verl.utils import omega_conf_to_dataclass

    cfg = verl_engine.compose({**USER, **_gate(tmp_path)})
    debugger = omega_conf_to_dataclass(cfg.global_profiler.global_tool_config.precision_debugger)
    assert type(debugger).__name__ == "PrecisionDebuggerToolConfig"
    assert debugger.stages == ["actor_compute_log_prob", "actor_update"] and debugger.strict is True
    assert debugger.config_path == str(tmp_path / "run" / "msprobe_config.json")
    profiler = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.profiler)
    assert type(profiler).__name__ == "ProfilerConfig"
    assert profiler.enable is True and profiler.tool == "precision_debugger"
    assert profiler.save_path == str(tmp_path / "run")
    skip = omega_conf_to_dataclass(cfg.skip)
    assert skip.rollout_tq == {"enable": True, "dump_dir": str(tmp_path / "run" / "rollouts"), "steps": [1, 2]} | {
        "action": "cache"
    }
    from verl.utils.skip.base_skip import SkipAction

    assert SkipAction(skip.rollout_tq["action"]) is SkipAction.CACHE
    assert OmegaConf.select(cfg, "global_profiler.steps") == [1, 2]
    assert cfg.trainer.total_training_steps == 2 and list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.trainer.val_before_train is False and cfg.trainer.test_freq == -1 and cfg.trainer.save_freq == -1
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6 and cfg.actor_rollout_ref.rollout.n == 4


def test_gate_values_have_the_types_of_verls_defaults(tmp_path: Path) -> None:
    """A gate value of the wrong type (a string for a bool, an int for a list) would compose but break verl."""
    default = verl_engine.compose({})
    composed = verl_engine.compose(_gate(tmp_path))
    from omegaconf import OmegaConf

    checked = 0
    for key in _gate(tmp_path):
        before = OmegaConf.select(default, key)
        if before is None:
            continue
        after = OmegaConf.select(composed, key)
        assert type(after) is type(before), f"{key}: {type(after).__name__}, verl's default is {type(before).__name__}"
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize(
    "value",
    [True, False, None, 2, 1e-6, "grpo", "/data/x.parquet", "a b", "true", "it's", [1, 2], ["a", "b"], {"x": 1}],
)
def test_hydra_value_round_trips_through_hydras_parser(value) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(f"k={verl_engine.hydra_value(value)}").value()
    assert parsed == value and type(parsed) is type(value)


def _verl_scenario(tmp_path: Path, *, stages: str = "[actor_update]", overrides: str = "{}") -> Path:
    path = tmp_path / "v.yaml"
    path.write_text(
        "engine: verl\n"
        f"verl: {{overrides: {overrides}}}\n"
        "global_profiler:\n  steps: [1]\n  global_tool_config:\n"
        f"    precision_debugger: {{stages: {stages}, strict: true}}\n"
    )
    return path


@pytest.mark.parametrize(
    ("stages", "overrides", "message"),
    [
        (
            "[compute_rm_score]",
            "{}",
            f"precision_debugger.stages: verl {verl_engine.installed_version()} does not dump 'compute_rm_score'; "
            "its trainer dumps ref_compute_log_prob, actor_compute_log_prob, actor_update, and compute_values, "
            "critic_update, rollout_generate on cpu; the gate adds rollout_compute_log_prob under pinned rollouts",
        ),
        ("[actor_update]", "{trainer.no_such_key: 1}", "verl.overrides: Could not override 'trainer.no_such_key'"),
        ("[actor_update]", "{global_profiler.steps: [3]}", "verl.overrides: global_profiler.steps is set by the gate"),
        ("[actor_update]", "{trainer.total_training_steps: 9}", "trainer.total_training_steps is set by the gate"),
        ("[actor_update]", "{skip.rollout_tq.enable: false}", "set it through the scenario's own keys"),
    ],
)
def test_bad_verl_scenario_is_one_line(tmp_path: Path, stages: str, overrides: str, message: str) -> None:
    path = _verl_scenario(tmp_path, stages=stages, overrides=overrides)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert message in str(err.value) and str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_missing_verl_says_to_install_verl_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the [verl] extra: it pins verl 0.9.1 for the CPU path, and the README warns against it on a device host."""
    monkeypatch.setattr(verl_engine, "installed_version", lambda: None)
    with pytest.raises(ScenarioError, match=r"v\.yaml: engine: verl needs verl installed.*install verl itself") as exc:
        load_scenario(_verl_scenario(tmp_path))
    assert "pytest-precision[verl]" not in str(exc.value)


def test_verl_scenario_argv_is_main_ppo_with_user_then_gate_overrides(tmp_path: Path) -> None:
    argv = verl_engine.argv(None, {**USER, **_gate(tmp_path)})
    assert argv[:3] == [sys.executable, "-m", "verl.trainer.main_ppo"]
    assert "actor_rollout_ref.actor.profiler.enable=true" in argv
    assert "global_tool_config" not in " ".join(argv[3:11])  # the user's overrides come first
    assert f"skip.rollout_tq.dump_dir={tmp_path / 'run' / 'rollouts'}" in argv


#: a stand-in for ``python -m verl.trainer.main_ppo``: reads its overrides as Hydra would, writes
#: the profiler's layout, FileLogger lines, and samples rollouts unless skip.rollout_tq has them
FAKE_VERL = textwrap.dedent(
    """
    import json, os, random, sys
    from pathlib import Path
    import yaml

    args = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    Path("argv.json").write_text(json.dumps(sys.argv[1:]))
    pd = "global_profiler.global_tool_config.precision_debugger."
    data = json.loads(Path(__file__).with_name("dump_data.json").read_text())
    level = json.loads(Path(args[pd + "config_path"]).read_text())["level"]
    save_path = Path(args["global_profiler.save_path"])
    rollout_dir = None
    if args.get("skip.rollout_tq.enable"):
        rollout_dir = Path(args["skip.rollout_tq.dump_dir"]) / "exp_proj" / "GBS8_N1_in16_out16"
    logger = open(os.environ["VERL_FILE_LOGGER_PATH"], "w")
    for step in range(1, args["trainer.total_training_steps"] + 1):
        cached = rollout_dir / str(step) / "batch.json" if rollout_dir else None
        if cached is not None and cached.is_file():
            reward = json.loads(cached.read_text())["reward"]
            print(f"step {step}: rollout loaded from {cached}")
        else:
            reward = random.SystemRandom().random()
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps({"reward": reward}))
        for stage in args[pd + "stages"]:
            if step not in args["global_profiler.steps"]:
                continue
            out = save_path / f"step_{step}" / stage / "step0" / "rank0"
            out.mkdir(parents=True, exist_ok=True)
            dump = json.loads(json.dumps(data))
            dump["Functional.linear.0.forward"]["output"][0]["Norm"] *= 1 + reward
            out.joinpath("dump.json").write_text(json.dumps({"task": "statistics", "level": level, "data": dump}))
        row = {"critic/score/mean": reward, "timing_s/step": random.random(), "perf/throughput": 1e3}
        logger.write(json.dumps({"step": step, "data": row}) + "\\n")
    """
)


def _fake_verl_project(pytester: pytest.Pytester) -> Path:
    scenarios = pytester.path / "scenarios"
    scenarios.mkdir(exist_ok=True)
    (scenarios / "fake_verl.py").write_text(FAKE_VERL)
    (scenarios / "dump_data.json").write_text(json.dumps(base_data()))
    (scenarios / "qwen_grpo.yaml").write_text(
        "engine: verl\n"
        "inputs: [fake_verl.py]\n"
        "verl:\n"
        f"  entrypoint: [{json.dumps(sys.executable)}, fake_verl.py]\n"
        "  pin_rollouts: true\n"
        "  overrides:\n"
        "    algorithm.adv_estimator: grpo\n"
        "    data.train_batch_size: 8\n"
        "global_profiler:\n"
        "  steps: [1, 2]\n"
        "  global_tool_config:\n"
        "    precision_debugger:\n"
        "      stages: [actor_compute_log_prob, actor_update]\n"
        "      strict: true\n"
    )
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return scenarios


def test_pinned_rollouts_make_a_sampled_run_pass_by_loading_the_goldens_rollouts(pytester: pytest.Pytester) -> None:
    scenarios = _fake_verl_project(pytester)
    pytester.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=5)
    golden = Golden.from_dir(pytester.path / "golden" / "qwen_grpo" / "cpu")
    assert sorted(n for n in golden.contents if n.startswith("rollouts/")) == [
        "rollouts/exp_proj/GBS8_N1_in16_out16/1/batch.json",
        "rollouts/exp_proj/GBS8_N1_in16_out16/2/batch.json",
    ]
    argv = json.loads((scenarios / "argv.json").read_text())
    assert argv[:2] == ["algorithm.adv_estimator=grpo", "data.train_batch_size=8"]
    assert "actor_rollout_ref.actor.profiler.enable=true" in argv and "trainer.total_training_steps=2" in argv
    check = pytester.runpytest_subprocess()
    check.assert_outcomes(passed=5)
    check.stdout.fnmatch_lines(["5 precision items: 4 identical to golden, 1 within tolerance or compared, 0 failed"])
    # the control: the stand-in samples its reward from the system's entropy (SystemRandom), so only the golden's
    # rollouts, loaded at each step, can make the check pass
    log = (pytester.path / ".precision" / "artifacts" / "qwen_grpo" / "run" / "worker.log").read_text()
    loaded = re.findall(r"step (\d): rollout loaded from \S+/rollouts/exp_proj/GBS8_N1_in16_out16/\d/batch\.json", log)
    assert loaded == ["1", "2"], log[-2000:]
