"""A `TrainBatch` → per-rank micro-batches of padded tensors (pure; no model, no process group).

In: `TrainSample`s (token ids, loss mask, behaviour logprobs, per-token versions, advantage), the number
of data-parallel ranks, `train.micro_batch_tokens` and the pad id. Out: for one rank, `MicroBatch`es whose
tensors are shifted for next-token prediction: position t of `targets`, `loss_mask`, `behaviour_logprobs`
and `versions` describes token t + 1, predicted from tokens ≤ t (so a model token in position 0 —
which nothing predicts — is never trained on).

Guarantees: `shard` gives every rank at least one sample and balances their token counts
(longest first to the least-loaded rank — deterministic); `micro_batches` keeps each micro-batch's padded
size (rows × longest row) within the budget unless a single sample is longer; `global_totals` are the
batch-wide model-token and sequence counts every rank must normalise by, so the sum over ranks and
micro-batches of the micro-batch losses is the loss of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from rollart.types import TrainSample


@dataclass(frozen=True)
class MicroBatch:
    input_ids: Tensor  # [b, L] long, right-padded
    attention_mask: Tensor  # [b, L] long
    targets: Tensor  # [b, L-1] long
    loss_mask: Tensor  # [b, L-1] float32
    behaviour_logprobs: Tensor  # [b, L-1] float32
    versions: Tensor  # [b, L-1] long (-1 on prompt and padding)
    advantages: Tensor  # [b] float32

    def to(self, device: str | torch.device) -> MicroBatch:
        return MicroBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def _check(sample: TrainSample) -> None:
    n = len(sample.token_ids)
    if not (len(sample.loss_mask) == len(sample.behaviour_logprobs) == len(sample.token_versions) == n):
        raise ValueError(
            f"sample {sample.trajectory_id}: token_ids ({n}), loss_mask ({len(sample.loss_mask)}), "
            f"behaviour_logprobs ({len(sample.behaviour_logprobs)}) and token_versions "
            f"({len(sample.token_versions)}) must have one entry per token"
        )
    if n < 2:
        raise ValueError(f"sample {sample.trajectory_id}: needs at least 2 tokens (a context and a target), has {n}")


def global_totals(samples: Sequence[TrainSample]) -> tuple[int, int]:
    """(model tokens that are trained on, sequences with at least one) over the whole batch."""
    tokens = [sum(s.loss_mask[1:]) for s in samples]
    return sum(tokens), sum(1 for t in tokens if t > 0)


def shard(samples: Sequence[TrainSample], world_size: int) -> list[list[int]]:
    """Sample indices per rank: longest first to the rank with the fewest tokens (ties: lowest rank)."""
    if len(samples) < world_size:
        raise ValueError(
            f"a batch of {len(samples)} samples cannot be split over train.workers={world_size} ranks; "
            "make rollout.batch_size at least train.workers"
        )
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].token_ids), i))
    load = [0] * world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        r = min(range(world_size), key=lambda k: (load[k], len(shards[k]), k))
        shards[r].append(i)
        load[r] += len(samples[i].token_ids)
    return [sorted(s) for s in shards]


def micro_batches(samples: Sequence[TrainSample], indices: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group `indices` (longest first) so that rows × longest row ≤ `token_budget` per micro-batch."""
    order = sorted(indices, key=lambda i: (-len(samples[i].token_ids), i))
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * len(samples[groups[-1][0]].token_ids) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def collate(samples: Sequence[TrainSample], pad_id: int) -> MicroBatch:
    """Right-pad `samples` to one tensor batch, shifted for next-token prediction (module docstring)."""
    for s in samples:
        _check(s)
    length = max(len(s.token_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    attn = torch.zeros((b, length), dtype=torch.long)
    mask = torch.zeros((b, length), dtype=torch.float32)
    beh = torch.zeros((b, length), dtype=torch.float32)
    ver = torch.full((b, length), -1, dtype=torch.long)
    for row, s in enumerate(samples):
        n = len(s.token_ids)
        ids[row, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attn[row, :n] = 1
        mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        beh[row, :n] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
        ver[row, :n] = torch.tensor(s.token_versions, dtype=torch.long)
    return MicroBatch(
        input_ids=ids,
        attention_mask=attn,
        targets=ids[:, 1:].contiguous(),
        loss_mask=mask[:, 1:].contiguous(),
        behaviour_logprobs=beh[:, 1:].contiguous(),
        versions=ver[:, 1:].contiguous(),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    )


def pad_rows(rows: Sequence[Tensor], width: int) -> Tensor:
    """Per-sample vectors (e.g. proximal logprobs, [len − 1] each) → one zero-right-padded [b, width] tensor
    aligned with a `collate`d micro-batch of the same samples."""
    out = torch.zeros((len(rows), width), dtype=rows[0].dtype if rows else torch.float32)
    for r, row in enumerate(rows):
        out[r, : row.numel()] = row
    return out
