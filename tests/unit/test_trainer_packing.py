"""Sharding, token-budget micro-batches, the shifted collate (padded and packed, prompts shared), the per-rank plan,
LR schedules."""

import math

import pytest
import torch

from rollart.trainer.packing import (Unit, collate, global_totals, micro_batches, padding_counts, plan, shard,
                                     share_prompts)
from rollart.trainer.schedule import lr_multiplier
from rollart.types import TrainSample


def sample(i, n, k, adv=0.5):
    mask = (0,) * (n - k) + (1,) * k
    return TrainSample(f"s{i}", "g", "d", tuple(range(1, n + 1)), mask, tuple(-0.1 * m for m in mask),
                       tuple(3 if m else -1 for m in mask), adv, 1.0)


def test_collate_shifts_for_next_token_prediction_and_pads():
    mb = collate([sample(0, 5, 2), sample(1, 3, 1)], pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 3, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert mb.targets.tolist() == [[2, 3, 4, 5], [2, 3, 0, 0]]
    assert mb.loss_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert mb.versions.tolist() == [[-1, -1, 3, 3], [-1, 3, -1, -1]]
    assert mb.behaviour_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.1])
    assert mb.advantages.tolist() == [0.5, 0.5]


def test_a_packed_micro_batch_is_one_row_without_padding_and_the_same_labels():
    samples = [sample(0, 5, 2), sample(1, 3, 1), sample(2, 4, 4)]  # the last: a model token in position 0
    padded, packed = collate(samples, pad_id=0), collate(samples, pad_id=0, packed=True)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 1, 2, 3, 1, 2, 3, 4]] and packed.attention_mask is None
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]]  # restarting per sample
    assert packed.cu_seqlens.tolist() == [0, 5, 8, 12]
    for field in ("targets", "loss_mask", "behaviour_logprobs", "versions", "advantages", "dest", "select_targets"):
        assert torch.equal(getattr(packed, field), getattr(padded, field)), field  # the loss sees the same
    for mb in (padded, packed):  # each selected hidden state predicts the next token of its own sample
        flat = mb.input_ids.reshape(-1)
        assert torch.equal(flat[mb.select + 1], mb.select_targets)
        assert mb.loss_mask.reshape(-1)[mb.dest].eq(1).all() and len(mb.dest) == int(mb.loss_mask.sum())
    assert len(packed.select) == 2 + 1 + 3  # sample 2's first token is never predicted, so never selected
    assert padding_counts(samples, [[0, 1, 2]], packed=False) == (15, 12)
    assert padding_counts(samples, [[0, 1, 2]], packed=True) == (12, 12)


def member(i, prompt, own):
    """A sample of `prompt` then `own` model tokens."""
    ids, mask = tuple(prompt) + tuple(own), (0,) * len(prompt) + (1,) * len(own)
    return TrainSample(f"m{i}", "g", "d", ids, mask, tuple(-0.2 * m for m in mask), tuple(1 if m else -1 for m in mask),
                       0.1 * i, 1.0)


def test_samples_with_one_prompt_share_it_in_a_packed_row_and_each_predicts_as_alone():
    prompt = (5, 6, 7, 8)
    samples = [member(0, prompt, (9, 10)), sample(1, 3, 1), member(2, prompt, (11,)), member(3, prompt, (12, 13))]
    padded, packed = collate(samples, pad_id=0), collate(samples, pad_id=0, packed=True)
    # one unit: the prompt once, then members 0, 2 and 3's own tokens; then sample 1 alone
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 4, 4, 5, 0, 1, 2]]
    assert packed.branches.tolist() == [[0, 0, 0, 0, 1, 1, 2, 3, 3, 0, 0, 0]]
    assert packed.cu_seqlens.tolist() == [0, 9, 12]
    for field in ("targets", "loss_mask", "behaviour_logprobs", "versions", "advantages", "dest", "select_targets"):
        assert torch.equal(getattr(packed, field), getattr(padded, field)), field
    # the hidden state selected for label (row, col) is that sample's token col, at its own position col, in the
    # shared prompt or in the sample's own branch
    width = padded.label_shape[1]
    rows, cols = packed.dest // width, packed.dest % width
    assert torch.equal(packed.input_ids[0, packed.select], padded.input_ids[rows, cols])
    assert torch.equal(packed.position_ids[0, packed.select], cols)
    unit_row = torch.tensor([1, 0, 2, 3])  # each sample's branch in its unit (sample 1 is alone: 0)
    branch = packed.branches[0, packed.select]
    assert ((branch == 0) | (branch == unit_row[rows])).all() and (branch > 0).any()
    assert padding_counts(samples, [[0, 1, 2, 3]], packed=True) == (12, 12)  # 20 sample tokens, 12 computed
    assert collate(samples[:2], pad_id=0, packed=True).branches is None  # nothing shared: no branches


