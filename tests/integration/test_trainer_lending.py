"""A trainer rank lends its device to generation (`train.elastic_generation`), as the LLM proxy calls it.

- The lent engine serves the trainer's own weights: at each version, token for token and logprob for logprob
  what an engine loaded with the weight store's copy of that version generates (the bit-identical invariant).
- A train step takes the device back first: a turn still running there returns aborted with its tokens so far.
- A request that comes while the device is not lent returns aborted at once (the proxy moves it on).
- The next loan serves the new version, on the same tensors the optimizer updated (no transfer).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import ray
import torch

from rollart.algo import PolicyObjective
from rollart.config import WeightsConfig
from rollart.inference.builtin_engine import BuiltinEngine
from rollart.inference.lent_engine import lent_engine_factory
from rollart.models import load_model, load_tokenizer
from rollart.trainer import TrainerRanks
from rollart.types import GenerationRequest, SamplingParams
from rollart.weights import WeightStore

from trainer_helpers import connect, synthetic_batch, trainer_config

pytestmark = pytest.mark.ray
PROMPT = tuple(range(5, 25))


def generate(rank, request: GenerationRequest, channel: str):
    """One request through the calls the LLM proxy makes of a worker (`submit`, then `take` until it is back)."""
    ray.get(rank.submit.remote(channel, [(0, request)]), timeout=60)
    for _ in range(20):
        outcomes = ray.get(rank.take.remote(channel, 5.0), timeout=60)
        if outcomes:
            (seq, result, error), = outcomes
            assert seq == 0 and error is None, error
            return result
    raise AssertionError("the lent engine never answered")


def reference(model_path, weights, version: int, request: GenerationRequest):
    """The same request on a fresh engine loaded with `weights` (what the store carries for `version`), with the
    rank's one torch thread (another thread count sums in another order: logprobs differ in the last bits)."""
    engine = BuiltinEngine(load_model(model_path), load_tokenizer(model_path), version=-1)
    engine.swap_weights(version, weights)
    engine.add(request)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(1000):
            for result in engine.step():
                return result
    finally:
        torch.set_num_threads(threads)
    raise AssertionError("the reference engine never finished")


def test_a_lent_rank_serves_its_own_weights_and_a_train_step_takes_the_device_back(ray_local, tiny_model_path,
                                                                                    tmp_path):
    cfg = trainer_config(tiny_model_path, tmp_path)
    store = WeightStore(WeightsConfig(), name=f"ws-{uuid.uuid4().hex[:8]}")
    sub = store.subscriber()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    try:
        with TrainerRanks(cfg, connect(cfg), PolicyObjective.of(cfg), store.publisher(),
                          lent_engine=lent_engine_factory(cfg)) as group:
            rank, = group.actors()
            assert ray.get(rank.ready.remote(), timeout=30).endswith("/lent")

            assert group.lend()["version"] == 0
            first = generate(rank, GenerationRequest("a", "t-a", "d", PROMPT, greedy), "c")
            expected = reference(tiny_model_path, asyncio.run(sub.pull(0)), 0,
                                 GenerationRequest("a", "t-a", "d", PROMPT, greedy))
            assert first.versions == (0,) * 12 and first.token_ids == expected.token_ids
            assert first.logprobs == expected.logprobs

            # a long turn is running when the train step comes: the step takes the device back first
            long = SamplingParams(temperature=1.0, max_new_tokens=100_000, ignore_eos=True, seed=1)
            ray.get(rank.submit.remote("c", [(1, GenerationRequest("b", "t-b", "d", PROMPT, long))]), timeout=60)
            group.train_step(synthetic_batch(version=0))
            outcomes = []
            for _ in range(20):
                outcomes += ray.get(rank.take.remote("c", 5.0), timeout=60)
                if outcomes:
                    break
            (seq, cut, error), = outcomes
            assert seq == 1 and error is None and cut.finish_reason == "abort" and len(cut.token_ids) < 100_000
            assert group.version == 1

            # not lent: a request returns aborted, empty, at once
            late = generate(rank, GenerationRequest("c", "t-c", "d", PROMPT, greedy), "c")
            assert late.finish_reason == "abort" and late.token_ids == ()

            # the next loan serves version 1 — the tensors the optimizer updated, as the store carries them
            assert group.lend()["version"] == 1
            second = generate(rank, GenerationRequest("d", "t-d", "d", PROMPT, greedy), "c")
            expected = reference(tiny_model_path, asyncio.run(sub.pull(1)), 1,
                                 GenerationRequest("d", "t-d", "d", PROMPT, greedy))
            assert second.versions == (1,) * 12 and second.token_ids == expected.token_ids
            assert second.logprobs == expected.logprobs
            assert second.logprobs != first.logprobs  # (the step moved the weights: the check could fail)
            reclaimed = group.reclaim()
            assert reclaimed["preempted"] == 0 and reclaimed["busy_s"] > 0  # (it generated `second` in this loan)
            stats = ray.get(rank.stats.remote(), timeout=30)
            assert stats["loans"] == 2 and stats["serving"] == 0.0
    finally:
        store.close()
