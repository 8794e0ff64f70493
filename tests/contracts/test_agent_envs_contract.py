"""The contract of env kinds that run as agents (their adapter `RUNS_AGENT`): `verifiers:<taskset>`. Played the
way an env worker plays them — an `AgentManager` calling the adapter's `run(base_url, api_key, task)` against
a real `AgentGateway` session — over the two verifiers environments of examples/verifiers/, written as
verifiers' docs show on local task data: `vf_reverse` (single-turn) and `vf_lookup` (a tool, served by
verifiers as an MCP server per rollout). verifiers' own harness (`null`) and rubric run for real; the model is
a scripted LLM client that answers as an expert would, so what is checked is the bridge: every model call is
one gateway turn holding exactly the tokens the "engine" produced, the rubric's score is the trajectory's
env return, a seed picks one task, validation tasks are never training tasks, failures are named.
"""

from __future__ import annotations

import asyncio
import difflib
import re
from pathlib import Path

import pytest

from rollart.config import DomainConfig
from rollart.envs import EnvSpecError, check_env_spec
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.manager import AgentManager
from rollart.envs.chat import ChatTokens
from rollart.envs.spec import ADAPTERS, adapter_agent
from rollart.models.tiny import build_tokenizer
from rollart.types import SamplingParams, Status, Task
from tests.unit.envs_fakes import ScriptedLLM

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verifiers"
SPECS = ["verifiers:vf_reverse", "verifiers:vf_lookup"]


@pytest.fixture(scope="module")
def chat() -> ChatTokens:
    return ChatTokens(build_tokenizer(tool_calls=True))


@pytest.fixture(scope="module", autouse=True)
def examples_importable():
    mp = pytest.MonkeyPatch()
    mp.chdir(EXAMPLES)
    mp.syspath_prepend(str(EXAMPLES))
    yield
    mp.undo()


def expert(chat: ChatTokens):
    """What a perfect policy writes, read off the prompt the gateway rendered."""
    def reply(request, k: int) -> str:
        text = chat.tokenizer.decode(list(request.prompt_token_ids))
        if "Reverse the word" in text:
            word = text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0].strip()
            return f"<reversed>{word[::-1]}</reversed>"
        names = re.findall(r'look up "([^"]+)"', text)
        if not names:
            return "ok"
        if "<tool_response>" not in text:
            name = names[-1]
            return '<tool_call>\n{"name": "facts_lookup", "arguments": {"name": "%s"}}\n</tool_call>' % name
        fact = text.rsplit("<tool_response>", 1)[-1].split("</tool_response>")[0].strip()
        return f"<answer>{fact}</answer>"
    return reply


@pytest.fixture(scope="module")
def gateway(chat):
    llm = ScriptedLLM(chat.tokenizer, expert(chat))
    gw = AgentGateway(llm, chat).start()
    yield gw, llm
    gw.stop()


def play(spec: str, gateway, chat, seed: int, split: str = "train", tid: str = "t"):
    gw, llm = gateway
    domain = DomainConfig(env=spec, max_turns=4, max_new_tokens=64, max_total_tokens=2048)
    task = Task(f"{tid}-{spec}-{seed}-{split}", "vf", spec, seed, "g", split=split)
    before = len(llm.requests)
    manager = AgentManager(task, 0, agent=adapter_agent(domain), domain_cfg=domain, gateway=gw,
                           sampling=SamplingParams(max_new_tokens=64, stop_token_ids=chat.stop_token_ids))
    trajectory = asyncio.run(manager.run())
    return trajectory, llm.requests[before:]


def test_the_registry_and_the_config_agree_on_which_kinds_run_as_agents():
    from rollart.config.domains import AGENT_ENV_KINDS

    assert set(AGENT_ENV_KINDS) == {k for k, c in ADAPTERS.items() if getattr(c, "RUNS_AGENT", False)}
    assert DomainConfig(env="verifiers:vf_reverse").runs_agent and not DomainConfig(env="math").runs_agent


@pytest.mark.parametrize("spec", SPECS)
def test_an_episode_is_the_gateways_turns_and_the_rubrics_score(spec, gateway, chat):
    trajectory, requests = play(spec, gateway, chat, seed=3)
    assert trajectory.status is Status.COMPLETED, trajectory.status_reason
    assert len(trajectory.turns) == len(requests) == (1 if spec.endswith("reverse") else 2)
    for turn, request in zip(trajectory.turns, requests):
        generated = chat.tokenizer.encode(expert(chat)(request, 0 if turn is trajectory.turns[0] else 1),
                                          add_special_tokens=False)
        assert list(turn.response_token_ids[:len(generated)]) == generated  # the tokens trained on: the generated
    if spec.endswith("reverse"):
        word = trajectory.turns[0].observation.rsplit("\n", 1)[-1].strip()
        answer = re.search(r"<reversed>(.*)</reversed>", trajectory.turns[0].action).group(1)
        assert trajectory.env_return == pytest.approx(difflib.SequenceMatcher(None, answer, word[::-1]).ratio())
        assert trajectory.env_return == 1.0
    else:
        assert '"facts_lookup"' in trajectory.turns[0].action and trajectory.env_return == 1.0
    assert any(k.startswith("agent/reward.") for k in trajectory.metrics)


