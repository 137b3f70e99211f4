"""``level: auto`` for verl scenarios (issues 31, 38): an L0 dump plus each stage's inputs and outputs from verl's
batch.

On every device the gate's stage window runs in every verl process (runs/verl/stages/, loaded through
``VERL_USE_EXTERNAL_MODULES``); around each stage verl's precision debugger dumps, it copies what the stage
reads from verl's batch and records what it returns (runs/verl/stages/stage_window.py), written as the
built-in runner's ``stage_outputs.json``. What is here:

- the run's set-up on cpu, cuda and npu: the variable that turns the capture on and the module that does it
  (without the CPU support off the cpu), the L0 dump; the localisation variant (it runs in the original
  scenario's folder, stops at the step, dumps one stage at L1, without the capture);
- bad input: ``auto`` on a device under a verl the stage window was not checked with, one line;
- the capture itself, on a stand-in worker in a subprocess (the pytest process never imports torch), and
  through verl's own ``import verl`` hook and its ``PrecisionDebuggerProfiler`` with only the device
  modules loaded (no CPU platform);
- end to end, in tests/test_verl_cpu_users_config.py (one verl run and its localisation serve both): verl's
  advantage estimators planted in every process (``PRECISION_TEST_PLANT=advantages``) fail
  ``actor_update[step_1]``, first at the advantages the update read, and the verdict is localised at L1 to the
  first divergent API. The committed goldens' L1 records are today's L1 goldens, byte for byte
  (tests/test_verl_cpu.py reads them).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precision_harness.errors import ScenarioError
from precision_harness.runs import kind_runners
from precision_harness.runs.command import run as command_runner
from precision_harness.runs.verl import engine as verl_engine

#: these tests run examples/verl_cpu where it stands (its .precision/ and the processes a run leaves): one xdist
#: worker runs them all, one at a time
pytestmark = pytest.mark.xdist_group("verl_cpu_example")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "verl_cpu"
SCENARIO = EXAMPLE / "scenarios" / "grpo_dp2_bf16_cpu.yaml"


def _scenario():
    from precision_harness.scenarios.scenario import Scenario

    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    return Scenario.load(SCENARIO)


def test_the_committed_verl_scenarios_gate_at_auto() -> None:
    scenario = _scenario()
    assert scenario.level == "auto" and scenario.dump_level == "L0" and scenario.msprobe_config()["level"] == "L0"


def _device_scenario():
    """The committed verl scenario without what only the CPU support records (the rollout stage, weight digests)."""
    scenario = _scenario()
    pd = scenario.config["global_profiler"]["global_tool_config"]["precision_debugger"]
    pd["stages"].remove("rollout_generate")
    scenario.config["invariants"].pop("weight_sync")
    return scenario


def _modules(spec) -> list[str]:
    return spec.env["VERL_USE_EXTERNAL_MODULES"].split(",")


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_auto_on_a_device_dumps_l0_and_loads_the_stage_window_without_the_cpu_support(
    tmp_path: Path, device: str
) -> None:
    """Before issue 38 this raised ("level: auto on npu: verl 0.9.1 does not feed ...")."""
    scenario = _device_scenario()
    spec = kind_runners.command_spec(scenario, tmp_path, device=device)
    assert spec.env[verl_engine.STAGE_OUTPUTS_ENV] == "1"
    assert f"precision gate:   env {verl_engine.STAGE_OUTPUTS_ENV}=1" in spec.header
    assert verl_engine.STAGES_MODULE in _modules(spec) and verl_engine.CPU_MODULE not in _modules(spec)
    assert "VERL_PLATFORM" not in spec.env  # verl's own platform, engines and rollout
    assert not any(verl_engine.CPU_PLATFORM in a for a in spec.argv)
    assert json.loads(Path(spec.env[command_runner.ENV_MSPROBE_CONFIG]).read_text())["level"] == "L0"
    assert "actor_rollout_ref.actor.profiler.enable=true" in spec.argv


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_the_localisation_rerun_on_a_device_dumps_its_stage_at_l1_without_the_capture(
    tmp_path: Path, device: str
) -> None:
    scenario = _device_scenario()
    overrides = {**scenario.localize_overrides(2, "actor_update"), "invariants.weight_sync": None}  # CPU-only
    variant = scenario.with_overrides(overrides, directory=tmp_path, name=scenario.name, tag="L1-2")
    run = tmp_path / "run"
    run.mkdir()
    spec = kind_runners.command_spec(variant, run, device=device)
    assert json.loads(Path(spec.env[command_runner.ENV_MSPROBE_CONFIG]).read_text())["level"] == "L1"
    assert verl_engine.STAGE_OUTPUTS_ENV not in spec.env and verl_engine.STAGES_MODULE not in _modules(spec)
    pd = "global_profiler.global_tool_config.precision_debugger"
    assert "global_profiler.steps=[2]" in spec.argv and "trainer.total_training_steps=2" in spec.argv
    assert f"{pd}.stages=[actor_update]" in spec.argv


def test_l1_on_a_device_is_as_before(tmp_path: Path) -> None:
    scenario = _device_scenario()
    scenario.config["global_profiler"]["global_tool_config"]["precision_debugger"]["level"] = "L1"
    spec = kind_runners.command_spec(scenario, tmp_path, device="npu")
    assert verl_engine.STAGE_OUTPUTS_ENV not in spec.env
    assert _modules(spec) == [verl_engine.RANK_STACK_MODULE, verl_engine.FSDP2_BUFFERS_MODULE]


def test_auto_on_a_device_under_an_unchecked_verl_is_one_line_and_l1_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = _device_scenario()
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0" if name == "verl" else real(name))
    with pytest.raises(ScenarioError) as err:
        kind_runners.command_spec(scenario, tmp_path, device="npu")
    assert str(err.value) == (
        f"{SCENARIO}: global_profiler.global_tool_config.precision_debugger.level: auto: verl 0.10.0 is not "
        "supported; the stage window that records each stage's inputs and outputs from verl's batch wraps verl's "
        "PrecisionDebuggerProfiler (precision_harness/runs/verl/stages/debugger.py), checked with verl 0.9.1: "
        "install that verl, or set level L0, L1 or mix"
    )
    scenario.config["global_profiler"]["global_tool_config"]["precision_debugger"]["level"] = "L1"
    kind_runners.command_spec(scenario, tmp_path, device="npu")  # L1 needs no stage window


def test_an_auto_run_turns_the_capture_on_and_an_l1_run_does_not(tmp_path: Path) -> None:
    scenario = _scenario()
    (tmp_path / "a").mkdir()
    spec = kind_runners.command_spec(scenario, tmp_path / "a", device="cpu")
    assert spec.env[verl_engine.STAGE_OUTPUTS_ENV] == "1"
    assert f"precision gate:   env {verl_engine.STAGE_OUTPUTS_ENV}=1" in spec.header
    scenario.config["global_profiler"]["global_tool_config"]["precision_debugger"]["level"] = "L1"
    (tmp_path / "b").mkdir()
    assert verl_engine.STAGE_OUTPUTS_ENV not in kind_runners.command_spec(scenario, tmp_path / "b", device="cpu").env


def test_the_localisation_variant_runs_where_the_scenario_stands_to_its_step_with_one_stage_at_l1(
    tmp_path: Path,
) -> None:
    """Written under the artifacts, the variant still reads ``inputs`` and ``PRECISION_SCENARIO_DIR`` (its overrides'
    paths) from the scenario's own folder, and runs there; it stops at the step (no ``trainer`` key: a verl
    scenario's last profiled step ends its run), and keeps the scenario's identity."""
    scenario = _scenario()
    variant = scenario.with_overrides(
        scenario.localize_overrides(2, "actor_update"), directory=tmp_path, name=scenario.name, tag="L1-2"
    )
    assert variant.path.parent == tmp_path and variant.folder == SCENARIO.parent
    assert variant.hash == scenario.hash and variant.level == "L1"
    assert variant.steps == (2,) and variant.stages == ("actor_update",) and variant.total_steps == 2
    run = tmp_path / "run"
    run.mkdir()
    env = command_runner.command_env(variant, run)
    assert env[command_runner.ENV_SCENARIO_DIR] == str(SCENARIO.parent.resolve())
    assert not scenario.localizes_stage("rollout_generate")  # the rollout server's record: no msprobe dump of it
    assert scenario.localizes_stage("actor_update")


def test_a_run_joining_a_ray_leaves_its_resources_to_it_and_they_stay_gate_owned(tmp_path: Path) -> None:
    """Ray refuses num_cpus and num_gpus from a driver that joins an instance: a joining run drops them (and the
    dashboard setting), and a scenario still may not set them."""
    scenario = _scenario()
    (tmp_path / "a").mkdir()
    argv = kind_runners.command_spec(scenario, tmp_path / "a", device="cpu", joins_ray=True).argv
    assert not any(a.startswith(("ray_kwargs.ray_init.num_cpus=", "+ray_kwargs.ray_init.")) for a in argv)
    own = kind_runners.command_spec(scenario, tmp_path, device="cpu").argv
    assert "ray_kwargs.ray_init.num_cpus=8" in own and "+ray_kwargs.ray_init.include_dashboard=false" in own
    scenario.config["verl"]["overrides"]["ray_kwargs.ray_init.num_cpus"] = 4
    with pytest.raises(ScenarioError, match=r"ray_kwargs\.ray_init\.num_cpus is set by the gate on cpu"):
        kind_runners.command_spec(scenario, tmp_path / "a", device="cpu", joins_ray=True)


CAPTURE = """
import json, pathlib, sys, torch
from tensordict import TensorDict
from precision_harness.runs.verl.stages.stage_window import FEEDS, StageIO, flat
from precision_harness.dumps.files import load_dump

