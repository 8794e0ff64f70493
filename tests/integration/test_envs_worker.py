"""EnvWorker actors on the shared local Ray, placed on the `env` pool by the resource plane, driven
through EnvRouter (the TrajectoryRunner): first with a fake LLM actor (many concurrent episodes,
cancellation, progress, a pickled router copy), then with the real inference plane (InferenceWorker on the
tiny model behind LLMProxy)."""

from __future__ import annotations

import asyncio
import pickle
import sys
import uuid

import pytest
import ray.cloudpickle

from rollart.config.loader import load_config
from rollart.envs import EnvRouter
from rollart.models import load_tokenizer
from rollart.resources.placement import Resources
from rollart.types import GenerationRequest, GenerationResult, Status, Task

pytestmark = pytest.mark.ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FakeLLMActor:
    """Answers `\\boxed{Down}` (and `\\boxed{7}` for math) at once; trajectories whose id contains
    'slow' wait until aborted. Tokens carry version 3."""

    def __init__(self, model_path: str) -> None:
        from rollart.models import load_tokenizer

        self.tok = load_tokenizer(model_path)
        self.aborts: dict[str, asyncio.Event] = {}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        text = "\\boxed{7}" if request.domain == "math" else "\\boxed{Down}"
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        finish = "stop"
        if "slow" in request.trajectory_id:
            event = self.aborts.setdefault(request.trajectory_id, asyncio.Event())
            await asyncio.wait_for(event.wait(), 60)
            ids, finish = ids[:2], "abort"
        return GenerationResult(request.request_id, request.trajectory_id, tuple(ids), tuple([-1.0] * len(ids)),
                                tuple([3] * len(ids)), finish, len(request.prompt_token_ids), worker="inference/fake/0")

    async def abort(self, trajectory_id: str) -> None:
        self.aborts.setdefault(trajectory_id, asyncio.Event()).set()


def run_config(tiny_model_path, *extra):
    return load_config(None, [f"model.path={tiny_model_path}", "envs.workers=2", "cluster.placement_timeout_s=10",
                              "domains.frozenlake.max_turns=4", *extra])


@pytest.fixture
def resources(ray_local, tiny_model_path):
    res = Resources.connect(run_config(tiny_model_path), name=f"rm-envs-{uuid.uuid4().hex[:8]}")
    yield res
    ray_local.kill(res.manager)


def task(i: int, domain: str = "frozenlake", tag: str = "t") -> Task:
    return Task(trajectory_id=f"{tag}-{domain}-{i}", domain=domain, env=domain, seed=i, group_id=f"g{i}")


