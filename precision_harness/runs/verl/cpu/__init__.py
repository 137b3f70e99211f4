"""verl on CPU: what verl 0.9.1's real trainer needs to run ``main_ppo`` without an accelerator.

Loaded by verl itself, in every process it starts (the driver, the TaskRunner, each worker), through
its extension hook: the gate sets ``VERL_USE_EXTERNAL_MODULES=precision_harness.runs.verl.cpu.extension``
and ``VERL_PLATFORM=precision_cpu`` (:func:`precision_harness.runs.verl.engine.cpu_env`), and ``import verl``
imports :mod:`.extension`, which:

1. refuses a verl other than the versions tested (:data:`precision_harness.runs.verl.release.SUPPORTED_VERSIONS`),
   in one line;
2. sets the process's numerics (:mod:`.kernels`: threads, the portable matrix kernels, CPU autocast with
   the GPU's float32 op lists, :mod:`.autocast_policy`);
3. registers the CPU platform ``precision_cpu`` (:mod:`.platform`) with verl's public
   ``PlatformRegistry.register``;
4. registers the rollout replica ``precision_cpu`` (:mod:`.rollout`, sampling with :mod:`.policy_server`)
   with verl's public ``RolloutReplicaRegistry.register``;
5. applies the CPU's patches of verl internals (:mod:`.patches`). The patches every device shares (the
   precision debugger's stage window, msprobe's time) are :mod:`precision_harness.runs.verl.stages`, which
   verl imports after this module (:data:`precision_harness.runs.verl.engine.STAGES_MODULE`).

Two more modules are named in verl's config by the gate rather than imported here: the agent loop
:mod:`.agent_loop` (a seed per request; ``rollout.agent.agent_loop_config_path``) and the replay buffer
:mod:`.sampler` (batches in prompt order; ``trainer.v1.sampler.custom_sampler``).

Importing this package itself does nothing; :mod:`.extension`, :mod:`.platform` and :mod:`.patches`
import torch and verl, and the gate's own process never imports them.
"""