class Metric:  # verl's Metric keeps its values as floats in a list
    def __init__(self, value): self.values = [value]

def jagged(rows):
    return torch.nested.nested_tensor([torch.tensor(r) for r in rows], layout=torch.jagged)

def ppo_loss(model_output, data, dp_group=None):
    loss = model_output * 2.0
    return loss, {"actor/pg_loss": Metric(float(loss)), "kl_loss": Metric(0.25)}

class Trainer:
    loss_fn = staticmethod(ppo_loss)

class Worker:  # verl's ActorRolloutRefWorker: its actor is the TrainingWorker the update calls
    actor = Trainer()

worker = Worker()
data = TensorDict({"advantages": jagged([[1.0, -1.0, 0.5], [2.0]]), "old_log_probs": jagged([[-1.0], [-2.0, -3.0]])},
                  batch_size=[2])
io = StageIO(FEEDS["actor_update"], worker, data)
data["advantages"].values().mul_(100.0)  # the stage may change its batch in place: the copy keeps what it read
worker.actor.loss_fn(torch.tensor(0.5), data)  # two micro-batches, as verl's engine calls the loss function
worker.actor.loss_fn(torch.tensor(-1.0), data)
io.restore()
result = TensorDict({}, batch_size=[])
result.set_non_tensor("metrics", {"grad_norm": [0.75]})
out = pathlib.Path(sys.argv[1])
io.write(out, result)
logp = StageIO(FEEDS["actor_compute_log_prob"], worker, data)
logp.write(out / "logp", TensorDict({"log_probs": jagged([[-1.0, -2.0], [-4.0]]), "entropy": jagged([[1.0], [2.0]])},
                                    batch_size=[2]))