def test_env_pool_runs_many_episodes_cancels_and_reports_progress(ray_local, resources, tiny_model_path):
    import ray

    cfg = run_config(tiny_model_path, "envs.warm_pool.size=2", "envs.warm_pool.domains=[frozenlake]")
    llm = ray.remote(FakeLLMActor).options(num_cpus=0).remote(str(tiny_model_path))
    router = EnvRouter.place(resources, cfg, llm, model_path=tiny_model_path)
    try:
        async def scenario():
            slow = asyncio.ensure_future(router.run(task(0, tag="slow"), 1))
            runs = [router.run(task(i), 1) for i in range(6)] + [router.run(task(i, "math"), 1) for i in range(4)]
            done = await asyncio.wait_for(asyncio.gather(*runs), 120)
            for _ in range(200):  # the slow one is waiting for its generation
                progress = await router.progress()
                if "slow-frozenlake-0" in progress:
                    break
                await asyncio.sleep(0.05)
            copy = pickle.loads(pickle.dumps(router))  # a copy does not know where it runs: it broadcasts
            await copy.cancel("slow-frozenlake-0", Status.STALE, "older than alpha")
            return done, progress, await asyncio.wait_for(slow, 30), await router.stats(), await router.reset_metrics()

        done, progress, slow, stats, resets = asyncio.run(scenario())
    finally:
        router.shutdown()
    assert [t.trajectory_id for t in done] == [f"t-frozenlake-{i}" for i in range(6)] + [f"t-math-{i}" for i in range(4)]
    for traj in done[:6]:
        assert traj.status in (Status.COMPLETED, Status.TRUNCATED) and traj.turns
        assert all(t.action == "\\boxed{Down}" and t.versions == (3,) * len(t.versions) for t in traj.turns)
        assert traj.spans[0].name == "env.reset" and traj.reward is None
    for traj in done[6:]:
        assert traj.status is Status.COMPLETED and traj.reference["answer"] and len(traj.turns) == 1
    workers = {t.spans[0].worker for t in done}
    assert workers == {"env/env/0", "env/env/1"}  # both workers took trajectories
    assert progress["slow-frozenlake-0"] is None  # no token generated yet
    assert slow.status is Status.STALE and slow.status_reason == "older than alpha"
    assert slow.turns[0].finish_reason == "abort"
    assert sum(s["finished"] for s in stats) == 11 and all(s["in_flight"] == 0 for s in stats)
    # every reset reached the router's metrics; frozenlake's came from its warm pools (filled at placement)
    assert resets["env/frozenlake/resets"] == 7 and resets["env/math/resets"] == 4
    assert resets["env/frozenlake/pool_hits"] + resets["env/frozenlake/pool_misses"] == 7
    assert resets["env/frozenlake/pool_hits"] >= 1 and resets["env/math/pool_hits"] == resets["env/math/pool_misses"] == 0
    assert 0 < resets["env/frozenlake/reset_p50_s"] <= resets["env/frozenlake/reset_p99_s"]
    assert all(s["pools"]["frozenlake"]["ready"] <= 2 for s in stats) and all("math" not in s["pools"] for s in stats)


def test_env_pool_with_the_real_inference_plane(ray_local, resources, tiny_model_path):
    import ray

    from rollart.inference import InferenceWorker, LLMProxy

    cfg = run_config(tiny_model_path, "envs.workers=1", "domains.frozenlake.max_new_tokens=8",
                     "domains.math.max_new_tokens=8")
    worker = ray.remote(InferenceWorker).options(num_cpus=0).remote(cfg, "gen_decode", 0)
    ray.get(worker.ready.remote(), timeout=120)
    proxy = ray.remote(LLMProxy).options(num_cpus=0).remote(
        {"gen_decode": [worker]}, {"frozenlake": "gen_decode", "math": "gen_decode"}, cfg.inference
    )
    router = EnvRouter.place(resources, cfg, proxy, model_path=tiny_model_path)  # as the driver does
    try:
        async def scenario():
            runs = [router.run(task(i, d, "real"), 0) for i in range(2) for d in ("frozenlake", "math")]
            return await asyncio.wait_for(asyncio.gather(*runs), 240)

        trajectories = asyncio.run(scenario())
    finally:
        router.shutdown()
        ray.kill(proxy)
        ray.kill(worker)
    tok = load_tokenizer(tiny_model_path)
    assert any(len(t.turns) > 1 for t in trajectories)
    for traj in trajectories:
        assert traj.status in (Status.COMPLETED, Status.TRUNCATED), traj.status_reason
        assert traj.turns and all(0 < len(t.response_token_ids) <= 8 for t in traj.turns)
        assert all(set(t.versions) == {0} for t in traj.turns)
        # the env manager's wait, then the engine's own span from the inference worker that generated
        spans = {sp.name: sp.worker for sp in traj.turns[0].spans}
        assert spans["generate.wait"] == "env/env/0" and spans["generate"] == "inference/gen_decode/0"
        assert sum(traj.loss_mask()) == traj.num_response_tokens
        # token-in/token-out: a later turn's new ids close the model's message (the part of "<|im_end|>\n"
        # it did not write) and add the next observation as a user message
        for prev, turn in zip(traj.turns, traj.turns[1:]):
            closing = "\n" if prev.response_token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") else "<|im_end|>\n"
            text = tok.decode(list(turn.prompt_token_ids))
            assert text == f"{closing}<|im_start|>user\n{turn.observation}<|im_end|>\n<|im_start|>assistant\n"
        assert tok.decode(list(traj.turns[0].prompt_token_ids)).startswith("<|im_start|>user\n")
