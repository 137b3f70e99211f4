"""Write the verl CPU example's inputs: a seeded random tiny Qwen2, its tokenizer, and the training data.

Everything comes from fixed seeds and the installed packages, nothing is downloaded, and the
files are committed beside this script (``model/``, ``data/train.parquet``): rerun it after
changing the sizes below, then re-record the goldens.

- ``model/``: a Qwen2 causal LM (2 layers, hidden size 64) initialised by transformers from
  ``torch.manual_seed(SEED)``, saved in float32 safetensors, and a byte-level tokenizer (the 256
  bytes as tokens, no merges, so ``"\\n"`` is one token as verl expects of a Qwen tokenizer) with
  Qwen's ``<|im_start|>``/``<|im_end|>`` chat template.
- ``data/train.parquet``: short prompts in verl's RL parquet layout (``data_source``, ``prompt`` as
  chat messages, ``ability``, ``reward_model.ground_truth``, ``extra_info``).

Usage: ``python prepare.py`` (writes into this folder).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20260
HERE = Path(__file__).resolve().parent
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAIN_ROWS = 32
WORDS = ("red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "fish", "bird")


def write_tokenizer(out: Path) -> int:
    """A byte-level BPE without merges: 256 byte tokens, then the specials; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(ByteLevel.alphabet(), key=lambda ch: ch.encode("utf-8"))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(vocab) + len(SPECIALS)


def write_model(out: Path, vocab_size: int, pad_id: int, eos_id: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen2Config(
        vocab_size=(vocab_size + 7) // 8 * 8,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=pad_id,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def write_data(out: Path) -> None:
    import pandas as pd

    rng = random.Random(SEED)
    rows = []
    for index in range(TRAIN_ROWS):
        words = " ".join(rng.choice(WORDS) for _ in range(3))
        rows.append(
            {
                "data_source": "precision_gate/letters",
                "prompt": [{"role": "user", "content": f"Repeat: {words}"}],
                "ability": "copy",
                "reward_model": {"style": "rule", "ground_truth": words},
                "extra_info": {"split": "train", "index": index},
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out / "train.parquet")


def main() -> None:
    model_dir = HERE / "model"
    model_dir.mkdir(exist_ok=True)
    vocab_size = write_tokenizer(model_dir)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    newline = tok.encode("\n", add_special_tokens=False)
    assert newline == [tok.convert_tokens_to_ids("\u010a")], "newline must be one token"
    write_model(model_dir, vocab_size, tok.pad_token_id, tok.eos_token_id)
    # the config's generation file carries a transformers version; keep only what verl reads
    (model_dir / "generation_config.json").unlink(missing_ok=True)
    write_data(HERE / "data")
    print(json.dumps({"model": str(model_dir), "vocab_size": vocab_size, "data": str(HERE / "data")}))


if __name__ == "__main__":
    main()
