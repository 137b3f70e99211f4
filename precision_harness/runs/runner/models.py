"""Tiny models and the byte-level tokenizer: actor/ref (causal LM), critic (value head), reward model.

Built from a Qwen2 config with a fixed seed, so no download is needed; or loaded from a local
checkpoint directory (``model.path``) with ``local_files_only=True``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2ForTokenClassification

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 plus ``pad`` (256), ``bos`` (257) and ``eos`` (258).

    The vocabulary is padded to 264 so embedding rows are a multiple of 8.
    """

    pad_token_id = 256
    bos_token_id = 257
    eos_token_id = 258
    vocab_size = 264

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        """Decode, stopping at ``eos`` and dropping other special ids."""
        out = bytearray()
        for i in ids:
            if i == self.eos_token_id:
                break
            if i < 256:
                out.append(i)
        return out.decode("utf-8", errors="replace")


def qwen2_config(model_cfg: dict[str, Any], tok: ByteTokenizer, **extra: Any) -> Qwen2Config:
    cfg = Qwen2Config(
        vocab_size=tok.vocab_size,
        hidden_size=model_cfg["hidden_size"],
        intermediate_size=model_cfg["intermediate_size"],
        num_hidden_layers=model_cfg["num_hidden_layers"],
        num_attention_heads=model_cfg["num_attention_heads"],
        num_key_value_heads=model_cfg["num_key_value_heads"],
        max_position_embeddings=model_cfg["max_position_embeddings"],
        tie_word_embeddings=False,
        use_cache=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        attention_dropout=model_cfg.get("attention_dropout", 0.0),
        **extra,
    )
    cfg._attn_implementation = model_cfg["attn_implementation"]
    return cfg


def _seeded(seed: int, build):
    # fork_rng keeps model init from consuming the run's global RNG stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def build_actor(model_cfg: dict[str, Any], tok: ByteTokenizer, *, seed: int) -> torch.nn.Module:
    """Causal LM for the actor; the reference policy is a frozen copy of its initial weights."""
    if model_cfg["path"]:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model_cfg["path"], local_files_only=True, torch_dtype=torch.float32)
    return _seeded(seed, lambda: Qwen2ForCausalLM(qwen2_config(model_cfg, tok)))


def build_critic(model_cfg: dict[str, Any], tok: ByteTokenizer, *, seed: int) -> torch.nn.Module:
    """Token-classification model with one label: the value head (as verl's critic)."""
    if model_cfg["path"]:
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification.from_pretrained(
            model_cfg["path"], num_labels=1, local_files_only=True, torch_dtype=torch.float32
        )
    return _seeded(seed + 1, lambda: Qwen2ForTokenClassification(qwen2_config(model_cfg, tok, num_labels=1)))


def build_reward_model(model_cfg: dict[str, Any], tok: ByteTokenizer, *, seed: int) -> torch.nn.Module:
    """Sequence-classification model with one label: a scalar score from the last non-pad token."""
    if model_cfg["path"]:
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification.from_pretrained(
            model_cfg["path"], num_labels=1, local_files_only=True, torch_dtype=torch.float32
        )
    return _seeded(seed + 2, lambda: Qwen2ForSequenceClassification(qwen2_config(model_cfg, tok, num_labels=1)))


def frozen_copy(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A copy with gradients off, optionally cast (the reference policy, or the rollout's weights)."""
    clone = copy.deepcopy(model)
    if dtype is not None:
        clone = clone.to(dtype)
    clone.requires_grad_(False)
    clone.eval()
    return clone