dump = load_dump(out / "stage_outputs.json")
rows = {k: (list(v)[0], v[list(v)[0]][0]["Max"], v[list(v)[0]][0]["Min"]) for k, v in dump["data"].items()}
print(json.dumps([dump["inputs"], rows, worker.actor.loss_fn is ppo_loss,
                  sorted(load_dump(out / "logp" / "stage_outputs.json")["data"])]))
"""


def test_the_capture_writes_what_the_stage_read_and_returned_per_micro_and_mini_batch(tmp_path: Path) -> None:
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    proc = subprocess.run(
        [sys.executable, "-c", CAPTURE, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    inputs, rows, restored, logp = json.loads(proc.stdout.strip().splitlines()[-1])
    assert inputs == ["Stage.old_log_probs.0.forward", "Stage.advantages.0.forward"]  # the feed's order; no IS weights
    assert rows == {
        "Stage.old_log_probs.0.forward": ["input_args", -1.0, -3.0],
        "Stage.advantages.0.forward": ["input_args", 2.0, -1.0],  # its valid tokens, as read (not the later * 100)
        "Stage.loss.0.forward": ["output", 1.0, 1.0],
        "Stage.loss.1.forward": ["output", -2.0, -2.0],
        "Stage.pg_loss.0.forward": ["output", 1.0, 1.0],
        "Stage.pg_loss.1.forward": ["output", -2.0, -2.0],
        "Stage.kl_loss.0.forward": ["output", 0.25, 0.25],
        "Stage.kl_loss.1.forward": ["output", 0.25, 0.25],
        "Stage.grad_norm.0.forward": ["output", 0.75, 0.75],
    }
    assert restored  # the worker's own loss function is back
    assert logp == ["Stage.entropy.0.forward", "Stage.old_log_probs.0.forward"]


HOOK = """
import json, pathlib, sys, torch
from tensordict import TensorDict
import verl  # imports VERL_USE_EXTERNAL_MODULES: the device modules only, no CPU support
from verl.utils.profiler.precision_debugger_profile import PrecisionDebuggerProfiler

