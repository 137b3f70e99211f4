"""Every patch of verl internals the CPU run needs, in one place, for verl 0.9.1 only.

Each entry names the verl function or table it replaces and why. :func:`apply` refuses any other
verl version (the package's ``__init__`` already did, in one line); a new verl version must be read
again, each patch re-checked, and added to :data:`precision_harness.verl_engine.SUPPORTED_VERSIONS`.

1. ``verl.utils.distributed.initialize_global_process_group_ray`` (bound by name in
   ``verl.workers.engine_workers`` and ``verl.checkpoint_engine.base``): its default backend is the
   hard-coded string ``f"cpu:gloo,{device}:{backend}"``, which on the CPU is ``cpu:gloo,cpu:gloo``,
   a device type given twice, which torch refuses. Replaced by the same call with ``backend="cpu:gloo"``
   when the caller gives none.
2. ``CPUOffloadPolicy`` as ``verl.workers.engine.fsdp.transformer_impl`` uses it: the FSDP2 reference
   model (``forward_only``) is built with ``CPUOffloadPolicy(pin_memory=True)``; pinning host memory
   needs an accelerator. Replaced there by the same policy with ``pin_memory=False``.
3. ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` (private): the worker-side rollout class is looked
   up in this table by ``(name, mode)``, and verl has no public way to add one. The entry
   ``("precision_cpu", "async")`` names :class:`precision_harness.verl_cpu.rollout.CPUServerAdapter`.
4. Test hook only, off unless ``PRECISION_TEST_PLANT=advantages`` (:mod:`precision_harness.runner.plant`):
   every estimator in ``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY`` is wrapped to scale the
   advantages it returns by ``1 + 1e-4``, in the registry (``get_adv_estimator_fn``) and as the
   ``core_algos`` attribute it was registered from (``compute_advantage`` in ``ray_trainer.py`` calls
   GRPO and GAE that way): the planted change the gate's tests expect to fail ``actor_update`` at step 1.
"""

from __future__ import annotations

import functools
from typing import Any

from precision_harness.verl_engine import SUPPORTED_VERSIONS, unsupported_version_message

CPU_BACKEND = "cpu:gloo"


def _process_group(original: Any) -> Any:
    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or CPU_BACKEND)

    initialize_global_process_group_ray.__precision_patched__ = True
    return initialize_global_process_group_ray


def _offload_policy(original: Any) -> Any:
    def CPUOffloadPolicy(*args: Any, pin_memory: bool = True, **kwargs: Any) -> Any:
        return original(*args, pin_memory=False, **kwargs)

    CPUOffloadPolicy.__precision_patched__ = True
    return CPUOffloadPolicy


def _planted_estimator(original: Any, scale: float) -> Any:
    @functools.wraps(original)
    def estimator(*args: Any, **kwargs: Any) -> Any:
        advantages, returns = original(*args, **kwargs)
        return advantages * scale, returns

    estimator.__precision_patched__ = True
    return estimator


def apply(version: str) -> None:
    """Apply the patches above (idempotent).

    Raises:
        RuntimeError: ``version`` is not one the patches were checked against (one line).
    """
    if version not in SUPPORTED_VERSIONS:
        raise RuntimeError(unsupported_version_message(version))
    import verl.checkpoint_engine.base as checkpoint_base
    import verl.utils.distributed as distributed
    import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
    import verl.workers.engine_workers as engine_workers
    import verl.workers.rollout.base as rollout_base

    original = distributed.initialize_global_process_group_ray
    if not getattr(original, "__precision_patched__", False):
        patched = _process_group(original)
        for module in (distributed, engine_workers, checkpoint_base):
            module.initialize_global_process_group_ray = patched
    if not getattr(fsdp_impl.CPUOffloadPolicy, "__precision_patched__", False):
        fsdp_impl.CPUOffloadPolicy = _offload_policy(fsdp_impl.CPUOffloadPolicy)
    rollout_base._ROLLOUT_REGISTRY[("precision_cpu", "async")] = "precision_harness.verl_cpu.rollout.CPUServerAdapter"

    from precision_harness.runner.plant import factor

    scale = factor("advantages")
    if scale != 1.0:
        import verl.trainer.ppo.core_algos as core_algos

        registry = core_algos.ADV_ESTIMATOR_REGISTRY
        for name, fn in list(registry.items()):
            if getattr(fn, "__precision_patched__", False):
                continue
            planted = _planted_estimator(fn, scale)
            registry[name] = planted
            # verl.trainer.ppo.ray_trainer.compute_advantage calls GAE and GRPO as core_algos attributes
            for attr, value in list(vars(core_algos).items()):
                if value is fn:
                    setattr(core_algos, attr, planted)
