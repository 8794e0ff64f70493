"""A `TrainBatch` → per-rank micro-batches of tensors, padded or packed (pure; no model, no process group).

In: `TrainSample`s (token ids, loss mask, behaviour logprobs, per-token versions, advantage), the number
of data-parallel ranks, `train.micro_batch_tokens`, `train.packing` and the pad id. Out: for each rank, an
equally long list of `Group`s (sample indices), and for one group a `MicroBatch`:

- the model's input, one of two layouts of the same tokens —
  padded: one right-padded row per sample, [b, L] with an attention mask;
  packed: every sample of the group concatenated into one row [1, T] with no padding at all, position ids
  restarting at 0 for each sample and `cu_seqlens` (the boundaries of its units) so attention never crosses a
  unit (trainer/attention.py). A unit is one sample, or — `share_prompts` — several samples with the same
  prompt (a GRPO group's members), laid out as the prompt once and then each sample's own tokens, with
  `branches` saying which sample each token is (0: the shared prompt, which every member attends to; k: the
  k-th member's own tokens, which attend to the prompt and to themselves only) and position ids continuing
  from the prompt, so each member computes exactly what it would alone, its prompt computed once;
- the labels, in the padded layout either way, shifted for next-token prediction: position t of `targets`,
  `loss_mask`, `behaviour_logprobs` and `versions` [b, L − 1] describes token t + 1 of that sample, predicted
  from its tokens ≤ t (so a model token in position 0 — which nothing predicts — is never trained on);
- `select`/`dest`/`select_targets`: the model tokens only — for each, the flat position of the hidden state
  that predicts it in the model input, its flat position in the [b, L − 1] label layout, and its id. Only
  these K positions meet the LM head (prompts and observations never get logits), and the K log-probs
  land in [b, L − 1] at `dest`, so the loss sees the same tensors whatever the layout.

`share_prompts` shares a prompt only among samples of the same micro-batch, and only while the unit's attention
(its length squared: trainer/attention.py computes a unit with shared prompt as one masked block) is no more
than its members' would be alone (the sum of their lengths squared) — a single-turn group, a long prompt and
short answers, always shares; members whose own tokens are long enough that the block would cost more go
into further units. So sharing never costs attention and saves the prompt's tokens in every other layer.

Guarantees: `shard` gives every rank at least one sample and balances their token counts (longest first
to the least-loaded rank — deterministic); a group's padded size (rows × longest row) or packed size (the
sum of its lengths) stays within the budget unless a single sample is longer; `plan` gives every rank the
same number of groups (FSDP2 runs a collective in every forward: a rank with fewer micro-batches would
leave the others waiting), splitting a rank's groups where it can and adding `filler` groups — a sample
of its own run with weight 0, so nothing counts twice — where it cannot; `global_totals` are the
batch-wide model-token and sequence counts every rank must normalise by, so the sum over ranks and
micro-batches of the micro-batch losses is the loss of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch
from torch import Tensor

from rollart.types import TrainSample


@dataclass(frozen=True)
class Group:
    """One micro-batch's samples (indices into the batch); `filler`: run only to keep ranks in step."""

    indices: tuple[int, ...]
    filler: bool = False


@dataclass(frozen=True)
class MicroBatch:
    input_ids: Tensor  # [b, L] right-padded, or [1, T] packed
    attention_mask: Tensor | None  # [b, L] long (padded); None (packed)
    position_ids: Tensor | None  # None (padded: 0..L-1); [1, T] each token's position in its own sample (packed)
    cu_seqlens: Tensor | None  # None (padded); [units + 1] int32 unit boundaries in the packed row
    select: Tensor  # [K] long: flat index into input positions whose hidden state predicts a model token
    dest: Tensor  # [K] long: flat index of that token in the [b, L-1] label layout
    select_targets: Tensor  # [K] long: the model tokens' ids
    targets: Tensor  # [b, L-1] long: every next token, padded layout
    loss_mask: Tensor  # [b, L-1] float32
    behaviour_logprobs: Tensor  # [b, L-1] float32
    versions: Tensor  # [b, L-1] long (-1 on prompt and padding)
    advantages: Tensor  # [b] float32
    branches: Tensor | None = None  # [1, T] long: a packed row's sample of each token within its unit; None
    # when no unit shares a prompt (module docstring)

    @property
    def label_shape(self) -> tuple[int, int]:
        return tuple(self.loss_mask.shape)  # type: ignore[return-value]

    def to(self, device: str | torch.device) -> MicroBatch:
        return MicroBatch(*(None if (v := getattr(self, f.name)) is None else v.to(device) for f in fields(self)))


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


