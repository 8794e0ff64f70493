"""InferenceWorker as a Ray actor, serving the built-in engine and vLLM alike: non-blocking ADD/ABORT,
weight prefetch and swap, stats."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from rollart.config import InferenceConfig, ModelConfig, RunConfig
from rollart.types import GenerationRequest, SamplingParams
from testutil import wait_until

pytestmark = pytest.mark.ray


class FakeSubscriber:
    """A `WeightSubscriber` over fixed versions (the weights plane's store is tested on its own)."""

    def __init__(self, versions: dict[int, dict[str, torch.Tensor]]) -> None:
        self.versions = versions

    async def latest_version(self) -> int:
        return max(self.versions)

    async def pull(self, version: int) -> dict[str, torch.Tensor]:
        return self.versions[version]


def perturbed_weights(model_path, scale=0.02):
    from rollart.models import load_model

    model = load_model(model_path)
    g = torch.Generator().manual_seed(1)
    return {n: p.detach() + scale * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}


def worker_config(model_path, **inference) -> RunConfig:
    return RunConfig(
        model=ModelConfig(path=str(model_path)),
        inference=InferenceConfig(weights_poll_s=0.1, request_timeout_s=60, **inference),
    )


def long_request(rid, traj, n=3000, prompt=(11, 12, 13, 14, 15)):
    return GenerationRequest(rid, traj, "math", prompt, SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True))



@pytest.fixture(scope="module", params=["builtin", "vllm"])
def worker(request, ray_local, tiny_model_path):
    """The same worker serving either engine (vllm: skipped where it is not installed, see make test-vllm)."""
    if request.param == "vllm" and importlib.util.find_spec("vllm") is None:
        if os.environ.get("ROLLART_REQUIRE_VLLM") == "1":
            pytest.fail("ROLLART_REQUIRE_VLLM=1 but vLLM is not installed in this Python (make install-vllm)")
        pytest.skip("vLLM is not installed in this venv; `make test-vllm` runs these cases in .venv-vllm")
    ray = ray_local
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    from rollart.inference.worker import InferenceWorker

    subscriber = FakeSubscriber({1: perturbed_weights(tiny_model_path)})
    handle = (
        ray.remote(InferenceWorker)
        .options(num_cpus=0, resources={"pool_gen_decode": 0.5})
        .remote(worker_config(tiny_model_path, engine=request.param), "gen_decode", 0, subscriber)
    )
    assert ray.get(handle.ready.remote(), timeout=120) == "inference/gen_decode/0"
    yield handle
    ray.get(handle.shutdown.remote(), timeout=30)
    ray.kill(handle)


def test_generate_matches_the_local_engine(ray_local, worker, tiny_model_path):
    from rollart.inference.builtin_engine import BuiltinEngine
    from rollart.models import load_model, load_tokenizer

    request = GenerationRequest("g1", "tg1", "math", (3, 4, 5, 6), SamplingParams(temperature=0.0, max_new_tokens=12))
    result = ray_local.get(worker.generate.remote(request), timeout=60)
    local = BuiltinEngine(load_model(tiny_model_path), load_tokenizer(tiny_model_path))
    local.add(request)
    expected = local.step()
    while not expected:
        expected = local.step()
    assert result.token_ids == expected[0].token_ids
    assert result.worker == "inference/gen_decode/0" and result.spans[0].worker == result.worker
    assert result.versions == (0,) * len(result.token_ids)


def test_short_request_returns_while_a_long_one_runs_and_abort_returns_tokens_so_far(ray_local, worker):
    ray = ray_local
    long_ref = worker.generate.remote(long_request("long", "t-long"))
    wait_until(lambda: ray.get(worker.stats.remote(), timeout=10)["tokens_generated"] > 20, "the long request to run")
    short = ray.get(
        worker.generate.remote(GenerationRequest("s", "t-s", "math", (7, 8), SamplingParams(max_new_tokens=3, seed=1))),
        timeout=60,
    )
    assert short.finish_reason in ("length", "stop")  # not held until its batch-mate finished
    ray.get(worker.abort.remote("t-long"), timeout=10)
    aborted = ray.get(long_ref, timeout=60)
    assert aborted.finish_reason == "abort" and 0 < len(aborted.token_ids) < 3000
    assert len(aborted.logprobs) == len(aborted.versions) == len(aborted.token_ids)
    stats = ray.get(worker.stats.remote(), timeout=10)
    assert stats["running"] == 0 and stats["in_flight"] == 0
    # the trajectory is over: a late request of it (e.g. one that raced the abort) does not run
    late = ray.get(worker.generate.remote(long_request("late", "t-long", n=5)), timeout=30)
    assert late.finish_reason == "abort" and late.token_ids == ()


def test_prefetched_weights_swap_during_generation(ray_local, worker):
    ray = ray_local
    wait_until(lambda: ray.get(worker.stats.remote(), timeout=10)["prefetched_version"] == 1, "the prefetch of v1")
    ref = worker.generate.remote(long_request("w", "t-w", n=1500))
    wait_until(lambda: ray.get(worker.stats.remote(), timeout=10)["running"] == 1, "the request to start")
    report = ray.get(worker.update_weights.remote(1), timeout=60)
    assert report["version"] == 1 and report["swapped"] == 1
    assert report["recompute_tokens"] == 0  # its counter as it stood before this swap (nothing recomputed yet)
    result = ray.get(ref, timeout=120)
    assert result.finish_reason == "length"
    first_new = result.versions.index(1)
    assert 0 < first_new and set(result.versions[:first_new]) == {0} and set(result.versions[first_new:]) == {1}
    stats = ray.get(worker.stats.remote(), timeout=10)
    assert stats["pulls_background"] >= 1 and stats["pulls_exposed"] == 0  # the pull was not on the swap's path
    assert stats["recompute_tokens"] >= 5 and stats["version"] == 1
    assert stats["pull_s_background"] > 0 and stats["exposed_update_s_total"] > 0
    # versions never go backwards: asking for an older or the same version is a no-op
    assert ray.get(worker.update_weights.remote(0), timeout=30)["swapped"] == 0
    assert ray.get(worker.update_weights.remote(1), timeout=30)["swapped"] == 0
    assert ray.get(worker.version.remote(), timeout=10) == 1


def test_bad_sampling_reaches_the_caller_as_value_error(ray_local, worker):
    bad = GenerationRequest("bad", "t-bad", "math", (1, 2), SamplingParams(top_k=-2))
    with pytest.raises(ValueError, match=r"sampling\.top_k=-2"):
        ray_local.get(worker.generate.remote(bad), timeout=30)
