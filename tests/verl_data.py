"""A Parquet file in verl's layout, as its GSM8K preprocessing script writes one (read from verl's
`examples/data_preprocess/gsm8k.py`; verl itself cannot be installed beside this transformers): `data_source`, the
chat in `prompt`, `ability`, the ground truth nested in `reward_model`, and `extra_info` with the row's index."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

INSTRUCTION = "Let's think step by step and output the final answer in \\boxed{}."


def verl_rows(n: int, split: str = "train", start: int = 0) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        question = f"Ana has {i % 7} apples and gets {i % 5} more. How many apples does she have?"
        answer = str(i % 7 + i % 5)
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i, "answer": f"{i % 7} + {i % 5} = {answer}\n#### {answer}",
                           "question": question},
        })
    return rows


def write_verl_parquet(path: Path, n: int, split: str = "train", start: int = 0) -> Path:
    pq.write_table(pa.Table.from_pylist(verl_rows(n, split, start)), str(path))
    return path