def test_episodes_at_once_share_one_serving_and_each_scores_its_own(gateway, chat):
    """Four vf_lookup episodes on one event loop at once (as an env worker runs them): verifiers' serving
    resources are shared, every episode completes with its own task's score."""
    gw, _ = gateway
    domain = DomainConfig(env="verifiers:vf_lookup", max_turns=4, max_new_tokens=64, max_total_tokens=2048)
    agent = adapter_agent(domain)

    async def main():
        managers = [AgentManager(Task(f"many-{s}", "vf", domain.env, s, "g"), 0, agent=agent, domain_cfg=domain,
                                 gateway=gw, sampling=SamplingParams(max_new_tokens=64,
                                                                     stop_token_ids=chat.stop_token_ids))
                    for s in (1, 2, 3, 4)]
        return await asyncio.gather(*(m.run() for m in managers))

    trajectories = asyncio.run(main())
    assert [t.status for t in trajectories] == [Status.COMPLETED] * 4, [t.status_reason for t in trajectories]
    assert all(t.env_return == 1.0 and len(t.turns) == 2 for t in trajectories)
    assert len({t.turns[0].observation for t in trajectories}) > 1  # different tasks, each answered rightly


def test_a_seed_picks_one_task_and_validation_tasks_are_held_out(gateway, chat):
    first = {seed: play("verifiers:vf_reverse", gateway, chat, seed, tid=f"s{seed}")[0].turns[0].observation
             for seed in (1, 2, 5)}
    again = play("verifiers:vf_reverse", gateway, chat, 1, tid="again")[0].turns[0].observation
    assert again == first[1] and len(set(first.values())) > 1
    env = adapter_agent(DomainConfig(env="verifiers:vf_reverse")).__self__
    train, val = {t.key for t in env.train}, {t.key for t in env.val}
    assert train and val and not train & val and len(val) == 5  # 10% of 50 words
    assert {env.task_for(s, "val").key for s in range(2_000_000_000, 2_000_000_050)} == val


def test_bad_specs_and_failing_episodes_are_named(gateway, chat, tmp_path, monkeypatch):
    with pytest.raises(EnvSpecError, match="verifiers cannot load taskset 'no_such_taskset'"):
        check_env_spec("verifiers:no_such_taskset")
    with pytest.raises(ValueError, match="val_fraction"):
        adapter_agent(DomainConfig(env="verifiers:vf_reverse", options={"val_fraction": 1.5}))
    (tmp_path / "vf_broken.py").write_text(
        "import verifiers.v1 as vf\n\n"
        "class BrokenTask(vf.Task[vf.TaskData]):\n"
        "    @vf.reward\n"
        "    async def boom(self, trace: vf.Trace) -> float:\n"
        "        raise ZeroDivisionError('the rubric broke')\n\n"
        "class BrokenTaskset(vf.Taskset[BrokenTask, vf.TasksetConfig]):\n"
        "    def load(self):\n"
        "        return [BrokenTask(vf.TaskData(idx=i, prompt=f'say {i}'), self.config.task) for i in range(3)]\n\n"
        "__all__ = ['BrokenTaskset']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    trajectory, _ = play("verifiers:vf_broken", gateway, chat, seed=0)
    assert trajectory.status is Status.FAILED and "the rubric broke" in trajectory.status_reason


def test_env_play_makes_you_the_model(capsys):
    from rollart.cli import main

    assert main(["env", "play", "verifiers:vf_reverse", "--seed", "3", "--actions", "<reversed>nope</reversed>"]) == 0
    out = capsys.readouterr().out
    assert "you are the model" in out and "-- reply 1: <reversed>nope</reversed>" in out
    assert "== end: completed" in out and "agent/reward.similarity" in out
    assert main(["env", "play", "verifiers:vf_reverse", "--policy", "expert"]) == 2
    assert "no expert policy" in capsys.readouterr().err


def test_harness_packages_resolve_as_of_the_pinned_date_unless_the_user_pinned_them():
    """A fresh machine resolves the harness scripts' unpinned packages as of the pinned date (httpx2 2.17.0 broke
    the `null` harness on every fresh machine), in a cache of its own (uv reuses a script environment it resolved
    before, whatever the date); a pin the user set is left alone."""
    from rollart.envs.adapters.verifiers import HARNESS_PACKAGES_BEFORE, pin_harness_packages

    environ: dict[str, str] = {}
    pin_harness_packages(environ)
    assert environ["UV_EXCLUDE_NEWER"] == HARNESS_PACKAGES_BEFORE
    assert environ["UV_CACHE_DIR"].endswith(f"uv-{HARNESS_PACKAGES_BEFORE[:10]}")
    mine = {"UV_EXCLUDE_NEWER": "2026-01-01T00:00:00Z"}
    pin_harness_packages(mine)
    assert mine == {"UV_EXCLUDE_NEWER": "2026-01-01T00:00:00Z"}
    cache = {"UV_CACHE_DIR": "/my/cache"}
    pin_harness_packages(cache)
    assert cache == {"UV_CACHE_DIR": "/my/cache", "UV_EXCLUDE_NEWER": HARNESS_PACKAGES_BEFORE}
