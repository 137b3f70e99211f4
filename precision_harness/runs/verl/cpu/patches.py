"""Every patch of verl internals only the CPU run needs, in one place, for verl 0.9.1 only (6, 7, 8: elsewhere).

Each entry names the verl function or table it replaces and why. :func:`apply` refuses any other
verl version (the package's ``__init__`` already did, in one line); a new verl version must be read
again, each patch re-checked, and added to :data:`precision_harness.runs.verl.release.SUPPORTED_VERSIONS`.

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
   ``("precision_cpu", "async")`` names :class:`precision_harness.runs.verl.cpu.rollout.CPUServerAdapter`.
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
6. (applied on every device, not only here) torch's FSDP2 all-gather buffer zero-filled, so a multi-rank L1 dump
   records no uninitialised memory at ``Tensor.narrow``: :mod:`precision_harness.runs.verl.fsdp2_buffers`, which verl
   loads in each process through :data:`precision_harness.runs.verl.engine.FSDP2_BUFFERS_MODULE`, with its own
   torch version guard.
7., 8. (applied on the CPU always, and on ``cuda`` and ``npu`` at ``level: auto``)
   the precision debugger's stage window and msprobe's own time: :mod:`precision_harness.runs.verl.stages.debugger`,
   which verl loads through :data:`precision_harness.runs.verl.engine.STAGES_MODULE`, behind the same version guard.

Each patch is applied when the module it replaces a part of is first imported
(:func:`precision_harness.runs.verl.stages.on_import.when_imported`), in whichever verl process imports it:
most of verl's processes never import the FSDP engine or the engine workers, and importing them only to
patch them cost each about 2.5 s.
"""

from __future__ import annotations

import functools
from typing import Any

from precision_harness.runs.verl.release import SUPPORTED_VERSIONS, unsupported_version_message
from precision_harness.runs.verl.stages import on_import, stage_window

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
        with stage_window.observe(impl, stage, self, args, kwargs) as window:
            started = impl.start(stage=stage, model=self.engine.module)
            try:
                window["result"] = func(self, *args, **kwargs)
            finally:
                impl.stop(started=started)
        return window["result"]

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


def _patch_process_group(module: Any) -> None:
    """Patch 1, in ``verl.utils.distributed`` and in each module that bound the function by name."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if not getattr(original, "__precision_patched__", False):
        distributed.initialize_global_process_group_ray = _process_group(original)
    if not getattr(module.initialize_global_process_group_ray, "__precision_patched__", False):
        module.initialize_global_process_group_ray = distributed.initialize_global_process_group_ray


def _patch_offload_policy(fsdp_impl: Any) -> None:
    """Patch 2."""
    if not getattr(fsdp_impl.CPUOffloadPolicy, "__precision_patched__", False):
        fsdp_impl.CPUOffloadPolicy = _offload_policy(fsdp_impl.CPUOffloadPolicy)


def _register_rollout(rollout_base: Any) -> None:
    """Patch 3."""
    rollout_base._ROLLOUT_REGISTRY[("precision_cpu", "async")] = (
        "precision_harness.runs.verl.cpu.rollout.CPUServerAdapter"
    )


def _patch_valuehead_loader(verl_model: Any) -> None:
    """Patch 5."""
    if not getattr(verl_model.load_valuehead_model, "__precision_patched__", False):
        verl_model.load_valuehead_model = _valuehead_loader(verl_model.load_valuehead_model)


#: each patch, keyed by the module whose import applies it (see the module docstring)
DEFERRED: tuple[tuple[str, Any], ...] = (
    ("verl.utils.distributed", _patch_process_group),
    ("verl.workers.engine_workers", _patch_process_group),
    ("verl.checkpoint_engine.base", _patch_process_group),
    ("verl.workers.engine.fsdp.transformer_impl", _patch_offload_policy),
    ("verl.workers.rollout.base", _register_rollout),
    ("verl.workers.engine_workers", _annotate_critic),
    ("verl.utils.model", _patch_valuehead_loader),
)


def apply(version: str) -> None:
    """Apply the patches above, each when its module is first imported (now if it already is); idempotent.

    Raises:
        RuntimeError: ``version`` is not one the patches were checked against (one line).
    """
    on_import.apply_checked(version, SUPPORTED_VERSIONS, unsupported_version_message(version), DEFERRED)
