"""Agent domains on the real system pieces: EnvWorker actors placed on the `env` pool serve their agents
through the gateway, generation runs on a real InferenceWorker (the tiny model) behind LLMProxy, and a
recording LLM client keeps every request and result the engine answered — so each recorded turn is compared
with the very ids the engine sampled, including after an agent rewrote its history."""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest
import ray
import ray.cloudpickle

from rollart.config.loader import load_config
from rollart.envs import ActorLLMClient, EnvRouter
from rollart.resources.placement import Resources
from rollart.types import GenerationRequest, GenerationResult, Status, Task

pytestmark = pytest.mark.ray
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HERE = "tests.integration.agents_for_tests"


class Recorder:
    def __init__(self) -> None:
        self.calls: dict[str, tuple[GenerationRequest, GenerationResult]] = {}

    def add(self, request: GenerationRequest, result: GenerationResult) -> None:
        self.calls[request.request_id] = (request, result)

    def all(self) -> dict[str, tuple[GenerationRequest, GenerationResult]]:
        return self.calls


class RecordingClient:
    """An LLMClient over the proxy that also sends each (request, result) to a Recorder actor."""

    def __init__(self, inner, recorder) -> None:
        self.inner, self.recorder = inner, recorder

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.inner.generate(request)
        await self.recorder.add.remote(request, result)
        return result

    async def abort(self, trajectory_id: str) -> None:
        await self.inner.abort(trajectory_id)


def test_agent_trajectories_record_exactly_the_engines_tokens_and_cancel(ray_local, tiny_model_path):
    from rollart.inference import InferenceWorker, LLMProxy

    cfg = load_config(None, [
        f"model.path={tiny_model_path}", "envs.workers=1", "cluster.placement_timeout_s=10",
        "domains.frozenlake=null", "domains.math=null",
        "domains.calc.agent=examples.agents.calculator_agent:run", "domains.calc.max_turns=3",
        "domains.calc.max_new_tokens=24",
        f"domains.rewrite.agent={HERE}:rewriting", f"domains.wait.agent={HERE}:one_call_then_wait",
    ])
    resources = Resources.connect(cfg, name=f"rm-agents-{uuid.uuid4().hex[:8]}")
    worker = ray.remote(InferenceWorker).options(num_cpus=0).remote(cfg, "gen_decode", 0)
    ray.get(worker.ready.remote(), timeout=120)
    proxy = ray.remote(LLMProxy).options(num_cpus=0).remote(
        {"gen_decode": [worker]}, {d: "gen_decode" for d in cfg.domains}, cfg.inference)
    recorder = ray.remote(Recorder).options(num_cpus=0).remote()
    router = EnvRouter.place(resources, cfg, RecordingClient(ActorLLMClient(proxy), recorder), model_path=tiny_model_path)
    try:
        async def scenario():
            waiting = asyncio.ensure_future(router.run(Task("w/0", "wait", "", 0, "w"), 0))
            runs = [router.run(Task(f"{d}/{i}", d, "", i, d), 0) for d in ("calc", "rewrite") for i in range(3)]
            done = await asyncio.wait_for(asyncio.gather(*runs), 180)
            for _ in range(2400):  # the waiting agent made its call and now sleeps (≤ 120 s)
                if (await router.progress()).get("w/0") is not None:
                    break
                await asyncio.sleep(0.05)
            progress = await router.progress()
            await router.cancel("w/0", Status.STALE, "older than alpha")
            return done, progress, await asyncio.wait_for(waiting, 30)

        done, progress, waited = asyncio.run(scenario())
        calls = ray.get(recorder.all.remote(), timeout=30)
    finally:
        router.shutdown()
        for actor in (proxy, worker, recorder, resources.manager):
            ray.kill(actor)
    assert progress["w/0"] == 0  # its one call's tokens carry version 0
    assert waited.status is Status.STALE and waited.status_reason == "older than alpha" and len(waited.turns) == 1
    assert waited.metrics["calls"] == 1
    for traj in done:
        assert traj.status in (Status.COMPLETED, Status.TRUNCATED), traj.status_reason
        context: list[int] = []
        for k, turn in enumerate(traj.turns):
            request, result = calls[f"{traj.trajectory_id}/{k}"]
            if k and turn.segment != traj.turns[k - 1].segment:
                context = []
            context += turn.prompt_token_ids
            assert request.prompt_token_ids == tuple(context)  # the engine saw the recorded context …
            assert turn.response_token_ids == result.token_ids  # … and sampled exactly the recorded ids
            assert (turn.logprobs, turn.versions) == (result.logprobs, result.versions)
            context += turn.response_token_ids
        spans = {s.name for s in traj.turns[0].spans}
        assert {"agent.step", "generate.wait", "generate"} <= spans
    rewrites = [t for t in done if t.domain == "rewrite"]
    assert all([t.segment for t in r.turns] == [0, 0, 1] and r.env_return == 0.5 for r in rewrites)
    assert all(r.metrics["segments_branched"] == 1 for r in rewrites)
    assert {len(s.token_ids()) for r in rewrites for s in r.segments()}  # each segment is one sequence
