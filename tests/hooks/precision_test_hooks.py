"""Numeric changes the harness's tests plant in scenario runs, patched in from outside the package.

Two variables choose them; unset, every patched function does exactly what it did, bit for bit:

* ``PRECISION_TEST_PLANT=<site>`` scales one operand by :data:`PLANT_SCALE` inside an op that runs
  anyway, so a dump's API structure is unchanged and only numbers move. Sites: ``log_prob`` (the
  temperature that divides the logits before ``logsumexp``/``gather``; first seen by
  ``actor_compute_log_prob``), ``loss`` (each micro-batch's gradient-accumulation scale in
  ``actor_update``), ``advantages`` (scaled after ``compute_advantage``, outside every stage, as
  verl's driver computes them; in verl's own trainer, every estimator of
  ``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY`` is wrapped the same way).
  Rollout sites, between the training and the rollout engine: ``weight_sync`` (the sync skips
  :data:`SKIPPED_SYNC_MODULE`, whose rollout weights stay those of the step before), ``rollout_temperature``
  (the rollout samples and recomputes with a temperature off by :data:`ROLLOUT_TEMPERATURE_SCALE`),
  ``rollout_lm_head`` (after each sync the rollout's ``lm_head.weight`` is rounded through bfloat16),
  ``rollout_sampling`` (the rollout samples with its temperature times :data:`ROLLOUT_SAMPLING_SCALE`
  but recomputes with the right one: a sampler change that moves sampled tokens, not log-prob parity).
  In verl's CPU rollout server (``precision_harness.runs.verl.cpu.policy_server``): ``rollout_logprobs``
  (the log-probs it returns are rounded through bfloat16, the tokens stay: a rollout kernel that stops
  computing log-probs in float32), ``rollout_stale_weights`` (it ignores the sync before step 2 and
  keeps step 1's weights). In the same server's scoring of pinned responses (``rollout_compute_log_prob``), each
  at its own step of :data:`ENGINE_PLANT_STEPS` so one run serves all three: ``engine_logits_bf16`` (the processed
  logits and their ``log_softmax`` computed in bfloat16), ``engine_temperature_twice`` (the logits divided by the
  temperature twice), ``engine_stale_layer`` (the sync before that step skips :data:`SKIPPED_SYNC_MODULE`). In the
  model, every process: ``norm_precision`` (Qwen2's RMSNorm rounds its
  variance to the input dtype, bf16 in a bf16 run: a norm without its fp32 upcast); changed code paths:
  ``rope_mul`` (RoPE's frequencies by a ``Tensor.__mul__`` where 5.10.4 records a ``Tensor.__matmul__``, as
  transformers 5.23.0 computes them: the same values, another call) and ``fused_attention`` (eager attention
  replaced by one ``scaled_dot_product_attention`` call whose kernel rounds q, k and v through bfloat16) and
  ``mask_shape`` (the causal mask's comparison made on ``[1, 18]`` and ``[18, 1]`` indices, giving ``[18, 18]``,
  where 5.10.4 records ``[1, 1, 1, 18]``, ``[1, 1, 18, 1]`` and ``[1, 1, 18, 18]``, then viewed back by an op msprobe
  does not record: the same mask through other intermediate shapes, as transformers 4.57.3 builds it).
  Several sites join with ``,`` (``rope_mul,linear_bf16``).
  In the built-in runner's portable matrix products (``precision_harness.runs.numerics.cpu_kernels``), where
  msprobe records the API around them unchanged: ``linear_bf16`` (an fp32 product computed from its inputs
  rounded to bfloat16, as a bf16 GEMM mode would), ``sum_order`` (each product's k terms summed in blocks of
  :data:`SUM_ORDER_BLOCK`, then over the blocks: another association of the same fp32 sums). In torch, under
  msprobe's wrapper (its recorded inputs stay the golden's): ``allreduce`` (``torch.distributed.all_reduce``
  scales its result by :data:`PLANT_SCALE`), ``dropout_rng`` (``torch.nn.functional.dropout`` draws from the
  default generator reseeded by :data:`DROPOUT_SEED_SHIFT`: another mask for the same input),
  ``softmax_bf16`` (``softmax(x, dim, dtype=torch.float32)`` on bf16 ``x`` computed in bf16, as a kernel that
  ignores the upcast would: eager attention's), ``gelu_tanh`` (``gelu(x)`` computed as
  ``gelu(x, approximate="tanh")`` in Qwen2's MLP only; with ``gelu`` too, that activation is
  ``gelu`` in place of ``silu``, the golden's side of that plant), ``linear_nobias`` (``linear(x, w, b)``
  without ``b`` in a no-grad ``forward_log_prob``: the log-prob stages, not the update or the rollout).
  In the runner's stages, under msprobe: ``gather_index`` (each row's labels rotated by one position before
  the log-prob ``gather``), ``mask_shift`` (``actor_update``'s ``response_mask`` shifted by one token).
  In the worker's CUDA settings (``precision_harness.runs.numerics.devices``; no effect on other devices), for
  ``benchmarks/device_run.sh``: ``tf32`` (fp32 matrix products and convolutions on TF32 tensor cores, what
  ``torch.set_float32_matmul_precision("high")`` does: inputs rounded to 10 mantissa bits, the GPU's
  ``linear_bf16``), ``cublas_workspace`` (``CUBLAS_WORKSPACE_CONFIG=`` :data:`OTHER_CUBLAS_WORKSPACE`, cuBLAS's
  other documented deterministic setting: a change that must not matter), ``nondeterministic`` (no
  ``CUBLAS_WORKSPACE_CONFIG``, deterministic algorithms off, cuDNN's autotuner on: the run without the
  determinism environment).
* ``PRECISION_TEST_PERTURB_RANK=<r>``: in a multi-rank run, rank ``r`` scales the advantages of its
  own shard by :data:`PERTURB_SCALE` (the built-in loop), or its policy loss, and so its gradients
  before they are reduced across ranks (verl's ``ppo_loss``), so a verdict must name the rank that
  diverged first.

How a hook reaches a run: a test puts this folder on ``PYTHONPATH`` (:func:`harness_testing.hooks_env`)
for the processes it starts; this folder's ``sitecustomize.py`` calls :func:`install` at interpreter
start-up, which patches each module of :data:`PATCHES` right after it is first imported (a worker,
a warm server, a Ray rank, and each of verl's processes: Ray passes ``PYTHONPATH`` on to them).
The judgement's float64 replay never loads them (``precision_harness.runs.isolated``): a plant is judged against
what torch computes. Nothing here imports torch until a runner module is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

PLANT_ENV = "PRECISION_TEST_PLANT"
PLANT_SCALE = 1.0 + 1e-4
SITES = (
    "log_prob",
    "loss",
    "advantages",
    "weight_sync",
    "rollout_temperature",
    "rollout_lm_head",
    "rollout_sampling",
    "rollout_logprobs",
    "rollout_stale_weights",
    "engine_logits_bf16",
    "engine_temperature_twice",
    "engine_stale_layer",
    "norm_precision",
    "linear_bf16",
    "sum_order",
    "allreduce",
    "dropout_rng",
    "rope_mul",
    "fused_attention",
    "mask_shape",
    "tf32",
    "cublas_workspace",
    "nondeterministic",
    "softmax_bf16",
    "gather_index",
    "mask_shift",
    "gelu",
    "gelu_tanh",
    "linear_nobias",
)
#: the module whose weights the planted weight sync leaves behind
SKIPPED_SYNC_MODULE = "model.layers.1.mlp.up_proj"
#: the step at which each plant in the rollout server's scoring acts (one run of the pinned example holds three steps)
ENGINE_PLANT_STEPS = {"engine_logits_bf16": 1, "engine_temperature_twice": 2, "engine_stale_layer": 3}
#: the sampling params' key a planted scoring passes its step in
ENGINE_STEP_KEY = "precision_test_step"
ROLLOUT_TEMPERATURE_SCALE = 1.0 + 1e-6
#: a rollout sampling at temperature 0.2 for 1.0: a tiny random model's logits are nearly flat, so a
#: smaller change (1.5x) samples the same tokens; this one changes 3 of grpo n=2's 16 at step 1
ROLLOUT_SAMPLING_SCALE = 0.2
#: ``sum_order``: products summed in blocks of this many, then over the blocks
SUM_ORDER_BLOCK = 4
#: ``dropout_rng``: how far the default generator's seed is moved before each dropout draws
DROPOUT_SEED_SHIFT = 7919
#: ``cublas_workspace``: the smaller of the two settings cuBLAS documents as deterministic
OTHER_CUBLAS_WORKSPACE = ":16:8"
PERTURB_ENV = "PRECISION_TEST_PERTURB_RANK"
PERTURB_SCALE = 1.0 + 1e-3


def factor(site: str) -> float:
    """:data:`PLANT_SCALE` when ``$PRECISION_TEST_PLANT`` names ``site`` (alone or among others joined by ``,``),
    else 1.0 (read at each call).

    Raises:
        ValueError: the variable names no known site (a typo would otherwise plant nothing).
    """
    planted = os.environ.get(PLANT_ENV)
    if not planted:
        return 1.0
    sites = planted.split(",")  # several plants at once: a changed code path and a numeric change after it
    if any(s not in SITES for s in sites):
        raise ValueError(f"{PLANT_ENV}={planted!r}: expected one of {', '.join(SITES)}, or several joined by ','")
    return PLANT_SCALE if site in sites else 1.0


def planted(site: str) -> bool:
    """Whether ``$PRECISION_TEST_PLANT`` names ``site`` (:func:`factor`'s check of the variable)."""
    return factor(site) != 1.0


def perturb(batch: dict[str, Any]) -> dict[str, Any]:
    """On rank ``$PRECISION_TEST_PERTURB_RANK`` of a multi-rank run, ``batch`` with that rank's shard of
    ``advantages`` (rows ``r*B/W`` to ``(r+1)*B/W``) scaled; ``batch`` itself otherwise."""
    from precision_harness.runs.runner.distributed import rank, world_size

    w, r = world_size(), rank()
    if w == 1 or os.environ.get(PERTURB_ENV) != str(r) or "advantages" not in batch:
        return batch
    size = batch["advantages"].shape[0] // w
    adv = batch["advantages"].clone()
    adv[r * size : (r + 1) * size] *= PERTURB_SCALE
    return {**batch, "advantages": adv}


def _rolled(t: Any) -> Any:
    """``t`` with each row rotated by one position along its last dim, by an aten op msprobe does not hook."""
    import torch

    return torch.ops.aten.roll.default(t, [1], [-1])


def _patch_stages(stages: ModuleType) -> None:
    forward, scale, update = stages.forward_log_prob, stages.accumulation_scale, stages.actor_update

    def forward_log_prob(model: Any, mb: Any, *, temperature: float, calculate_entropy: bool) -> Any:
        if planted("gather_index"):  # the labels only: _forward_logits reads the responses' shape, not values
            mb = {**mb, "responses": _rolled(mb["responses"])}
        _NO_BIAS[0] = planted("linear_nobias")
        try:
            t = temperature * factor("log_prob")
            return forward(model, mb, temperature=t, calculate_entropy=calculate_entropy)
        finally:
            _NO_BIAS[0] = False

    def accumulation_scale(micro: Any, mini: Any) -> float:
        return scale(micro, mini) * factor("loss")

    def actor_update(actor: Any, optimizer: Any, batch: Any, cfg: Any, **kwargs: Any) -> Any:
        if planted("mask_shift"):
            batch = {**batch, "response_mask": _rolled(batch["response_mask"])}
        return update(actor, optimizer, batch, cfg, **kwargs)

    stages.forward_log_prob, stages.accumulation_scale = forward_log_prob, accumulation_scale
    stages.actor_update = actor_update


#: set while a planted ``linear_nobias`` forward_log_prob runs (the rollout and the update keep their bias)
_NO_BIAS = [False]


def _patch_trainer(trainer: ModuleType) -> None:
    compute = trainer.Trainer._compute_advantage

    def _compute_advantage(self: Any, st: Any) -> None:
        compute(self, st)
        scale = factor("advantages")
        if scale != 1.0:  # an op here runs outside every profiled stage, so no dump sees it
            st.advantages = st.batch["advantages"] = st.advantages * scale
        st.batch = perturb(st.batch)

    trainer.Trainer._compute_advantage = _compute_advantage


def _planted_estimator(estimator: Callable[..., Any]) -> Callable[..., Any]:
    def scaled_estimator(*args: Any, **kwargs: Any) -> Any:
        advantages, returns = estimator(*args, **kwargs)
        scale = factor("advantages")
        return (advantages * scale if scale != 1.0 else advantages), returns

    scaled_estimator.__wrapped__ = estimator  # type: ignore[attr-defined]
    return scaled_estimator


def _patch_core_algos(core_algos: ModuleType) -> None:
    """verl's estimators, in the registry (``get_adv_estimator_fn``) and as the module attributes they were
    registered from (``compute_advantage`` in ``ray_trainer.py`` calls GAE and GRPO that way)."""
    for name, fn in list(core_algos.ADV_ESTIMATOR_REGISTRY.items()):
        wrapped = _planted_estimator(fn)
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = wrapped
        for attr, value in list(vars(core_algos).items()):
            if value is fn:
                setattr(core_algos, attr, wrapped)


def _patch_weight_sync(weight_sync: ModuleType) -> None:
    sync = weight_sync.sync_weights

    def sync_weights(actor: Any, rollout_model: Any) -> None:
        import torch

        skip, head = planted("weight_sync"), planted("rollout_lm_head")
        prefix = SKIPPED_SYNC_MODULE + "."
        kept = {n: p.detach().clone() for n, p in rollout_model.named_parameters() if skip and n.startswith(prefix)}
        sync(actor, rollout_model)
        with torch.no_grad():
            for name, param in rollout_model.named_parameters():
                if name in kept:
                    param.copy_(kept[name])
                elif head and name == "lm_head.weight":
                    param.copy_(param.to(torch.bfloat16).to(param.dtype))

    weight_sync.sync_weights = sync_weights


def _patch_rollout(rollout: ModuleType) -> None:
    generate, recompute = rollout.generate, rollout.recompute_log_probs

    def scaled(temperature: float) -> float:
        return temperature * ROLLOUT_TEMPERATURE_SCALE if planted("rollout_temperature") else temperature

    def generate_planted(model: Any, prompts: Any, *, temperature: float, **kwargs: Any) -> Any:
        sampling = scaled(temperature) * (ROLLOUT_SAMPLING_SCALE if planted("rollout_sampling") else 1.0)
        return generate(model, prompts, temperature=sampling, **kwargs)

    def recompute_planted(model: Any, batch: Any, *, micro_batch_size: int, temperature: float) -> Any:
        return recompute(model, batch, micro_batch_size=micro_batch_size, temperature=scaled(temperature))

    rollout.generate, rollout.recompute_log_probs = generate_planted, recompute_planted


def _unhooked_round(t: Any, dtype: Any) -> Any:
    """``t`` rounded through ``dtype`` with aten ops msprobe does not hook: numbers move, no dump row is added."""
    import torch

    aten = torch.ops.aten
    return aten._to_copy.default(aten._to_copy.default(t, dtype=dtype), dtype=t.dtype)


def _patch_policy_server(server: ModuleType) -> None:
    sample, load = server.sample_response, server.PolicyServer.load_weights

    def sample_response(*args: Any, **kwargs: Any) -> Any:
        tokens, log_probs, stop = sample(*args, **kwargs)
        if planted("rollout_logprobs"):
            import torch

            log_probs = torch.tensor(log_probs, dtype=torch.float32).to(torch.bfloat16).float().tolist()
        return tokens, log_probs, stop

    def load_weights(self: Any, weights: Any, global_steps: Any, actor: Any) -> Any:
        if planted("rollout_stale_weights") and global_steps == 1:  # the sync after step 1, for step 2
            weights = []
        return load(self, weights, global_steps, actor)

    server.sample_response, server.PolicyServer.load_weights = sample_response, load_weights
    _patch_engine_scoring(server)


def _engine_planted(site: str, step: int | None) -> bool:
    return planted(site) and step == ENGINE_PLANT_STEPS[site]


def _patch_engine_scoring(server: ModuleType) -> None:
    """The ``engine_*`` plants: in the server's scoring (:meth:`PolicyServer.generate` asked for ``prompt_logprobs``)
    at their step, and in the sync before it. The step travels in the sampling params (:data:`ENGINE_STEP_KEY`), not
    in shared state: Ray may hand the actor a copy of a patched method that closes over its own."""
    processed, generate, load = server.processed_logits, server.PolicyServer.generate, server.PolicyServer.load_weights

    def processed_logits(logits: Any, params: dict[str, Any]) -> Any:
        step = params.get(ENGINE_STEP_KEY)
        if _engine_planted("engine_temperature_twice", step):
            logits = logits.float() / float(params.get("temperature", 1.0))
        x = processed(logits, params)
        if _engine_planted("engine_logits_bf16", step):
            import torch

            x = x.to(torch.bfloat16)  # log_softmax then runs in bfloat16 too
        return x

    def planted_generate(
        self: Any, request_id: str, prompt_ids: Any, sampling_params: dict[str, Any], **kw: Any
    ) -> Any:
        if sampling_params.get("prompt_logprobs") is not None:
            step = 1 if self.global_steps is None else int(self.global_steps) + 1
            sampling_params = {**sampling_params, ENGINE_STEP_KEY: step}
        return generate(self, request_id, prompt_ids, sampling_params, **kw)

    def planted_load(self: Any, weights: Any, global_steps: Any, actor: Any) -> Any:
        step = 1 if global_steps is None else int(global_steps) + 1
        if _engine_planted("engine_stale_layer", step):
            weights = [(name, t) for name, t in weights if not name.startswith(SKIPPED_SYNC_MODULE + ".")]
        return load(self, weights, global_steps, actor)

    server.processed_logits, server.PolicyServer.generate = processed_logits, planted_generate
    server.PolicyServer.load_weights = planted_load


def _patch_engine_workers(engine_workers: ModuleType) -> None:
    ppo_loss = engine_workers.ppo_loss

    def perturbed_ppo_loss(*args: Any, **kwargs: Any) -> Any:
        import torch

        loss, metrics = ppo_loss(*args, **kwargs)
        if os.environ.get(PERTURB_ENV) is not None and os.environ.get(PERTURB_ENV) == os.environ.get("RANK"):
            loss = torch.ops.aten.mul.Scalar(loss, PERTURB_SCALE)  # unhooked: the backward's numbers move, no row
        return loss, metrics

    engine_workers.ppo_loss = perturbed_ppo_loss


def _patch_qwen2(qwen2: ModuleType) -> None:
    _patch_rope(qwen2)
    _patch_attention(qwen2)
    norm = qwen2.Qwen2RMSNorm
    original = norm.forward

    def forward(self: Any, hidden_states: Any) -> Any:
        import torch

        if not planted("norm_precision"):
            return original(self, hidden_states)
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = _unhooked_round(hidden_states.pow(2).mean(-1, keepdim=True), input_dtype)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

    norm.forward = forward
    mlp_init = qwen2.Qwen2MLP.__init__

    def init(self: Any, config: Any) -> None:
        mlp_init(self, config)
        if planted("gelu") or planted("gelu_tanh"):
            self.act_fn = _mlp_gelu()

    qwen2.Qwen2MLP.__init__ = init


def _mlp_gelu() -> Any:
    """Qwen2's MLP activation as ``gelu``: ``torch.nn.functional.gelu`` (msprobe's wrapper) looked up per call, with
    :data:`_IN_MLP` set so that ``gelu_tanh`` changes this call only (the replay worker's gelu stays exact)."""
    import torch

    class PlantedGELU(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            _IN_MLP[0] = True
            try:
                return torch.nn.functional.gelu(x)
            finally:
                _IN_MLP[0] = False

    return PlantedGELU()


#: set while the planted MLP's gelu runs
_IN_MLP = [False]


def _patch_rope(qwen2: ModuleType) -> None:
    """``rope_mul``: RoPE's frequencies formed with one ``Tensor.__mul__`` where transformers 5.10.4 records a
    ``Tensor.__matmul__`` (transformers 5.23.0's code, line for line): the same values, another call."""
    rope = qwen2.Qwen2RotaryEmbedding
    original = rope.forward

    def forward(self: Any, x: Any, position_ids: Any) -> Any:
        if not planted("rope_mul"):
            return original(self, x, position_ids)
        import torch

        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)

    rope.forward = forward


def _patch_attention(qwen2: ModuleType) -> None:
    """``fused_attention``: eager attention (matmul, scale, mask, softmax, dropout, matmul) replaced by one
    ``scaled_dot_product_attention`` call, transformers' own SDPA path, whose kernel rounds q, k and v through
    bfloat16 under msprobe's wrapper (:func:`_patch_functional`): a fused op that rounds differently."""
    eager = qwen2.eager_attention_forward

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kw: Any) -> Any:
        if not planted("fused_attention"):
            return eager(module, query, key, value, attention_mask, *args, **kw)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        scaling = args[0] if args else kw.pop("scaling", None)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kw)

    qwen2.eager_attention_forward = attention


