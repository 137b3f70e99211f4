"""verl scenarios (``engine: verl``): verl's own trainer, ``python -m verl.trainer.main_ppo``, behind the gate.

The scenario gives verl overrides (``verl.overrides``, dotted keys as on verl's command line); the
gate adds the ones it owns (:func:`gate_overrides`): the precision debugger on (tool, steps,
save_path, config_path, stages, strict, ``actor_rollout_ref.actor.profiler.enable``), the number
of steps, a console and file logger (the file logger's jsonl becomes ``metrics.jsonl``), no
validation and no checkpoints, and, unless ``verl.pin_rollouts: false``, rollout pinning: the
recording run saves its rollouts (``skip.rollout_tq``, action ``cache``) into the golden and check
runs load them, so a failure is training-side drift, not sampling.

Facts checked against verl 0.9.1 (the wheel's source): ``PrecisionDebuggerProfiler`` dumps to
``{save_path}/step_{global_step}/{stage}/step0/rank{r}/dump.json``; only ``ActorRolloutRefWorker``
is annotated, so only :data:`DUMPED_STAGES` are dumped; with ``config_path`` unset (or msprobe
missing and ``strict: false``) nothing is dumped and nothing is said.

At ``level: auto``, on every device, verl's processes also load the stage window (:data:`STAGES_MODULE`,
:mod:`precision_harness.runs.verl.stages`): around each stage verl's debugger dumps, it writes what the stage
read from verl's batch and returned (``stage_outputs.json``) beside the L0 dump.

On the CPU (``--precision-device cpu``) the gate runs the same trainer through verl's extension hook:
:func:`cpu_env` makes every verl process import :mod:`precision_harness.runs.verl.cpu` (a CPU platform
with gloo, the rollout replica ``precision_cpu``, the patches of verl internals, refused for a verl
other than :data:`SUPPORTED_VERSIONS`), and :func:`cpu_overrides` adds the resource and engine
settings verl needs there. Both are gate-owned, printed at the top of the run's log and listed in
docs/scenarios.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_harness.errors import ScenarioError, VerlMissingError
from precision_harness.runs.command.run import ROLLOUTS, CommandSpec
from precision_harness.runs.stage_api import ENV_METRICS, ENV_MSPROBE_CONFIG
from precision_harness.runs.verl import fsdp2_buffers, pinning
from precision_harness.runs.verl import profile as verl_profile

# verl's Hydra config, where the engine's callers compose an override set through it
from precision_harness.runs.verl.hydra_config import argv, compose, config_dir, hydra_value  # noqa: F401
from precision_harness.runs.verl.release import (
    CHECKED_VERSION,
    SUPPORTED_VERSIONS,
    VERL_FIX,
    installed_version,
    stage_window_version_message,
    unsupported_version_message,
    version_line,
)
from precision_harness.scenarios import fresh_steps
from precision_harness.scenarios.profiling import ROLLOUT_COMPUTE_LOG_PROB

#: the stages verl 0.9.1's engine workers annotate (``verl/workers/engine_workers.py``)
DUMPED_STAGES = ("ref_compute_log_prob", "actor_compute_log_prob", "actor_update")
#: the critic's stages: verl 0.9.1's precision debugger knows them but nothing annotates them; on cpu the
#: gate's CPU support does (precision_harness/runs/verl/cpu/patches.py, patch 4), so only there are they dumped
CRITIC_STAGES = ("compute_values", "critic_update")
#: verl's debugger skips the rollout; on cpu the gate's rollout server records what it sampled
#: (precision_harness/runs/verl/cpu/policy_server.py)
ROLLOUT_STAGE = "rollout_generate"
#: the rollout engine scoring the pinned responses (runs/verl/engine_scoring.py): the gate's CPU server scores them,
#: and off the CPU the engines of :data:`SCORING_ENGINES`, under the conditions :func:`score_refusal` checks
SCORE_STAGE = ROLLOUT_COMPUTE_LOG_PROB
#: the stages only the gate's CPU support dumps
CPU_STAGES = (*CRITIC_STAGES, ROLLOUT_STAGE)
#: the rollout engines whose verl 0.9.1 server answers ``generate`` asked for ``prompt_logprobs`` (the scoring call)
SCORING_ENGINES = ("vllm", "sglang")
#: the sampling params at which an engine's prompt log-probs are the distribution it samples from: they are computed
#: before its sampling processors (docs/consistency.md, "What a device adapter must answer")
NEUTRAL_SAMPLING = {"temperature": (1.0,), "top_k": (-1, 0), "top_p": (1.0,)}
#: the module verl imports in each of its processes on every device: a rank records its stack
#: (precision_harness/runs/host/rank_env.py)
RANK_STACK_MODULE = "precision_harness.runs.verl.rank_stack"
#: the module verl imports in each of its processes on every device: FSDP2's all-gather buffers zero-filled
#: (precision_harness/runs/verl/fsdp2_buffers.py)
FSDP2_BUFFERS_MODULE = "precision_harness.runs.verl.fsdp2_fill"
#: the module verl imports in each of its processes on CPU (VERL_USE_EXTERNAL_MODULES)
CPU_MODULE = "precision_harness.runs.verl.cpu.extension"
#: the module verl imports in each of its processes on CPU, and at ``level: auto`` on every device: the precision
#: debugger's stage window, its clock and ``stage_outputs.json`` (precision_harness/runs/verl/stages/)
STAGES_MODULE = "precision_harness.runs.verl.stages.extension"
#: the platform and rollout replica that module registers
CPU_PLATFORM = "precision_cpu"
#: the agent loop the gate selects on cpu (``actor_rollout_ref.rollout.agent.default_agent_loop``), and the
#: registry file naming it (``agent.agent_loop_config_path``): :mod:`precision_harness.runs.verl.cpu.agent_loop`
CPU_AGENT_LOOP = "precision_cpu_single_turn"
CPU_AGENT_LOOP_FILE = str(Path(__file__).parent / "cpu" / "agent_loops.yaml")
#: ``trainer.v1.sampler.custom_sampler.{path,name}``: :mod:`precision_harness.runs.verl.cpu.sampler`
CPU_SAMPLER = ("pkg://precision_harness.runs.verl.cpu.sampler", "OrderedReplayBuffer")
#: set for a ``level: auto`` run: the stage window (:data:`STAGES_MODULE`) writes each profiled stage's
#: ``stage_outputs.json``
STAGE_OUTPUTS_ENV = "PRECISION_STAGE_OUTPUTS"
_PD = "global_profiler.global_tool_config.precision_debugger"


def missing_reason(scenario_path: Path) -> str | None:
    """The one line saying verl is not installed for the scenario at ``scenario_path``, or None (it is)."""
    if installed_version() is not None:
        return None
    return f"{scenario_path}: engine: verl needs verl installed in this environment; {VERL_FIX}"


def check_engine(scenario_path: Path, stages: list[str]) -> None:
    """verl must be installed, and dump every declared stage.

    Raises:
        VerlMissingError: verl is missing (says to install verl itself; the scenario's items cannot run).
        ScenarioError: a declared stage is one verl does not dump.
    """
    missing = missing_reason(scenario_path)
    if missing is not None:
        raise VerlMissingError(missing)
    version = installed_version()
    missing = [s for s in stages if s not in (*DUMPED_STAGES, *CPU_STAGES, SCORE_STAGE)]
    if missing:
        raise ScenarioError(
            f"{scenario_path}: {_PD}.stages: verl {version} does not dump {missing[0]!r}; "
            f"its trainer dumps {', '.join(DUMPED_STAGES)}, and {', '.join(CPU_STAGES)} on cpu; the gate adds "
            f"{SCORE_STAGE} under pinned rollouts (checked against verl {CHECKED_VERSION})"
        )


def check_device_stages(scenario_path: Path, stages: list[str], device: str, overrides: dict[str, Any]) -> None:
    """Raise ScenarioError for a critic or rollout stage off the CPU (only the gate's CPU support dumps them), and
    for ``rollout_compute_log_prob`` where the engine cannot score (:func:`score_refusal`)."""
    cpu_only = [s for s in stages if s in CPU_STAGES]
    if cpu_only and device != "cpu":
        why = {
            ROLLOUT_STAGE: "verl's debugger skips the rollout; the gate's CPU rollout server records it",
        }.get(cpu_only[0], "nothing in its critic worker is annotated; the gate's CPU support annotates it")
        raise ScenarioError(
            f"{scenario_path}: {_PD}.stages: verl {CHECKED_VERSION} does not dump {cpu_only[0]!r} on {device} "
            f"({why}): remove it, or run with --precision-device cpu"
        )
    refusal = score_refusal(overrides, device) if SCORE_STAGE in stages else None
    if refusal is not None:
        raise ScenarioError(
            f"{scenario_path}: {_PD}.stages: {SCORE_STAGE} on {device}: the rollout engine is not gated in this run: "
            f"{refusal}"
        )


def score_refusal(overrides: dict[str, Any], device: str) -> str | None:
    """Why the rollout engine of a verl scenario with ``overrides`` cannot score pinned responses on ``device``,
    ending in what to do; None where it can (the gate's CPU server always can).

    Off the CPU: verl 0.9.1 (:mod:`.engine_scoring` reaches into its trainer), an engine of
    :data:`SCORING_ENGINES`, the sampling params of :data:`NEUTRAL_SAMPLING` (the engine's prompt log-probs ignore
    them), and an explicit ``max_model_len`` that leaves a full prompt and response room for the one token a
    scoring request asks for (unset, verl takes the model's ``max_position_embeddings``).
    """
    if device == "cpu":
        return None
    rollout = "actor_rollout_ref.rollout."
    name = overrides.get(rollout + "name")
    version = installed_version()
    if version not in SUPPORTED_VERSIONS:
        return (
            f"the scoring reaches into verl {', '.join(SUPPORTED_VERSIONS)}'s trainer, and verl {version} is installed"
        )
    if name not in SCORING_ENGINES:
        return (
            f"verl.overrides: {rollout}name is {name!r}, and only the verl servers of {', '.join(SCORING_ENGINES)} "
            f"answer prompt_logprobs; remove {SCORE_STAGE}"
        )
    for key, neutral in NEUTRAL_SAMPLING.items():
        value = overrides.get(rollout + key, neutral[0])
        if not isinstance(value, int | float) or float(value) not in neutral:
            return (
                f"verl.overrides: {rollout}{key} is {value!r}, and {name}'s prompt log-probs are computed before its "
                f"sampling processors, so they score what it samples only at temperature 1, top_k -1 and top_p 1; "
                f"set those, or remove {SCORE_STAGE}"
            )
    return _room_refusal(overrides)


def _room_refusal(overrides: dict[str, Any]) -> str | None:
    """An explicit ``max_model_len`` below prompt + response + 1 (verl's defaults: 512 each), else None."""
    key = "actor_rollout_ref.rollout.max_model_len"
    limit = overrides.get(key)
    lengths = [overrides.get(f"data.max_{k}_length", 512) for k in ("prompt", "response")]
    if not isinstance(limit, int) or not all(isinstance(n, int) for n in lengths):
        return None
    need = sum(lengths) + 1
    if limit >= need:
        return None
    return (
        f"verl.overrides: {key} is {limit}, and a scoring request of a full prompt and response ({sum(lengths)} "
        f"tokens) needs room for one more; set it to at least {need}, or remove {SCORE_STAGE}"
    )


def check_device_invariants(scenario: Any, device: str) -> None:
    """Raise ScenarioError for ``weight_sync`` off the CPU: only the gate's CPU rollout server records digests."""
    if scenario.invariants.weight_sync and device != "cpu":
        raise ScenarioError(
            f"{scenario.path}: invariants.weight_sync: verl's rollout engines record no per-parameter digests on "
            f"{device}; the gate's CPU rollout server does: remove it, or run with --precision-device cpu"
        )


def check_stage_window_version(scenario: Any, device: str) -> None:
    """Raise ScenarioError for ``level: auto`` on ``cuda``/``npu`` under a verl the stage window was not checked
    against (on cpu, :func:`check_cpu_version` refuses it for the whole CPU support)."""
    version = installed_version()
    if scenario.localizes and device != "cpu" and version not in SUPPORTED_VERSIONS:
        raise ScenarioError(f"{scenario.path}: {stage_window_version_message(version)}")


def check_cpu_version(scenario_path: Path) -> None:
    """Raise ScenarioError unless the installed verl is one the CPU support was tested with."""
    version = installed_version()
    if version not in SUPPORTED_VERSIONS:
        raise ScenarioError(f"{scenario_path}: {unsupported_version_message(version)}")


def external_modules(
    device: str, environ: Mapping[str, str] | None = None, *, stage_window: bool = False
) -> dict[str, str]:
    """``VERL_USE_EXTERNAL_MODULES`` for a run on ``device``: the CPU support first on cpu, the stage window on cpu
    and wherever ``stage_window`` (``level: auto``), then the rank stack hook and FSDP2's zero-filled buffers
    (every device), then the modules ``environ`` (default: this process's) already names, each once."""
    own = (os.environ if environ is None else environ).get("VERL_USE_EXTERNAL_MODULES", "")
    stages = [STAGES_MODULE] if device == "cpu" or stage_window else []
    gate = [*([CPU_MODULE] if device == "cpu" else []), *stages, RANK_STACK_MODULE, FSDP2_BUFFERS_MODULE]
    modules = [*gate, *(m for m in own.split(",") if m and m not in gate)]
    return {"VERL_USE_EXTERNAL_MODULES": ",".join(modules)}  # verl/__init__.py imports each, in every process


def cpu_env(environ: Mapping[str, str] | None = None, *, cpu_kernels: str = "portable") -> dict[str, str]:
    """The variables that make verl load the CPU support in every process it starts (its extension hook).

    Modules ``environ`` (default: this process's) already names in ``VERL_USE_EXTERNAL_MODULES`` are kept,
    after the CPU support, which registers the platform they may need. ``cpu_kernels`` is the scenario's
    ``trainer.cpu_kernels`` (``portable`` or ``vendor``), which each process applies.
    """
    return {
        **external_modules("cpu", environ),
        "VERL_PLATFORM": CPU_PLATFORM,  # the platform it registers (verl would fall back to nvidia/NCCL)
        "VERL_ENGINE_DEVICE": "cuda",  # verl's engine registry has FSDP under cuda/nvidia only
        "VERL_ENGINE_VENDOR": "nvidia",
        "TOKENIZERS_PARALLELISM": "false",
        "PRECISION_CPU_KERNELS": cpu_kernels,  # read by verl_cpu.kernels in every verl process
    }


def _positive(scenario_path: Path, overrides: dict[str, Any], key: str) -> int:
    value = overrides.get(key, 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScenarioError(f"{scenario_path}: verl.overrides: {key}: expected a positive integer")
    return value


def cpu_ranks(scenario_path: Path, overrides: dict[str, Any], limit: int | None = None) -> int:
    """The ranks a verl scenario asks for on the CPU: ``trainer.nnodes`` (default 1) x ``trainer.n_gpus_per_node``
    (default 1; verl's own default, 8, is not what a CPU runs).

    Each rank is a worker process computing on one thread, so at most ``limit`` (default: this machine's
    CPU count) can run.

    Raises:
        ScenarioError: either is not a positive integer, or their product is more than ``limit`` (one line naming
            the keys and the limit).
    """
    limit = limit if limit is not None else (os.cpu_count() or 1)
    per_node = _positive(scenario_path, overrides, "trainer.n_gpus_per_node")
    ranks = _positive(scenario_path, overrides, "trainer.nnodes") * per_node
    if ranks > limit:
        keys = "trainer.n_gpus_per_node" if "trainer.nnodes" not in overrides else "trainer.nnodes x n_gpus_per_node"
        raise ScenarioError(
            f"{scenario_path}: verl.overrides: {keys}: {ranks} ranks on cpu, but this machine runs "
            f"at most {limit} (one worker process per CPU core); lower it to {limit} or fewer"
        )
    return ranks


def cpu_overrides(*, critic: bool, ranks: int = 1, joins_ray: bool = False, nnodes: int = 1) -> dict[str, Any]:
    """The resource and engine settings verl's trainer needs on the CPU (gate-owned on ``cpu``) for ``ranks``
    worker processes in all (over ``trainer.nnodes``, the scenario's); with a ``critic``, its engine settings and
    its profiler on (the gate's CPU support dumps its stages). ``joins_ray``: the run joins a running Ray instance
    (the gate's shared one, or ``--precision-ray-address``), whose resources were given when it started: Ray
    refuses them again."""
    out: dict[str, Any] = (
        {}
        if joins_ray
        else {
            # TransferQueue's storage units take 1 CPU each (8 by default) and never schedule on 2 cores
            "ray_kwargs.ray_init.num_cpus": 8,
            # verl's single controller hard-codes use_gpu=True: one declared Ray GPU per rank, which no process uses
            "+ray_kwargs.ray_init.num_gpus": ranks,
            # nothing reads Ray's dashboard in a gate run; it is a dozen more processes to start
            "+ray_kwargs.ray_init.include_dashboard": False,
        }
    )
    out |= {
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        # one agent-loop and one reward worker (8 each by default, each a process importing torch and verl):
        # which worker serves a prompt changes no number here (a seed per request, batches in prompt order)
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        # the scenario's (default one machine): verl places each node's ranks in a placement group of their own
        "trainer.nnodes": nnodes,
        # no FlashAttention on CPU
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.model.use_remove_padding": False,
        # FSDP1 needs an accelerator; FSDP2 runs on gloo
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.ref.strategy": "fsdp2",
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.ref.use_torch_compile": False,
        # the replica samples from the policy: one server over every rank (verl's rollout TP = ranks)
        "actor_rollout_ref.rollout.name": CPU_PLATFORM,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": ranks,
        "actor_rollout_ref.rollout.full_determinism": True,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        # a seed per request (prompt index, step, sample) and batches in prompt order, whatever the arrival order
        "actor_rollout_ref.rollout.agent.default_agent_loop": CPU_AGENT_LOOP,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": CPU_AGENT_LOOP_FILE,
        "trainer.v1.sampler.custom_sampler.path": CPU_SAMPLER[0],
        "trainer.v1.sampler.custom_sampler.name": CPU_SAMPLER[1],
    }
    if critic:
        out.update(
            {
                "critic.strategy": "fsdp2",
                "+critic.model.override_config.attn_implementation": "sdpa",
                "critic.model.use_remove_padding": False,
                "critic.fsdp.use_torch_compile": False,
                # the value head is initialised from torch's RNG, which verl seeds only under full_determinism
                "critic.fsdp.full_determinism": True,
                # verl leaves the critic's profiler off; compute_values and critic_update run inside it
                "critic.profiler.enable": True,
                "critic.profiler.all_ranks": True,
            }
        )
    return out


def rollout_engine_name(overrides: Mapping[str, Any], device: str) -> str:
    """``actor_rollout_ref.rollout.name`` as a run on ``device`` has it: on cpu the gate's rollout server
    (:func:`cpu_overrides`), elsewhere the scenario's (verl 0.9.1 has no default: ``???``)."""
    if device == "cpu":
        return CPU_PLATFORM
    return str(overrides.get("actor_rollout_ref.rollout.name", "unknown"))


def uses_critic(overrides: dict[str, Any]) -> bool:
    """Whether verl's trainer builds a critic for these overrides (verl's ``need_critic``)."""
    if overrides.get("critic.enable") is not None:
        return bool(overrides["critic.enable"])
    return overrides.get("algorithm.adv_estimator") == "gae"


def check_cpu_overrides(scenario_path: Path, overrides: dict[str, Any], cpu: dict[str, Any]) -> None:
    """Raise ScenarioError for a scenario override of a key the gate owns on the CPU."""
    owned = {key.lstrip("+") for key in cpu}
    for key in overrides:
        if key.lstrip("+") in owned:
            raise ScenarioError(
                f"{scenario_path}: verl.overrides: {key.lstrip('+')} is set by the gate on cpu (the CPU platform, "
                "rollout replica and resources, docs/scenarios.md); remove it"
            )


def gate_overrides(
    *, steps: list[int], stages: list[str], strict: bool, save_path: Path, config_path: Path, rollouts: Path | None
) -> dict[str, Any]:
    """The overrides the gate owns (``rollouts``: where pinned rollouts are saved and loaded, None: not pinned)."""
    last = max(steps)
    out: dict[str, Any] = {
        "global_profiler.tool": "precision_debugger",
        "global_profiler.steps": list(steps),
        "global_profiler.save_path": str(save_path),
        f"{_PD}.config_path": str(config_path),
        f"{_PD}.stages": list(stages),
        f"{_PD}.strict": strict,
        "actor_rollout_ref.actor.profiler.enable": True,
        # every rank dumps (verl's default is none but the ranks listed): the gate checks each
        "actor_rollout_ref.actor.profiler.all_ranks": True,
        "trainer.total_training_steps": last,
        "trainer.logger": ["console", "file"],
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
    }
    if rollouts is not None:
        out.update(
            {
                "skip.rollout_tq.enable": True,
                "skip.rollout_tq.steps": list(range(1, last + 1)),
                "skip.rollout_tq.dump_dir": str(rollouts),
                "skip.rollout_tq.action": "cache",
            }
        )
    return out


#: keys the gate sets on every verl run; a scenario may not override them
OWNED = tuple(
    gate_overrides(steps=[1], stages=[], strict=False, save_path=Path("."), config_path=Path("."), rollouts=Path("."))
)


def check_user_overrides(scenario_path: Path, overrides: dict[str, Any]) -> None:
    """Raise ScenarioError for an override of a key the gate owns."""
    for key in overrides:
        if key in OWNED or key.startswith(("global_profiler.", "skip.rollout_tq.")):
            raise ScenarioError(
                f"{scenario_path}: verl.overrides: {key} is set by the gate (profiler, steps, logger, rollout "
                "pinning); remove it, or set it through the scenario's own keys (global_profiler, verl.pin_rollouts)"
            )


def command_spec(
    scenario: Any, env: dict[str, str], run_dir: Path, device: str, joins_ray: bool = False
) -> CommandSpec:
    """A verl scenario's run: its entrypoint with the user's overrides, the gate's (:func:`gate_overrides`)
    and, on cpu, :func:`cpu_overrides` and :func:`cpu_env`; ``env`` (the ``PRECISION_*`` variables)
    gains verl's file logger. The log header lists every gate-owned override and variable.

    Raises:
        ScenarioError: a critic stage, ``rollout_generate`` or ``weight_sync`` off the cpu, a torch the gate cannot run
            under (:func:`~precision_harness.runs.verl.fsdp2_buffers.refusal`), ``level: auto`` off the cpu
            under a verl the stage window was not checked with, or on cpu an unsupported verl or an override of a
            CPU-owned key.
    """
    verl = scenario.config["verl"]
    user = dict(verl["overrides"])
    gate = gate_overrides(
        steps=list(scenario.steps),
        stages=[s for s in scenario.stages if s not in (ROLLOUT_STAGE, SCORE_STAGE)],
        strict=bool(scenario.profiler["strict"]),
        save_path=run_dir,
        config_path=Path(env[ENV_MSPROBE_CONFIG]),
        rollouts=run_dir / ROLLOUTS if verl["pin_rollouts"] else None,
    )
    # fresh steps (verl.fresh_steps) run past the pinned ones, outside skip.rollout_tq.steps: verl samples them
    gate["trainer.total_training_steps"] = scenario.total_steps
    env["VERL_FILE_LOGGER_PATH"] = env[ENV_METRICS]  # verl's FileLogger writes {"step", "data"} lines there
    # every process's lines keep their "(Role pid=N)" prefix: the start-up profile names processes by it
    env["RAY_DEDUP_LOGS"] = "0"
    owned_env = {"VERL_FILE_LOGGER_PATH": env[ENV_METRICS], "RAY_DEDUP_LOGS": "0"}
    check_device_stages(scenario.path, list(scenario.stages), device, user)
    check_device_invariants(scenario, device)
    unsupported = fsdp2_buffers.installed_refusal()
    if unsupported is not None:
        raise ScenarioError(f"{scenario.path}: {unsupported}")
    check_stage_window_version(scenario, device)
    if device == "cpu":
        check_cpu_version(scenario.path)
        ranks = cpu_ranks(scenario.path, user)
        nnodes = user.pop("trainer.nnodes", 1)
        check_cpu_overrides(scenario.path, user, cpu_overrides(critic=uses_critic(user), ranks=ranks))
        cpu = cpu_overrides(critic=uses_critic(user), ranks=ranks, joins_ray=joins_ray, nnodes=nnodes)
        # the scenario's own key, or verl's default (8) replaced by one rank
        gate = {**cpu, "trainer.n_gpus_per_node": ranks // nnodes, **gate}
        variables = cpu_env(cpu_kernels=scenario.config["trainer"].get("cpu_kernels", "portable"))
    else:
        variables = external_modules(device, stage_window=scenario.localizes)
    if scenario.fresh_steps:
        fresh_steps.check_log_probs(scenario.path, {**user, **gate})
    if scenario.localizes:  # level auto: each profiled stage's inputs and outputs (verl/stages/stage_window.py)
        variables[STAGE_OUTPUTS_ENV] = "1"
    pinned = [pinning.gate_env(variables)] if verl["pin_rollouts"] else []  # the reward scored again
    owned_env.update(variables)
    env.update(variables)
    header = [version_line(device), *pinned]
    header.append(f"precision gate: verl on {device}: gate-owned overrides (docs/scenarios.md):")
    header += [f"precision gate:   {k}={hydra_value(v)}" for k, v in gate.items()]
    header += [f"precision gate:   env {k}={v}" for k, v in owned_env.items()]
    header.append(fsdp2_buffers.fill_line())
    # Hydra's own output folder (config snapshot, its log) in the run folder, not the scenario's
    hydra = {"hydra.run.dir": str(run_dir / "hydra")}
    generate = None
    if scenario.fresh_steps:  # the recording's pass 1 only saves the pinned steps' rollouts: it ends at the last
        last = max(scenario.steps)
        header.append(
            f"precision gate: fresh steps {', '.join(map(str, scenario.fresh_steps))} (verl.fresh_steps): verl samples "
            f"them, outside skip.rollout_tq.steps; a recording's pass 1 ends at step {last}"
        )
        generate = argv(verl["entrypoint"], {**user, **gate, "trainer.total_training_steps": last, **hydra})
    return CommandSpec(
        argv(verl["entrypoint"], {**user, **gate, **hydra}),
        env,
        tuple(verl["metrics_exclude"]),
        header,
        timings=verl_profile.timings,
        fresh_steps=scenario.fresh_steps,
        generate_argv=generate,
    )
