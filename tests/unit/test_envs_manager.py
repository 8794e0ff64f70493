"""EnvManager with a scripted LLMClient: token-in/token-out bookkeeping against a fresh tokenisation,
statuses, format penalties, limits, timeouts and retries under injected faults, cancellation, the turn
turn_barrier, spans and sampling."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollart.config import DomainConfig, EnvsConfig, FaultInjectionConfig, LatencyConfig, RunConfig
from rollart.envs import ChatTokens, EnvManager, demonstrations, domain_sampling, episode_seed, resolve_env
from rollart.envs.domains.math_env import make_problem
from rollart.models import load_tokenizer
from rollart.types import SamplingParams, Status, Task
from envs_fakes import RecordingTurnBarrier, ScriptedLLM


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="module")
def chat(tok):
    return ChatTokens(tok)


class Recorder:
    """A tiny env whose behaviour each test sets: slow steps, failing steps, closes counted."""

    closes = 0
    reset_failures_left = 0  # the next resets (of any instance) that fail

    def __init__(self, step_sleep_s: float = 0.0, step_error: Exception | None = None) -> None:
        self.step_sleep_s, self.step_error = step_sleep_s, step_error

    def reset(self, seed=None):
        if Recorder.reset_failures_left > 0:
            Recorder.reset_failures_left -= 1
            raise ConnectionError("env server not up yet")
        return "Say something.", {"reference": {"x": 1}}

    def step(self, action):
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        if self.step_error:
            raise self.step_error
        return "ok", 0.5, False, False, {}

    def close(self):
        Recorder.closes += 1



def make_manager(chat, llm, *, env="frozenlake", seed=0, split="train", factory=None, turn_barrier=None, envs=None,
                 sampling=None, trajectory_id="traj-0", **domain):
    dom = DomainConfig(env=env, **domain)
    task = Task(trajectory_id=trajectory_id, domain="d", env=env, seed=seed, group_id="g", split=split)
    return EnvManager(
        task,
        start_version=2,
        make_env=factory or resolve_env(env, dom.options),
        domain_cfg=dom,
        envs=envs or EnvsConfig(retry_backoff_s=0.01, retry_backoff_max_s=0.02),
        llm=llm,
        chat=chat,
        sampling=sampling or SamplingParams(max_new_tokens=48, stop_token_ids=chat.stop_token_ids),
        turn_barrier=turn_barrier,
        worker="env/env/0",
    )


def conversation(traj):
    messages = []
    for turn in traj.turns:
        messages += [{"role": "user", "content": turn.observation}, {"role": "assistant", "content": turn.action}]
    return messages


def expert_script(domain, seed, max_turns=12):
    demo = demonstrations(domain, DomainConfig(env=domain, max_turns=max_turns), [seed])[0]
    return [m["content"] for m in demo.messages if m["role"] == "assistant"]


class FrozenlakeObs:
    @staticmethod
    def first(seed: int) -> str:
        from rollart.envs.domains.frozenlake import FrozenLakeEnv

        return FrozenLakeEnv().reset(seed=episode_seed(Task("t", "d", "frozenlake", seed, "g")))[0]


# --- token-in/token-out -----------------------------------------------------------------------------
def test_tokens_equal_a_fresh_tokenisation_of_the_conversation(tok, chat):
    script = ["let me think \\boxed{Jump}"] + expert_script("frozenlake", 4)
    llm = ScriptedLLM(tok, script, version=2)
    traj = asyncio.run(make_manager(chat, llm, seed=4, max_turns=12).run())
    assert traj.status is Status.COMPLETED and traj.reward is None
    assert len(traj.turns) == len(script)
    fresh = tok.apply_chat_template(conversation(traj), tokenize=True, return_dict=False)
    ids = traj.token_ids()
    assert ids + tok.encode("\n", add_special_tokens=False) == list(fresh)  # the template's final newline
    # each request's context is exactly the trajectory so far: nothing re-tokenised
    so_far: list[int] = []
    for turn, request in zip(traj.turns, llm.requests):
        so_far += list(turn.prompt_token_ids)
        assert list(request.prompt_token_ids) == so_far
        so_far += list(turn.response_token_ids)
    # the loss mask covers the model's tokens only, including its stop token
    mask = traj.loss_mask()
    assert sum(mask) == traj.num_response_tokens
    assert [i for i, m in zip(ids, mask) if m] == [t for turn in traj.turns for t in turn.response_token_ids]
    assert all(t.response_token_ids[-1] == chat.end_token_id for t in traj.turns)


def test_length_finished_turns_are_closed_by_the_template(tok, chat):
    question, answer = make_problem(episode_seed(Task("t", "d", "math", 9, "g")))
    llm = ScriptedLLM(tok, ["hmm", f"It is \\boxed{{{answer}}}"], stop=False)
    traj = asyncio.run(make_manager(chat, llm, env="math", seed=9, max_turns=2).run())
    assert traj.status is Status.COMPLETED
    assert [t.finish_reason for t in traj.turns] == ["length", "length"]
    assert traj.reference == {"answer": answer} and question in traj.turns[0].observation
    fresh = tok.apply_chat_template(conversation(traj), tokenize=True, return_dict=False)
    assert traj.token_ids() + tok.encode("<|im_end|>\n", add_special_tokens=False) == list(fresh)


def test_demonstration_layout_equals_the_rollout_layout(tok, chat):
    script = expert_script("sokoban", 2)
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, script), env="sokoban", seed=2, max_turns=12).run())
    demo = demonstrations("sokoban", DomainConfig(env="sokoban", max_turns=12), [2])[0]
    ids, mask = chat.conversation(demo.messages)
    assert ids == traj.token_ids() and mask == traj.loss_mask()


# --- statuses, rewards, limits ------------------------------------------------------------------------
def test_malformed_action_is_penalised_and_the_episode_goes_on(tok, chat):
    script = ["\\boxed{Fly}"] + expert_script("frozenlake", 1)
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, script), seed=1, format_penalty=-0.25).run())
    assert traj.status is Status.COMPLETED and traj.status_reason == "env terminated"
    assert traj.turns[0].reward == -0.25 and not traj.turns[0].format_ok
    assert all(t.format_ok for t in traj.turns[1:])
    assert traj.env_return == pytest.approx(0.75) and traj.metrics["format_errors"] == 1


def test_end_on_format_error(tok, chat):
    mgr = make_manager(chat, ScriptedLLM(tok, ["no idea"]), env="math", end_on_format_error=True, max_turns=3)
    traj = asyncio.run(mgr.run())
    assert traj.status is Status.COMPLETED and "malformed" in traj.status_reason
    assert len(traj.turns) == 1 and traj.env_return == -0.1


def test_max_turns_truncates(tok, chat):
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, ["\\boxed{Left}"]), max_turns=3).run())
    assert traj.status is Status.TRUNCATED and "max_turns" in traj.status_reason
    assert len(traj.turns) == 3 and traj.status.trainable


def test_max_total_tokens_truncates_and_caps_new_tokens(tok, chat):
    first_prompt = len(chat.initial(FrozenlakeObs.first(0)))
    limit = first_prompt + 30
    llm = ScriptedLLM(tok, ["\\boxed{Left}"])
    traj = asyncio.run(make_manager(chat, llm, max_turns=8, max_total_tokens=limit).run())
    assert traj.status is Status.TRUNCATED and "max_total_tokens" in traj.status_reason
    assert len(traj.token_ids()) <= limit
    assert llm.requests[0].sampling.max_new_tokens == min(48, limit - first_prompt)


def test_step_error_fails_the_trajectory_with_its_text(tok, chat):
    Recorder.closes = 0
    factory = lambda: Recorder(step_error=ValueError("board exploded"))  # noqa: E731
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, ["hi"]), env="custom", factory=factory).run())
    assert traj.status is Status.FAILED and "env.step failed: ValueError: board exploded" in traj.status_reason
    assert len(traj.turns) == 1 and Recorder.closes == 1


def test_generation_error_fails_the_trajectory(tok, chat):
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, ["\\boxed{Left}"], fail_on_turn=1)).run())
    assert traj.status is Status.FAILED and "generation failed" in traj.status_reason
    assert len(traj.turns) == 1


# --- timeouts and retries -----------------------------------------------------------------------------
def test_failed_reset_is_retried_with_bounded_exponential_backoff(tok, chat, monkeypatch):
    import rollart.envs.manager as manager_module

    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(delay, *args, **kwargs):
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(manager_module.asyncio, "sleep", fake_sleep)
    Recorder.reset_failures_left, Recorder.closes = 4, 0
    envs = EnvsConfig(reset_retries=5, retry_backoff_s=0.1, retry_backoff_max_s=0.3)
    traj = asyncio.run(
        make_manager(chat, ScriptedLLM(tok, ["hi"]), env="custom", factory=Recorder, envs=envs, max_turns=1).run()
    )
    assert traj.status is Status.TRUNCATED and traj.metrics["reset_attempts"] == 5
    assert delays == [0.1, 0.2, 0.3, 0.3]
    assert Recorder.closes == 5  # each failed env closed, and the one that ran
    assert traj.reference == {"x": 1}


def test_reset_gives_up_after_its_retries_under_injected_failures(tok, chat):
    inject = FaultInjectionConfig(reset_fail_prob=1.0)
    envs = EnvsConfig(reset_retries=2, retry_backoff_s=0.0)
    llm = ScriptedLLM(tok, ["x"])
    traj = asyncio.run(make_manager(chat, llm, inject=inject, envs=envs).run())
    assert traj.status is Status.FAILED and "failed 3 times" in traj.status_reason
    assert traj.status_reason.count("injected env.reset failure") == 3
    assert traj.turns == () and llm.requests == []


def test_injected_hang_hits_the_reset_timeout(tok, chat):
    inject = FaultInjectionConfig(hang_prob=1.0)
    envs = EnvsConfig(reset_retries=1, retry_backoff_s=0.0, reset_timeout_s=0.05)
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, ["x"]), inject=inject, envs=envs).run())
    assert traj.status is Status.FAILED and traj.status_reason.count("timed out after 0.05s") == 2


def test_injected_step_failures_and_step_timeout(tok, chat):
    inject = FaultInjectionConfig(step_fail_prob=1.0)
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, ["\\boxed{Left}"]), inject=inject).run())
    assert traj.status is Status.FAILED and "injected env.step failure" in traj.status_reason
    slow = lambda: Recorder(step_sleep_s=0.5)  # noqa: E731
    envs = EnvsConfig(step_timeout_s=0.05)
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, ["x"]), env="custom", factory=slow, envs=envs).run())
    assert traj.status is Status.FAILED and traj.status_reason == "env.step timed out after 0.05s"


def test_injected_latency_is_recorded_in_step_spans(tok, chat):
    inject = FaultInjectionConfig(step_latency=LatencyConfig(dist="constant", mean_s=0.03))
    traj = asyncio.run(make_manager(chat, ScriptedLLM(tok, ["\\boxed{Left}"]), inject=inject, max_turns=2).run())
    steps = [s for t in traj.turns for s in t.spans if s.name == "env.step"]
    assert len(steps) == 2 and all(s.duration >= 0.03 for s in steps)


# --- cancellation, progress, turn_barrier, spans, sampling ----------------------------------------------------
def test_cancel_during_generation_aborts_it_and_returns_the_partial_trajectory(tok, chat):
    Recorder.closes = 0
    llm = ScriptedLLM(tok, ["something long"], delay_s=30.0, version=5)
    mgr = make_manager(chat, llm, env="custom", factory=Recorder)

    async def scenario():
        run = asyncio.ensure_future(mgr.run())
        while not llm.requests:
            await asyncio.sleep(0.01)
        await mgr.cancel(Status.STALE, "older than alpha")
        return await asyncio.wait_for(run, 5)

    traj = asyncio.run(scenario())
    assert traj.status is Status.STALE and traj.status_reason == "older than alpha"
    assert llm.aborted == ["traj-0"] and Recorder.closes == 1
    assert len(traj.turns) == 1 and traj.turns[0].finish_reason == "abort"
    assert mgr.progress() == 5


def test_cancel_during_a_slow_step_and_before_run(tok, chat):
    Recorder.closes = 0
    mgr = make_manager(chat, ScriptedLLM(tok, ["x"]), env="custom", factory=lambda: Recorder(step_sleep_s=0.3))

    async def scenario():
        run = asyncio.ensure_future(mgr.run())
        while mgr._phase != "env" or not mgr.trajectory.spans:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        await mgr.cancel(Status.ABORTED, "group full")
        return await asyncio.wait_for(run, 5)

    traj = asyncio.run(scenario())
    assert traj.status is Status.ABORTED and traj.status_reason == "group full" and Recorder.closes == 1
    early = make_manager(chat, ScriptedLLM(tok, ["x"]), env="custom", factory=Recorder)
    asyncio.run(early.cancel(Status.ABORTED, "not needed"))
    traj = asyncio.run(early.run())
    assert traj.status is Status.ABORTED and traj.spans == ()  # never reset
    asyncio.run(early.cancel(Status.STALE, "late"))  # a no-op once ended
    assert early.trajectory.status is Status.ABORTED


def test_gate_spans_and_progress(tok, chat):
    turn_barrier = RecordingTurnBarrier()
    llm = ScriptedLLM(tok, ["\\boxed{Left}"], version=7)
    mgr = make_manager(chat, llm, turn_barrier=turn_barrier, max_turns=3)
    assert mgr.progress() is None
    traj = asyncio.run(mgr.run())
    assert turn_barrier.calls == [("before_turn", "traj-0", 0), ("before_turn", "traj-0", 1), ("before_turn", "traj-0", 2),
                          ("leave", "traj-0", -1)]
    assert mgr.progress() == 7 and traj.min_token_version == 7 and traj.start_version == 2
    assert [s.name for s in traj.spans] == ["env.reset"] and traj.spans[0].worker == "env/env/0"
    for turn in traj.turns:
        names = [s.name for s in turn.spans]
        # the env manager's wait for generation is its own span; the engine's "generate" span (busy time
        # of the inference worker) comes with the result — never two "generate" spans for one request
        assert names[0] == "generate.wait" and names[-1] == "env.step" and names.count("generate") <= 1
        assert turn.spans[0].worker == "env/env/0" and turn.spans[-1].worker == "env/env/0"
    assert traj.metrics["turns"] == 3 and traj.metrics["generate_time_s"] >= 0


def test_domain_sampling_follows_the_config(chat):
    cfg = RunConfig.model_validate(
        {"rollout": {"temperature": 0.8, "top_p": 0.9, "top_k": 20}, "eval": {"temperature": 0.0}}
    )
    train = domain_sampling(cfg, "math", chat.stop_token_ids)
    val = domain_sampling(cfg, "math", chat.stop_token_ids, "val")
    assert (train.temperature, train.top_p, train.top_k) == (0.8, 0.9, 20)
    assert val.temperature == 0.0 and val.max_new_tokens == cfg.domains["math"].max_new_tokens
    assert train.stop_token_ids == chat.stop_token_ids and chat.end_token_id in train.stop_token_ids
    with pytest.raises(KeyError, match="not configured"):
        domain_sampling(cfg, "chess", chat.stop_token_ids)


def test_each_turn_samples_with_a_seed_stable_across_runs(tok, chat):
    from rollart.envs.seeds import request_seed

    llm = ScriptedLLM(tok, ["\\boxed{Left}"], version=0)
    mgr = make_manager(chat, llm, max_turns=2)
    asyncio.run(mgr.run())
    seeds = [r.sampling.seed for r in llm.requests]
    assert seeds == [request_seed(mgr.task, 0), request_seed(mgr.task, 1)]
    assert seeds[0] != seeds[1] and all(isinstance(s, int) for s in seeds)