def test_a_prompt_is_shared_only_while_its_unit_costs_no_more_attention_than_its_members_alone():
    short = [member(i, (5, 6, 7, 8, 9, 10), (11 + i, 12)) for i in range(4)]  # 14² ≤ 4 · 8²
    assert share_prompts(short) == [Unit((0, 1, 2, 3), 6)]
    long = [member(i, (5, 6), tuple(range(20 + i, 30 + i))) for i in range(3)]  # (2 + 20)² > 2 · 12²
    assert share_prompts(long) == [Unit((0,), 0), Unit((1,), 0), Unit((2,), 0)]
    mixed = [member(0, (5, 6, 7, 8), (9,)), member(1, (5, 6, 7, 8), tuple(range(30, 60))),
             member(2, (5, 6, 7, 8), (10,)), member(3, (4, 6, 7, 8), (10,))]  # 3's prompt differs
    assert share_prompts(mixed) == [Unit((0, 2), 4), Unit((1,), 0), Unit((3,), 0)]
    assert share_prompts([sample(0, 4, 4), sample(1, 4, 4)]) == [Unit((0,), 0), Unit((1,), 0)]  # no prompt


def test_the_plan_gives_every_rank_as_many_micro_batches_and_each_sample_once():
    samples = [sample(i, n, 1) for i, n in enumerate([60, 58, 9, 8, 7, 6, 5, 40])]
    for packed in (False, True):
        per_rank = plan(samples, 2, token_budget=64, packed=packed)
        assert len({len(groups) for groups in per_rank}) == 1
        real = sorted(i for groups in per_rank for g in groups if not g.filler for i in g.indices)
        assert real == list(range(8))
        for groups in per_rank:
            for g in groups:
                lengths = [len(samples[i].token_ids) for i in g.indices]
                assert len(lengths) == 1 or (sum(lengths) if packed else len(lengths) * max(lengths)) <= 64
    # a rank whose one sample cannot be split gets a filler micro-batch (run with weight 0)
    uneven = plan([sample(0, 60, 1), sample(1, 30, 1), sample(2, 29, 1)], 2, token_budget=32, packed=True)
    assert [len(g) for g in uneven] == [2, 2] and uneven[0][1].filler and uneven[0][1].indices == (0,)


def test_shard_balances_tokens_and_covers_every_sample_once():
    samples = [sample(i, n, 1) for i, n in enumerate([50, 10, 40, 20, 30, 5])]
    shards = shard(samples, 2)
    assert sorted(i for s in shards for i in s) == list(range(6))
    loads = [sum(len(samples[i].token_ids) for i in s) for s in shards]
    assert abs(loads[0] - loads[1]) <= 10
    with pytest.raises(ValueError, match="train.workers=7"):
        shard(samples, 7)


def test_micro_batches_respect_the_token_budget():
    samples = [sample(i, n, 1) for i, n in enumerate([30, 10, 12, 8, 100])]
    groups = micro_batches(samples, range(5), token_budget=40)
    assert sorted(i for g in groups for i in g) == list(range(5))
    for g in groups:
        longest = max(len(samples[i].token_ids) for i in g)
        assert len(g) * longest <= 40 or len(g) == 1
    assert [4] in groups  # longer than the budget: alone


def test_global_totals_count_predicted_model_tokens():
    # a model token at position 0 is never predicted, so it is not counted
    first = TrainSample("x", "g", "d", (1, 2), (1, 0), (0.0, 0.0), (0, -1), 0.0, 0.0)
    assert global_totals([sample(0, 5, 2), sample(1, 3, 1), first]) == (3, 2)


def test_lr_schedules():
    f = lr_multiplier("cosine", warmup_steps=2, total_steps=10)
    assert [f(0), f(1)] == pytest.approx([1 / 3, 2 / 3])
    assert f(2) == pytest.approx(1.0) and f(10) == pytest.approx(0.0) and f(6) == pytest.approx(0.5)
    lin = lr_multiplier("linear", 0, 4)
    assert [lin(s) for s in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    assert lr_multiplier("constant", 0, 4)(3) == 1.0
    assert math.isclose(lr_multiplier("cosine", 0, 4)(2), 0.5)
    with pytest.raises(ValueError, match="train.schedule"):
        lr_multiplier("step", 0, 1)
