"""The agent loop ``precision_cpu_single_turn``: verl's single-turn loop with a seed per request.

vLLM and SGLang sample each request from its own seed when ``sampling_params`` carries one; verl's
stock ``single_turn_agent`` passes none. This loop differs from it in one thing: before the request
goes out it sets ``sampling_params["seed"]`` from the rollout's ``seed``, the prompt's ``index``
(``extra_info.index`` in verl's RL parquet), the step the prompt was drawn at (``global_steps``) and the
sample (``session_id``, 0 .. rollout.n - 1) (:func:`~.policy_server.request_seed`), and tags the request
with those three numbers (``sampling_params["precision_sample"]``) so the server can record it in
(prompt, sample) order. Neither depends on when or where the request is served. verl selects it by
name (``actor_rollout_ref.rollout.agent.default_agent_loop``) from ``agent_loops.yaml`` beside this module,
which its ``agent.agent_loop_config_path`` reads (:data:`precision_harness.runs.verl.engine.CPU_AGENT_LOOP_FILE`).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from precision_harness.runs.verl.cpu.policy_server import SAMPLE_KEY, request_seed


def _number(value: Any) -> int:
    return int(value.item() if hasattr(value, "item") else value)


class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """``single_turn_agent`` with a per-request seed (see the module docstring)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        index, step, sample = (_number(kwargs[k]) for k in ("index", "global_steps", "session_id"))
        params = dict(sampling_params)
        params["seed"] = request_seed(int(self.rollout_config.seed), index, step, sample)
        params[SAMPLE_KEY] = [index, step, sample]
        return await super().run(params, **kwargs)
