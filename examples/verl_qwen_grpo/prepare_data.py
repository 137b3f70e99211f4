"""Write the example's data to ``$DATA_DIR``: arithmetic prompts in verl's RL parquet layout, and the reward.

``train.parquet`` and ``test.parquet`` have the columns verl's ``RLHFDataset`` reads (``data_source``,
``prompt`` as chat messages, ``ability``, ``reward_model`` with ``ground_truth``, ``extra_info``), as
verl's ``examples/data_preprocess`` scripts write them. The rows come from a fixed seed, so every
machine writes the same files and no dataset is downloaded. ``reward.py`` is copied beside them,
where the scenario's ``reward.custom_reward_function.path`` points.

Usage: ``DATA_DIR=/path/to/data python prepare_data.py``
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pandas as pd

SEED, TRAIN_ROWS, TEST_ROWS = 1234, 64, 16
INSTRUCTION = "Answer with the number only."


def rows(count: int, split: str, rng: random.Random) -> list[dict]:
    """``count`` addition and multiplication problems in verl's RL parquet schema."""
    out = []
    for index in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op, answer = rng.choice((("+", a + b), ("*", a * b)))
        out.append(
            {
                "data_source": "precision_gate/arithmetic",
                "prompt": [{"role": "user", "content": f"What is {a} {op} {b}? {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": index},
            }
        )
    return out


def main() -> None:
    out = Path(os.environ["DATA_DIR"]).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    pd.DataFrame(rows(TRAIN_ROWS, "train", rng)).to_parquet(out / "train.parquet")
    pd.DataFrame(rows(TEST_ROWS, "test", rng)).to_parquet(out / "test.parquet")
    shutil.copy(Path(__file__).with_name("reward.py"), out / "reward.py")
    print(f"wrote {out / 'train.parquet'} ({TRAIN_ROWS} rows), {out / 'test.parquet'} ({TEST_ROWS} rows), reward.py")


if __name__ == "__main__":
    main()
