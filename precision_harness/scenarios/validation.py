"""Cross-field checks of a loaded scenario: what the JSON Schema cannot say.

Each check takes the scenario (:class:`~precision_harness.scenarios.base.ScenarioBase`) and raises a
one-line :class:`~precision_harness.errors.ScenarioError` naming the file and the key; each kind
lists the checks it runs (``consistency_checks``), and loading runs them in that order.
"""

from __future__ import annotations

from typing import Any

from precision_harness.errors import ScenarioError
from precision_harness.scenarios import fresh_steps
from precision_harness.scenarios.base import ScenarioBase
from precision_harness.scenarios.defaults import uses_critic
from precision_harness.scenarios.profiling import (
    LEVEL_KEY,
    LIST_KEY,
    ROLLOUT_COMPUTE_LOG_PROB,
    ROLLOUT_GENERATE,
    STAGES,
    STAGES_KEY,
    TASK_KEY,
    TENSOR_TASK,
)


def check_stages(s: ScenarioBase) -> None:
    """With ``strict: true`` every listed stage is one of verl's and runs in this scenario."""
    pd = s.profiler
    if not pd["strict"]:
        return
    unknown = [x for x in pd["stages"] if x not in STAGES]
    if unknown:
        raise ScenarioError(
            f"{s.path}: {STAGES_KEY}: unknown stage {unknown[0]!r} (strict: true); expected one of {', '.join(STAGES)}"
        )
    not_run = [x for x in pd["stages"] if x not in s.executed_stages]
    if not_run:
        raise ScenarioError(
            f"{s.path}: {STAGES_KEY}: stage {not_run[0]!r} never runs in this scenario (strict: true); "
            "enable its role or remove it from stages"
        )


def check_rollout_generate(s: ScenarioBase) -> None:
    """``rollout_generate`` is dumped by the built-in loop and the gate's verl CPU rollout only: verl's debugger
    skips the rollout."""
    if ROLLOUT_GENERATE in s.profiler["stages"] and not s.dumps_rollout:
        raise ScenarioError(
            f"{s.path}: {STAGES_KEY}: {ROLLOUT_GENERATE} is not dumped by verl (its PrecisionDebugger skips the "
            f'rollout: "rollout_generate is ignored"), so a {s.kind} scenario cannot gate it; remove it from stages'
        )


def check_rollout_compute_log_prob(s: ScenarioBase) -> None:
    """``rollout_compute_log_prob`` is the rollout engine scoring the pinned responses in verl's trainer: a verl
    scenario with ``verl.pin_rollouts: true`` only (without pinned responses, sampled tokens have no golden)."""
    if ROLLOUT_COMPUTE_LOG_PROB not in s.profiler["stages"]:
        return
    if s.kind != "verl" or not s.pins_rollouts:
        raise ScenarioError(
            f"{s.path}: {STAGES_KEY}: {ROLLOUT_COMPUTE_LOG_PROB} is the rollout engine scoring pinned responses, "
            f"which only an engine: verl scenario with verl.pin_rollouts: true has; remove it from stages or pin them"
        )


def check_invariants(s: ScenarioBase) -> None:
    """The ``invariants:`` key parses for this kind (one line naming the file and the key)."""
    s.invariants  # noqa: B018 -- parsing is the check


def check_fresh_steps(s: ScenarioBase) -> None:
    """``verl.fresh_steps`` follows pinned rollouts and needs verl's rollout log-probs (:func:`.fresh_steps.check`)."""
    fresh_steps.check(s.path, s.config)


def check_task(s: ScenarioBase) -> None:
    """``task: tensor`` saves every tensor it collects to disk: it must be scoped to named APIs (msprobe's ``list``)."""
    if s.profiler["task"] == TENSOR_TASK and not s.profiler["list"]:
        raise ScenarioError(
            f"{s.path}: {TASK_KEY}: tensor saves every tensor it collects; name the APIs in {LIST_KEY} "
            "(e.g. [Functional.linear.0.forward]) or use task: statistics"
        )


def check_level(s: ScenarioBase) -> None:
    """``level: auto`` needs each stage's inputs and outputs beside the L0 dump: the built-in runner writes them, and
    on the CPU the gate's extension in verl's processes; a command's own process does not."""
    if s.localizes and not s.allows_auto:
        raise ScenarioError(
            f"{s.path}: {LEVEL_KEY}: auto needs each stage's inputs and outputs beside the L0 dump, which the built-in "
            f"runner and engine: verl on cpu write; a {s.kind} scenario sets L0, L1 or mix"
        )