def micro_batches(samples: Sequence[TrainSample], indices: Sequence[int], token_budget: int,
                  packed: bool = False) -> list[list[int]]:
    """Group `indices` (longest first) within `token_budget` per micro-batch: rows × longest row (padded),
    or the sum of the lengths (packed, first fit)."""
    order = sorted(indices, key=lambda i: (-len(samples[i].token_ids), i))
    groups: list[list[int]] = []
    if packed:
        room: list[int] = []
        for i in order:
            n = len(samples[i].token_ids)
            fit = next((g for g, r in enumerate(room) if r >= n), None)
            if fit is None:
                groups.append([i])
                room.append(token_budget - n)
            else:
                groups[fit].append(i)
                room[fit] -= n
        return groups
    for i in order:
        if groups and (len(groups[-1]) + 1) * len(samples[groups[-1][0]].token_ids) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def plan(samples: Sequence[TrainSample], world_size: int, token_budget: int, packed: bool) -> list[list[Group]]:
    """Every rank's micro-batches of its shard of `samples`, the same number on each (module docstring)."""
    return plan_groups(samples, shard(samples, world_size), token_budget, packed)


def plan_groups(samples: Sequence[TrainSample], per_rank: Sequence[Sequence[int]], token_budget: int,
                packed: bool) -> list[list[Group]]:
    """Micro-batches of each rank's `per_rank` indices (each non-empty), the same number on every rank."""
    per_rank = [micro_batches(samples, mine, token_budget, packed) for mine in per_rank]
    count = max(len(groups) for groups in per_rank)
    out: list[list[Group]] = []
    for groups in per_rank:
        groups = [list(g) for g in groups]
        while len(groups) < count and any(len(g) > 1 for g in groups):
            widest = max(range(len(groups)), key=lambda k: (len(groups[k]), -k))
            g = groups.pop(widest)
            groups[widest:widest] = [g[: len(g) // 2], g[len(g) // 2:]]
        fill = [Group((min(groups[-1], key=lambda i: len(samples[i].token_ids)),), filler=True)
                for _ in range(count - len(groups))]
        out.append([Group(tuple(g)) for g in groups] + fill)
    return out


@dataclass(frozen=True)
class Unit:
    """Samples laid out together in a packed row: one sample alone (`shared` 0), or several whose first `shared`
    tokens — their common prompt — are computed once, followed by each member's own tokens."""

    members: tuple[int, ...]  # indices into the micro-batch's samples
    shared: int


def _prompt(sample: TrainSample) -> tuple[int, ...]:
    """The tokens before the sample's first trained model token (() when it has none, or none before it)."""
    first = next((t for t in range(1, len(sample.loss_mask)) if sample.loss_mask[t]), 0)
    return tuple(sample.token_ids[:first])


def _cheaper_together(samples: Sequence[TrainSample], unit: Unit, i: int, prompt: int) -> bool:
    """Whether sample i joining `unit` keeps its attention (the unit's length squared) within its members' alone."""
    lengths = [len(samples[j].token_ids) for j in (*unit.members, i)]
    together = prompt + sum(n - prompt for n in lengths)
    return together * together <= sum(n * n for n in lengths)


def share_prompts(samples: Sequence[TrainSample]) -> list[Unit]:
    """The packed row's units, in the order of their first sample (module docstring: when a prompt is shared)."""
    units: list[Unit] = []
    with_prompt: dict[tuple[int, ...], list[int]] = {}  # prompt → its units so far (first fit)
    for i, s in enumerate(samples):
        prompt = _prompt(s)
        fit = next((at for at in with_prompt.get(prompt, ()) if _cheaper_together(samples, units[at], i, len(prompt))),
                   None) if prompt else None
        if fit is not None:
            units[fit] = Unit((*units[fit].members, i), len(prompt))
            continue
        if prompt:
            with_prompt.setdefault(prompt, []).append(len(units))
        units.append(Unit((i,), 0))
    return [u if len(u.members) > 1 else Unit(u.members, 0) for u in units]


def _packed_row(samples: Sequence[TrainSample], ids: Tensor, rows: Tensor, cols: Tensor
                ) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """(input ids, position ids, branches or None, cu_seqlens, select) of the packed row of `samples` (their padded
    token ids `ids`; `rows`/`cols`: the label positions of their model tokens)."""
    pieces: list[Tensor] = []
    positions: list[Tensor] = []
    branches: list[Tensor] = []
    bounds = [0]
    trunk_start = torch.zeros(len(samples), dtype=torch.long)  # row position of a sample's shared prompt
    own_start = torch.zeros(len(samples), dtype=torch.long)  # row position of a sample's first own token
    shared = torch.zeros(len(samples), dtype=torch.long)  # how many of its first tokens are the shared prompt
    units = share_prompts(samples)
    for unit in units:
        p, at = unit.shared, bounds[-1]
        if p:
            pieces.append(ids[unit.members[0], :p])
            positions.append(torch.arange(p))
            branches.append(torch.zeros(p, dtype=torch.long))
            at += p
        for k, r in enumerate(unit.members, start=1 if p else 0):
            n = len(samples[r].token_ids)
            trunk_start[r], own_start[r], shared[r] = bounds[-1], at, p
            pieces.append(ids[r, p:n])
            positions.append(torch.arange(p, n))
            branches.append(torch.full((n - p,), k, dtype=torch.long))
            at += n - p
        bounds.append(at)
    # the hidden state that predicts label (row, col) is the row's token col: in the shared prompt or its own
    select = torch.where(cols < shared[rows], trunk_start[rows] + cols, own_start[rows] + cols - shared[rows])
    branch_ids = torch.cat(branches).unsqueeze(0) if any(u.shared for u in units) else None
    cu = torch.tensor(bounds, dtype=torch.int32)
    return torch.cat(pieces).unsqueeze(0), torch.cat(positions).unsqueeze(0), branch_ids, cu, select


def collate(samples: Sequence[TrainSample], pad_id: int, packed: bool = False) -> MicroBatch:
    """The micro-batch of `samples` in the padded or the packed layout (module docstring)."""
    for s in samples:
        _check(s)
    length = max(len(s.token_ids) for s in samples)
    b = len(samples)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    mask = torch.zeros((b, length), dtype=torch.float32)
    beh = torch.zeros((b, length), dtype=torch.float32)
    ver = torch.full((b, length), -1, dtype=torch.long)
    for row, s in enumerate(samples):
        n = len(s.token_ids)
        ids[row, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        mask[row, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        beh[row, :n] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
        ver[row, :n] = torch.tensor(s.token_versions, dtype=torch.long)
    loss_mask = mask[:, 1:].contiguous()
    rows, cols = loss_mask.nonzero(as_tuple=True)  # predicted model tokens, row-major
    dest = rows * (length - 1) + cols
    branches = None
    if packed:
        model_ids, position_ids, branches, cu_seqlens, select = _packed_row(samples, ids, rows, cols)
        attention = None
    else:
        select = rows * length + cols
        model_ids = ids
        attention = (torch.arange(length)[None, :] < torch.tensor([len(s.token_ids) for s in samples])[:, None]).long()
        position_ids, cu_seqlens = None, None
    return MicroBatch(
        input_ids=model_ids,
        attention_mask=attention,
        position_ids=position_ids,
        cu_seqlens=cu_seqlens,
        select=select,
        dest=dest,
        select_targets=ids[:, 1:][rows, cols],
        targets=ids[:, 1:].contiguous(),
        loss_mask=loss_mask,
        behaviour_logprobs=beh[:, 1:].contiguous(),
        versions=ver[:, 1:].contiguous(),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        branches=branches,
    )


def padding_counts(samples: Sequence[TrainSample], groups: Sequence[Sequence[int]], packed: bool) -> tuple[int, int]:
    """(token slots the model computes, real tokens it computes) over `groups`: their padded fraction is
    1 − real/slots. A prompt shared in a packed row (`share_prompts`) is computed, and counted, once."""
    slots = real = 0
    for g in groups:
        lengths = [len(samples[i].token_ids) for i in g]
        if packed:
            group = [samples[i] for i in g]
            computed = sum(lengths) - sum(unit.shared * (len(unit.members) - 1) for unit in share_prompts(group))
            slots, real = slots + computed, real + computed
        else:
            slots, real = slots + len(lengths) * max(lengths), real + sum(lengths)
    return slots, real


def pad_rows(rows: Sequence[Tensor], width: int) -> Tensor:
    """Per-sample vectors (e.g. proximal logprobs, [len − 1] each) → one zero-right-padded [b, width] tensor
    aligned with a `collate`d micro-batch of the same samples."""
    out = torch.zeros((len(rows), width), dtype=rows[0].dtype if rows else torch.float32)
    for r, row in enumerate(rows):
        out[r, : row.numel()] = row
    return out