out = pathlib.Path(sys.argv[1])
# config_path unset: verl's debugger starts no msprobe (nothing to dump), the stage window still runs around the stage
profiler = PrecisionDebuggerProfiler({"stages": ["actor_compute_log_prob", "actor_update"]}, rank=0, save_path=str(out))

class Metric:
    def __init__(self, value): self.values = [value]

def ppo_loss(model_output, data, dp_group=None):
    return model_output * 3.0, {"actor/pg_loss": Metric(float(model_output))}

class Trainer:
    loss_fn = staticmethod(ppo_loss)

def jagged(rows):
    return torch.nested.nested_tensor([torch.tensor(r) for r in rows], layout=torch.jagged)

class Worker:  # verl's ActorRolloutRefWorker as verl's DistProfiler.annotate calls impl.annotate(role=...)
    global_step = 3
    actor = Trainer()

    @profiler.annotate(role="actor_compute_log_prob")
    def compute_log_prob(self, data):
        return TensorDict({"log_probs": jagged([[-0.5, -1.5], [-2.5]]), "entropy": jagged([[0.25], [0.75]])},
                          batch_size=[2])

    @profiler.annotate(role="actor_update")
    def update_actor(self, data):
        self.actor.loss_fn(torch.tensor(0.5), data)
        result = TensorDict({}, batch_size=[])
        result.set_non_tensor("metrics", {"grad_norm": [1.25]})
        return result

data = TensorDict({"advantages": jagged([[1.0, -1.0], [4.0]])}, batch_size=[2])
Worker().compute_log_prob(data)
Worker().update_actor(data)
rows = {}
for stage in ("actor_compute_log_prob", "actor_update"):
    record = json.loads((out / "step_3" / stage / "step0" / "rank0" / "stage_outputs.json").read_text())
    rows[stage] = {k: v[next(iter(v))][0]["Max"] for k, v in record["data"].items()}
timeline = [json.loads(x) for x in (out / "verl_timeline.jsonl").read_text().splitlines()]
cpu = [m for m in sys.modules if m.startswith("precision_harness.runs.verl.cpu.")]
print(json.dumps([rows, sorted((e["stage"], e["step"]) for e in timeline if e["event"] == "stage"), cpu,
                  Worker.actor.loss_fn is ppo_loss]))
"""


def test_verls_hook_loads_the_stage_window_on_a_device_and_it_records_verls_batch(tmp_path: Path) -> None:
    """``import verl`` with the variables a cuda/npu run at level auto gets: the stage window wraps verl's own
    ``PrecisionDebuggerProfiler.annotate`` and writes each stage's ``stage_outputs.json`` and its clock, and nothing
    of the CPU support (its platform, replica, patches) is loaded. The device itself is what this cannot show."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    scenario = _device_scenario()
    spec = kind_runners.command_spec(scenario, tmp_path, device="cuda")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    env |= {k: spec.env[k] for k in ("VERL_USE_EXTERNAL_MODULES", verl_engine.STAGE_OUTPUTS_ENV)}
    env["PRECISION_DUMP_DIR"] = str(tmp_path / "run")
    proc = subprocess.run(
        [sys.executable, "-c", HOOK, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, stages, cpu_modules, restored = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rows == {
        "actor_compute_log_prob": {"Stage.old_log_probs.0.forward": -0.5, "Stage.entropy.0.forward": 0.75},
        "actor_update": {
            "Stage.advantages.0.forward": 4.0,
            "Stage.loss.0.forward": 1.5,
            "Stage.pg_loss.0.forward": 0.5,
            "Stage.grad_norm.0.forward": 1.25,
        },
    }
    assert stages == [["actor_compute_log_prob", 3], ["actor_update", 3]]
    assert cpu_modules == [] and restored


def test_the_stage_window_refuses_another_verl_in_one_line() -> None:
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    code = """
import importlib.metadata as m
real = m.version
m.version = lambda name: "0.10.0" if name == "verl" else real(name)
import precision_harness.runs.verl.stages.extension
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("RuntimeError: global_profiler.global_tool_config.")
    assert "verl 0.10.0 is not supported" in last and "checked with verl 0.9.1" in last