def check_steps(s: ScenarioBase) -> None:
    total = s.config["trainer"]["total_training_steps"]
    bad_steps = [x for x in s.steps if x > total]
    if bad_steps:
        raise ScenarioError(
            f"{s.path}: global_profiler.steps: step {bad_steps[0]} is past trainer.total_training_steps={total}"
        )


def _training_roles(s: ScenarioBase) -> list[tuple[str, dict[str, Any]]]:
    """``(config key, section)`` of every role that runs PPO updates: the actor, and the critic when it runs."""
    roles = [("actor_rollout_ref.actor", s.config["actor_rollout_ref"]["actor"])]
    return roles + ([("critic", s.config["critic"])] if uses_critic(s.config) else [])


def check_batches(s: ScenarioBase) -> None:
    """Mini-batches divide the batch (in prompts, as verl counts them); micro-batches divide mini-batches."""
    batch, n = s.config["data"]["train_batch_size"], s.config["actor_rollout_ref"]["rollout"]["n"]
    for role_key, role in _training_roles(s):
        mini = role["ppo_mini_batch_size"]
        if batch % mini:
            raise ScenarioError(
                f"{s.path}: {role_key}.ppo_mini_batch_size: {mini} must divide data.train_batch_size={batch} "
                "(verl counts mini-batches in prompts)"
            )
        micro = role["ppo_micro_batch_size_per_gpu"]
        if (mini * n) % micro:
            raise ScenarioError(
                f"{s.path}: {role_key}.ppo_micro_batch_size_per_gpu: {micro} must divide the mini-batch of "
                f"{mini * n} sequences (ppo_mini_batch_size x rollout.n)"
            )


def check_world_size(s: ScenarioBase) -> None:
    """Every data-parallel split must be whole: the batch, each role's mini-batch, and micro-batches per rank."""
    w = s.world_size
    if w == 1:
        return
    n = s.config["actor_rollout_ref"]["rollout"]["n"]
    n_seq = s.config["data"]["train_batch_size"] * n
    if n_seq % w:
        raise ScenarioError(
            f"{s.path}: trainer.world_size: {w} must divide the batch of {n_seq} sequences "
            "(data.train_batch_size x rollout.n)"
        )
    for role_key, role in _training_roles(s):
        mini_seqs, micro = role["ppo_mini_batch_size"] * n, role["ppo_micro_batch_size_per_gpu"]
        if mini_seqs % w or (mini_seqs // w) % micro:
            raise ScenarioError(
                f"{s.path}: {role_key}.ppo_micro_batch_size_per_gpu: {micro} must divide the per-rank mini-batch "
                f"of {mini_seqs}/{w} sequences (ppo_mini_batch_size x rollout.n / trainer.world_size)"
            )


def check_rollout_is(s: ScenarioBase) -> None:
    algo = s.config["algorithm"]
    if algo["rollout_is"] and algo["rollout_is_threshold"] is None:
        raise ScenarioError(
            f"{s.path}: algorithm.rollout_is: true applies IS weights but algorithm.rollout_is_threshold is null "
            "(rollout IS off); set a threshold such as 2.0, or rollout_is: false"
        )
    lower, upper = algo["rollout_is_threshold_lower"], algo["rollout_is_threshold"]
    if lower is not None and upper is not None and lower > upper:
        raise ScenarioError(
            f"{s.path}: algorithm.rollout_is_threshold_lower: {lower} is above rollout_is_threshold={upper}; "
            "expected lower <= upper (null defaults to 1/upper)"
        )


def check_algorithm(s: ScenarioBase) -> None:
    if s.config["algorithm"]["adv_estimator"] == "grpo" and s.config["actor_rollout_ref"]["rollout"]["n"] < 2:
        raise ScenarioError(f"{s.path}: actor_rollout_ref.rollout.n: GRPO needs n >= 2 responses per prompt, got 1")


def check_model(s: ScenarioBase) -> None:
    m = s.config["model"]
    if m["path"] is None and m["num_attention_heads"] % m["num_key_value_heads"]:
        raise ScenarioError(f"{s.path}: model.num_key_value_heads: must divide num_attention_heads")