def _patch_masking_utils(masking_utils: ModuleType) -> None:
    """``mask_shape``: the causal mask function compares its indices as ``[1, kv]`` and ``[q, 1]`` (one recorded
    ``Tensor.__le__`` of other shapes) and views the result back to the broadcast shape unhooked."""
    original = masking_utils.causal_mask_function

    def causal_mask_function(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
        if not planted("mask_shape"):
            return original(batch_idx, head_idx, q_idx, kv_idx)
        import torch

        view = torch.ops.aten.view.default  # unhooked: msprobe records the comparison only
        mask = view(kv_idx, [1, -1]) <= view(q_idx, [-1, 1])
        return view(mask, list(torch.broadcast_shapes(kv_idx.shape, q_idx.shape)))

    masking_utils.causal_mask_function = causal_mask_function


def _patch_cpu_kernels(cpu_kernels: ModuleType) -> None:
    """``linear_bf16`` and ``sum_order`` inside the portable products: msprobe's rows around them stay the same."""
    matmul_acc, products_summed = cpu_kernels.matmul_acc, cpu_kernels._products_summed

    def planted_matmul_acc(a: Any, b: Any) -> Any:
        import torch

        if planted("linear_bf16") and a.dtype == torch.float32:
            a, b = _unhooked_round(a, torch.bfloat16), _unhooked_round(b, torch.bfloat16)
        return matmul_acc(a, b)

    def planted_products_summed(a: Any, b: Any) -> Any:
        if not planted("sum_order"):
            return products_summed(a, b)
        import torch

        aten = torch.ops.aten
        prod = aten.mul.Tensor(aten.unsqueeze.default(a, -1), aten.unsqueeze.default(b, -3))
        k = prod.shape[-2]
        pad = -k % SUM_ORDER_BLOCK
        if pad:
            prod = aten.constant_pad_nd.default(prod, [0, 0, 0, pad])
        shape = [*prod.shape[:-2], (k + pad) // SUM_ORDER_BLOCK, SUM_ORDER_BLOCK, prod.shape[-1]]
        return aten.sum.dim_IntList(aten.sum.dim_IntList(aten.reshape.default(prod, shape), [-2]), [-2])

    cpu_kernels.matmul_acc, cpu_kernels._products_summed = planted_matmul_acc, planted_products_summed


def _patch_distributed_c10d(c10d: ModuleType) -> None:
    """``allreduce``: the reduced tensor scaled in place by an aten op msprobe does not record (torch.distributed
    re-exports this module's function right after, and msprobe wraps what it finds there)."""
    all_reduce = c10d.all_reduce

    def planted_all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        work = all_reduce(tensor, *args, **kwargs)
        if planted("allreduce"):
            import torch

            torch.ops.aten.mul_.Scalar(tensor, PLANT_SCALE)
        return work

    c10d.all_reduce = planted_all_reduce


def _patch_functional(functional: ModuleType) -> None:
    """``dropout_rng``: the default generator reseeded before each dropout (no op msprobe records);
    ``fused_attention``: SDPA computed from q, k and v rounded through bfloat16 (no op msprobe records)."""
    dropout, sdpa = functional.dropout, functional.scaled_dot_product_attention

    def planted_sdpa(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if planted("fused_attention"):
            import torch

            query, key, value = (_unhooked_round(t, torch.bfloat16) for t in (query, key, value))
        return sdpa(query, key, value, *args, **kwargs)

    functional.scaled_dot_product_attention = planted_sdpa

    def planted_dropout(*args: Any, **kwargs: Any) -> Any:
        if planted("dropout_rng"):
            import torch

            torch.default_generator.manual_seed(torch.default_generator.initial_seed() + DROPOUT_SEED_SHIFT)
        return dropout(*args, **kwargs)

    functional.dropout = planted_dropout
    softmax, gelu, linear = functional.softmax, functional.gelu, functional.linear

    def planted_softmax(input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
        import torch

        if planted("softmax_bf16") and input.dtype == torch.bfloat16 and dtype == torch.float32:
            dtype = None  # computed and returned in bf16, as a kernel that ignores the upcast
        return softmax(input, dim, _stacklevel, dtype)

    def planted_gelu(input: Any, approximate: str = "none") -> Any:
        return gelu(input, approximate="tanh" if _IN_MLP[0] and planted("gelu_tanh") else approximate)

    def planted_linear(input: Any, weight: Any, bias: Any = None) -> Any:
        import torch

        if _NO_BIAS[0] and bias is not None and not torch.is_grad_enabled():
            bias = None
        return linear(input, weight, bias)

    functional.softmax, functional.gelu, functional.linear = planted_softmax, planted_gelu, planted_linear


def _patch_devices(devices: ModuleType) -> None:
    """``tf32``, ``cublas_workspace`` and ``nondeterministic``: the CUDA settings a worker runs with."""
    determinism_env, setup = devices.determinism_env, devices.setup

    def planted_determinism_env(device: str, num_threads: int) -> dict[str, str]:
        env = determinism_env(device, num_threads)
        if device == "cuda" and planted("cublas_workspace"):
            env["CUBLAS_WORKSPACE_CONFIG"] = OTHER_CUBLAS_WORKSPACE
        if device == "cuda" and planted("nondeterministic"):
            env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        return env

    def planted_setup(device: str, **kwargs: Any) -> Any:
        torch_device = setup(device, **kwargs)
        if device == "cuda" and (planted("tf32") or planted("nondeterministic")):
            import torch

            if planted("tf32"):
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            else:
                torch.use_deterministic_algorithms(False)
                torch.backends.cudnn.benchmark = True
        return torch_device

    devices.determinism_env, devices.setup = planted_determinism_env, planted_setup


#: module -> what patches it, right after its first import
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "precision_harness.runs.numerics.weight_sync": _patch_weight_sync,
    "precision_harness.runs.runner.rollout": _patch_rollout,
    "precision_harness.runs.runner.stages": _patch_stages,
    "precision_harness.runs.runner.trainer": _patch_trainer,
    "verl.trainer.ppo.core_algos": _patch_core_algos,
    "verl.workers.engine_workers": _patch_engine_workers,
    "precision_harness.runs.verl.cpu.policy_server": _patch_policy_server,
    "transformers.models.qwen2.modeling_qwen2": _patch_qwen2,
    "transformers.masking_utils": _patch_masking_utils,
    "precision_harness.runs.numerics.cpu_kernels": _patch_cpu_kernels,
    "torch.distributed.distributed_c10d": _patch_distributed_c10d,
    "torch.nn.functional": _patch_functional,
    "precision_harness.runs.numerics.devices": _patch_devices,
}


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`PATCHES` as the path finder does, and patches each once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(name)
        spec = importlib.machinery.PathFinder.find_spec(name, path) if patch is not None else None
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patch the modules of :data:`PATCHES` as they are imported (idempotent; already imported ones now)."""
    if any(isinstance(f, _PatchingFinder) for f in sys.meta_path):
        return
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _PatchingFinder())
