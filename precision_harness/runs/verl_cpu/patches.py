"""Every patch of verl (and one of torch) internals the CPU run needs, in one place, for verl 0.9.1 only.

Each entry names the verl function or table it replaces and why. :func:`apply` refuses any other
verl version (the package's ``__init__`` already did, in one line); a new verl version must be read
again, each patch re-checked, and added to :data:`precision_harness.runs.verl_engine.SUPPORTED_VERSIONS`.

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
   ``("precision_cpu", "async")`` names :class:`precision_harness.runs.verl_cpu.rollout.CPUServerAdapter`.
4. The critic's stages. verl 0.9.1's precision debugger knows ``compute_values`` and ``critic_update``
   (``_STAGE_TO_ROLE`` in ``verl.utils.profiler.precision_debugger_profile``), but nothing annotates
   them: the critic is a bare ``verl.workers.engine_workers.TrainingWorker`` whose only annotation is
   ``train_batch`` (role ``"train_batch"``, which the debugger does not know and, under ``strict``,
   raises on). ``TrainingWorker.infer_batch`` and ``TrainingWorker.train_mini_batch`` are re-decorated
   as verl decorates ``ActorRolloutRefWorker.compute_log_prob``/``update_actor``: the stage inside
   ``@register`` (so TransferQueue's fetch is not dumped), for a value model only, the dumped model
   being ``engine.module``; and ``train_batch`` joins the debugger's ``_SKIP_STAGES`` (as verl skips
   ``rollout_generate``). Actor and reference workers are unchanged.
5. ``verl.utils.model.load_valuehead_model`` (imported by name at call time in
   ``verl.workers.engine.fsdp.transformer_impl``): it loads the critic with the hard-coded
   ``attn_implementation="flash_attention_2"``, which needs flash-attn and an accelerator, and
   without trl reports any failure as "not a value head model". Replaced by its first branch,
   ``AutoModelForTokenClassification.from_pretrained`` with the same arguments and ``"sdpa"``; when
   that fails, verl's own function runs (and reports).
6. torch's FSDP2 all-gather buffer (``DefaultAllocMixin.allocate`` in
   ``torch.distributed.fsdp._fully_shard._fsdp_collectives``, torch :data:`CHECKED_TORCH`), on the CPU only:
   with two or more ranks, ``all_gather_copy_in`` takes ``Tensor.narrow`` of a buffer ``torch.empty`` just
   allocated, before anything is copied in; msprobe's L1 dump records that call, so every multi-rank
   dump held statistics of uninitialised memory (189 ``Tensor.narrow`` rows differed between two
   otherwise identical runs, NaN and 3e38 among them). Allocated with ``torch.zeros`` on the CPU
   instead, those rows read zeros. What the all-gather computes is unchanged. Another torch version
   is left unpatched, with one line in the worker log saying so.
"""

from __future__ import annotations

import functools
from typing import Any

from precision_harness.runs.verl_engine import SUPPORTED_VERSIONS, unsupported_version_message

CPU_BACKEND = "cpu:gloo"
#: the torch versions patch 6 was read against
CHECKED_TORCH = ("2.13.0",)


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


def _critic_stage(func: Any, stage: str) -> Any:
    """``func`` (a ``TrainingWorker`` method) run inside the precision debugger's ``stage`` when the worker is
    the critic and its profiler runs this step; otherwise ``func`` unchanged."""
    from verl.utils.profiler.precision_debugger_profile import PrecisionDebuggerProfiler

    @functools.wraps(func)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        profiler = getattr(self, "profiler", None)
        impl = getattr(profiler, "_impl", None)
        active = (
            getattr(self.config, "model_type", None) == "value_model"
            and isinstance(impl, PrecisionDebuggerProfiler)
            and profiler.check_enable()
            and profiler.check_this_step()
            and profiler.check_this_rank()
        )
        if not active:
            return func(self, *args, **kwargs)
        started = impl.start(stage=stage, model=self.engine.module)
        try:
            return func(self, *args, **kwargs)
        finally:
            impl.stop(started=started)

    method.__precision_patched__ = True
    return method


def _annotate_critic(engine_workers: Any) -> None:
    import inspect

    import verl.utils.profiler.precision_debugger_profile as precision_profile
    from verl.single_controller.base.decorator import MAGIC_ATTR, register

    precision_profile._SKIP_STAGES.add("train_batch")
    worker = engine_workers.TrainingWorker
    for name, stage in (("infer_batch", "compute_values"), ("train_mini_batch", "critic_update")):
        registered = vars(worker)[name]
        if getattr(registered, "__precision_patched__", False):  # functools.wraps carries the mark outwards
            continue
        attrs = getattr(registered, MAGIC_ATTR)
        body = _critic_stage(inspect.unwrap(registered), stage)
        setattr(worker, name, register(**attrs)(body))


def _valuehead_loader(original: Any) -> Any:
    @functools.wraps(original)
    def load_valuehead_model(local_path: Any, torch_dtype: Any, model_config: Any, trust_remote_code: Any) -> Any:
        from transformers import AutoModelForTokenClassification

        try:
            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path,
                torch_dtype=torch_dtype,
                config=model_config,
                attn_implementation="sdpa",
                trust_remote_code=trust_remote_code,
            )
        except (OSError, ValueError, KeyError):
            return original(local_path, torch_dtype, model_config, trust_remote_code)

    load_valuehead_model.__precision_patched__ = True
    return load_valuehead_model


def _zeroed_allocate(original: Any) -> Any:
    import torch

    @functools.wraps(original)
    def allocate(self: Any, size: Any, *, dtype: Any, device: Any) -> Any:
        if torch.device(device).type == "cpu":
            return torch.zeros(*size, dtype=dtype, device=device)
        return original(self, size, dtype=dtype, device=device)

    allocate.__precision_patched__ = True
    return allocate


def _zero_fsdp_buffers() -> None:
    import torch
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    if torch.__version__.split("+")[0] not in CHECKED_TORCH:
        print(
            f"precision gate: torch {torch.__version__}: FSDP2's all-gather buffers are left as torch allocates them "
            f"(the zero-fill was checked with torch {', '.join(CHECKED_TORCH)}); a multi-rank L1 dump may record "
            "uninitialised memory at Tensor.narrow",
            flush=True,
        )
        return
    mixin = _fsdp_collectives.DefaultAllocMixin
    if not getattr(mixin.allocate, "__precision_patched__", False):
        mixin.allocate = _zeroed_allocate(mixin.allocate)


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
    rollout_base._ROLLOUT_REGISTRY[("precision_cpu", "async")] = (
        "precision_harness.runs.verl_cpu.rollout.CPUServerAdapter"
    )
    _annotate_critic(engine_workers)
    import verl.utils.model as verl_model

    if not getattr(verl_model.load_valuehead_model, "__precision_patched__", False):
        verl_model.load_valuehead_model = _valuehead_loader(verl_model.load_valuehead_model)
    _zero_fsdp_buffers()
