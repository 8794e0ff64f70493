"""The optimizer steps one train batch makes: `train.epochs` passes, each split into `train.mini_batches`.

In: the number of samples N in a batch, `mini_batches` M, `epochs` E and a seed string (the trainer passes
run seed and batch version, so a resumed run plans the same steps). Out: M·E tuples of sample indices, one
per optimizer step, in the order they are applied; every epoch covers each sample exactly once.

    M = 1:  every epoch is (0, 1, …, N−1) — one step per epoch on the whole batch, in batch order (so
            M = E = 1 is the single full-batch step, bit for bit).
    M > 1:  epoch e draws a permutation of 0…N−1 from Random(f"{seed}/{e}") and cuts it into M contiguous
            chunks whose sizes differ by at most one.

Why shuffle: with E > 1 the same mini-batch would otherwise always follow the same predecessor; PPO's
usual practice is a fresh split per epoch. Why sample (not group) granularity: advantages are already
computed over the whole batch (`build_train_batch`), so splitting a GRPO group changes no advantage.
"""

from __future__ import annotations

import random


def mini_batch_plan(num_samples: int, mini_batches: int, epochs: int, seed: str) -> list[tuple[int, ...]]:
    """Sample indices per optimizer step (module docstring); M·E steps."""
    if mini_batches < 1 or epochs < 1:
        raise ValueError(f"train.mini_batches ({mini_batches}) and train.epochs ({epochs}) must be ≥ 1")
    if num_samples < mini_batches:
        raise ValueError(
            f"a batch of {num_samples} samples cannot be split into train.mini_batches={mini_batches}; "
            "make rollout.batch_size at least train.mini_batches × train.workers"
        )
    plan: list[tuple[int, ...]] = []
    for epoch in range(epochs):
        order = list(range(num_samples))
        if mini_batches > 1:
            random.Random(f"{seed}/{epoch}").shuffle(order)
        base, extra = divmod(num_samples, mini_batches)
        start = 0
        for k in range(mini_batches):
            size = base + (1 if k < extra else 0)
            plan.append(tuple(order[start:start + size]))
            start += size
    return plan
