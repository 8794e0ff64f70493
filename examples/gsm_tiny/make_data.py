"""Write a GSM8K-format dataset of small word problems: `train.jsonl` and `test.jsonl` with `question` and
`answer` columns, each answer a worked line and GSM8K's final `#### N`.

    python make_data.py [--out data] [--train 2000] [--test 200] [--max-operand 3] [--ops +-] [--seed 0]

The problems are one-step additions and subtractions with small operands over names and objects, phrased in
the words the tiny model's tokenizer knows ("has", "and", a number as one piece), so a question is ~25
tokens with both numbers at the same distance from its end — what the 0.5 M-parameter tiny model can learn
by RL in minutes. No question of the test file is in the train file."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
ITEMS = ("apples", "pens", "coins", "books", "cards", "shells", "stamps", "marbles")


def problem(rng: random.Random, max_operand: int, ops: str) -> dict[str, str]:
    # One template per operation, the verb right before the second number and the numbers near the end: a
    # 2-layer model finds them at a fixed distance from the question's end (the earlier phrasing, "Ana gets
    # more apples. Had 2, gets 3. How many now?", was ~36 pieces and did not learn in 300 RL steps).
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    if rng.choice(ops) == "+":
        return {"question": f"{name} has {a} {item} and gets {b} more. How many now?",
                "answer": f"{name} had {a} {item} and gets {b}: {a} + {b} = {a + b}.\n#### {a + b}"}
    a, b = max(a, b), min(a, b)
    return {"question": f"{name} has {a} {item} and gives {b} away. How many now?",
            "answer": f"{name} had {a} {item} and gives {b} away: {a} - {b} = {a - b}.\n#### {a - b}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data", help="directory to write train.jsonl and test.jsonl to")
    parser.add_argument("--train", type=int, default=2000, help="training rows")
    parser.add_argument("--test", type=int, default=200, help="test rows (questions unseen in train)")
    parser.add_argument("--max-operand", type=int, default=3, help="largest number in a question")
    parser.add_argument("--ops", default="+-", choices=("+-", "+", "-"), help="the operations problems draw from")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    test: dict[str, dict[str, str]] = {}
    while len(test) < args.test:
        row = problem(rng, args.max_operand, args.ops)
        test[row["question"]] = row
    train = []
    while len(train) < args.train:
        row = problem(rng, args.max_operand, args.ops)
        if row["question"] not in test:
            train.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", list(test.values()))):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(train)} train and {len(test)} test rows to {out}/")


if __name__ == "__main__":
    main()
