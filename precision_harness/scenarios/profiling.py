"""What a scenario profiles, in verl's and msprobe's words: the precision debugger's stages, the levels.

Every kind of scenario declares its profiled stages and its msprobe level under verl's
``global_profiler.global_tool_config.precision_debugger``; the runs, the golden store, the check and
the report name stages and levels through these constants.
"""

from __future__ import annotations

#: verl's PrecisionDebugger stages (verl/utils/profiler/precision_debugger), in the order a PPO step runs them, with
#: the gate's own ``rollout_compute_log_prob`` after the rollout (:data:`ROLLOUT_COMPUTE_LOG_PROB`).
STAGES: tuple[str, ...] = (
    "rollout_generate",
    "rollout_compute_log_prob",
    "compute_rm_score",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
)
#: the rollout engine's stage: opt-in (listed in ``precision_debugger.stages``), built-in scenarios only,
#: because verl's PrecisionDebugger skips it ("rollout_generate is ignored"): docs/consistency.md
ROLLOUT_GENERATE = "rollout_generate"
#: the rollout engine's log-probs of the pinned responses, teacher-forced after the weight sync, and their mismatch
#: with the training forward's: opt-in, verl scenarios with pinned rollouts on cpu only (the gate's rollout server
#: scores; precision_harness/runs/verl/engine_scoring.py). Not a stage of verl's debugger: the gate records it.
ROLLOUT_COMPUTE_LOG_PROB = "rollout_compute_log_prob"
#: the stages the gate records itself, never verl's debugger: never in a default stage list
GATE_STAGES = (ROLLOUT_GENERATE, ROLLOUT_COMPUTE_LOG_PROB)

#: ``level: auto``: gate on an L0 dump plus the runner's stage inputs/outputs, localise a failing
#: stage by rerunning it at :data:`LOCALIZE_LEVEL` (docs/scenarios.md#level-auto).
AUTO = "auto"
#: the msprobe level an ``auto`` scenario dumps for the gate
AUTO_DUMP_LEVEL = "L0"
#: the msprobe level a failing ``auto`` stage is localised at (and the golden's second record)
LOCALIZE_LEVEL = "L1"
LEVEL_KEY = "global_profiler.global_tool_config.precision_debugger.level"
#: the key that lists a scenario's profiled stages
STAGES_KEY = "global_profiler.global_tool_config.precision_debugger.stages"

#: msprobe's task key, and the task that saves each collected tensor (``dump_tensor_data/``) beside its statistics
TASK_KEY = "global_profiler.global_tool_config.precision_debugger.task"
TENSOR_TASK = "tensor"
#: msprobe's ``list``: the API names a dump is scoped to (a substring match on ``Functional.linear.0.forward``)
LIST_KEY = "global_profiler.global_tool_config.precision_debugger.list"
#: Keys of the msprobe config.json that a scenario may set inline or through ``config_path``.
MSPROBE_KEYS = ("task", "level", "scope", "list", "rank", "data_mode", "summary_mode")
