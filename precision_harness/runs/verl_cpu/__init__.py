"""verl on CPU: what verl 0.9.1's real trainer needs to run ``main_ppo`` without an accelerator.

Loaded by verl itself, in every process it starts (the driver, the TaskRunner, each worker), through
its extension hook: the gate sets ``VERL_USE_EXTERNAL_MODULES=precision_harness.runs.verl_cpu.extension``
and ``VERL_PLATFORM=precision_cpu`` (:func:`precision_harness.runs.verl_engine.cpu_env`), and ``import verl``
imports :mod:`.extension`, which:

1. refuses a verl other than the versions tested (:data:`precision_harness.runs.verl_engine.SUPPORTED_VERSIONS`),
   in one line;
2. registers the CPU platform ``precision_cpu`` (:mod:`.platform`) with verl's public
   ``PlatformRegistry.register``;
3. registers the rollout replica ``precision_cpu`` (:mod:`.rollout`) with verl's public
   ``RolloutReplicaRegistry.register``;
4. applies the patches of verl internals (:mod:`.patches`, the only module that patches verl).

Importing this package itself does nothing; :mod:`.extension`, :mod:`.platform` and :mod:`.patches`
import torch and verl, and the gate's own process never imports them.
"""
