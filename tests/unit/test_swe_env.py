"""The SWE repair env on the real workspace sandbox: tools, format penalties, reward from hidden tests in a
fresh sandbox, and the malice of the issue — each class refused or contained, and none raises the reward.

Every attack runs through the env's own tools (what a policy types), then the buggy package is submitted:
the reward must stay 0, and the expert's fix afterwards must still score 1 (the env survived)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import psutil
import pytest

from rollart.envs.domains.swe.env import SweEnv
from rollart.envs.domains.swe.tools import call_text
from rollart.envs.protocol import FORMAT_ERROR_KEY


@pytest.fixture
def env():
    swe = SweEnv(difficulty=1, command_timeout_s=5.0)
    swe.reset(seed=3)
    yield swe
    swe.close()


def bash(env: SweEnv, command: str) -> str:
    return env.step(call_text("bash", command=command))[0]


def assert_unraised_and_alive(env: SweEnv) -> None:
    """The buggy package scores 0 whatever was tried; the expert's fix still scores 1."""
    assert env.score is None
    fresh = SweEnv(difficulty=env.difficulty)
    fresh.reset(seed=3)
    try:
        # the attacked env: submit as it is (the bug unfixed) → 0
        obs, reward, terminated, _, info = env.step(call_text("submit"))
        assert terminated and reward == 0.0 and info["hidden_passed"] < info["hidden_total"], obs
        # a fresh env of the same task: the expert still solves it → the attack left nothing behind
        fresh.step(fresh.expert_action())
        assert fresh.step(fresh.expert_action())[1] == 1.0
    finally:
        fresh.close()


def test_tools_run_in_the_workspace_and_the_expert_scores_one(env):
    assert "FAIL" in env.step(call_text("run_tests"))[0]
    assert "def " in env.step(call_text("read_file", path=env.task.bug.path))[0]
    assert env.step(env.expert_action())[0] == f"patched {env.task.bug.path}"
    assert "OK" in env.step(call_text("run_tests"))[0]
    obs, reward, terminated, truncated, info = env.step(env.expert_action())
    assert (reward, terminated, truncated) == (1.0, True, False) and info["hidden_passed"] == info["hidden_total"]
    assert obs == f"Submitted: {info['hidden_total']} of {info['hidden_total']} hidden tests pass."


@pytest.mark.parametrize("action", [
    "I would fix the bug.", "<tool_call>{not json}</tool_call>", call_text("rm_rf", path="/"),
    "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {}}\n</tool_call>",
    call_text("run_tests") + call_text("submit"), "<tool_call>{\"name\": \"bash\"",
    "<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>",  # RecursionError out of env.step before
    "<tool_call>" * 50_000,  # a regex rescanned the rest from every opening: quadratic
])
def test_a_malformed_tool_call_is_a_format_error_turn_not_a_crash(env, action):
    obs, reward, terminated, truncated, info = env.step(action)
    assert info[FORMAT_ERROR_KEY] and "Invalid tool call" in obs and "<tool_call>" in obs
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_symlinks_out_of_the_workspace_are_refused(env):
    bash(env, "ln -s /etc/passwd passwd; ln -s / host; ln -s /etc/hostname ledger/leak.py")
    for path in ("passwd", "host/etc/shadow", "/etc/passwd", "../../etc/passwd", "ledger/leak.py"):
        obs = env.step(call_text("read_file", path=path))[0]
        assert obs.startswith("read_file refused"), (path, obs)
        assert "root:" not in obs
    assert env.step(call_text("write_file", path="host/tmp/x", content="x"))[0].startswith("write_file refused")
    assert "ledger/leak.py" not in env.package_files()  # scoring never follows a link either
    assert_unraised_and_alive(env)


def test_proc_shows_no_other_process(env):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        obs = bash(env, f"ls /proc | grep -c '^[0-9]'; test -e /proc/{sleeper.pid}/cmdline && echo VIS''IBLE; "
                        "cat /proc/1/cmdline | tr '\\0' ' '")
        assert "VISIBLE" not in obs and "sleep 30" not in obs  # (pid 1 there is this very command)
        assert int(obs.split("\n")[1]) < 10  # only the command's own few processes
    finally:
        sleeper.kill()
    assert_unraised_and_alive(env)


def test_hidden_tests_are_nowhere_to_read_and_written_tests_do_not_count(env):
    expected = env.task.hidden[0].expected
    obs = bash(env, "grep -rl 'rollart-hidden' / 2>/dev/null | head; ls -a /workspace /tmp")
    assert "_rollart_hidden" not in obs
    # forge: a passing test suite, a sitecustomize, and a result line of its own
    env.step(call_text("write_file", path="tests/test_hidden.py", content="import unittest\n"))
    env.step(call_text("write_file", path="sitecustomize.py", content="import os; os._exit(0)\n"))
    env.step(call_text("write_file", path="_rollart_hidden.py", content=f"print({expected!r})\n"))
    assert_unraised_and_alive(env)


def test_the_env_server_and_host_processes_cannot_be_killed(env):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        bash(env, "kill -9 -1; pkill -9 -f python; pkill -9 sleep; kill -9 1")
        time.sleep(0.2)
        assert sleeper.poll() is None  # the host's processes (this test's interpreter too) are out of reach
    finally:
        sleeper.kill()
    assert_unraised_and_alive(env)


def workspace_processes(env: SweEnv) -> list[psutil.Process]:
    uid = env._workspace._uid
    return [p for p in psutil.process_iter(["uids"]) if uid is not None and p.info["uids"]
            and p.info["uids"].real == uid]


def test_fork_bombs_and_background_processes_do_not_outlive_their_command(env):
    start = time.monotonic()
    obs = bash(env, ":(){ :|:& };:")
    assert time.monotonic() - start < 30 and obs.startswith("[")  # contained: the command ended, reported
    obs = bash(env, "(sleep 300 &); nohup sleep 300 >/dev/null 2>&1 & setsid sleep 300 & echo started")
    assert "started" in obs
    assert workspace_processes(env) == []  # nothing of the workspace runs between its commands
    assert "alive" in bash(env, "echo alive")  # and the workspace still works
    assert_unraised_and_alive(env)


def test_no_network_not_even_loopback_ports_of_this_machine(env):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    try:
        obs = bash(env, f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>&1 && echo CONNECTED; "
                        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\" 2>&1 | tail -1")
        time.sleep(0.3)
        assert "CONNECTED" not in obs and accepted == []
    finally:
        listener.close()
    assert_unraised_and_alive(env)


def test_huge_outputs_are_capped(env):
    obs = bash(env, "yes rollart | head -c 50000000")
    assert len(obs) <= env.max_output_chars + 200 and "[truncated" in obs
    obs = bash(env, "head -c 300000000 /dev/zero > /tmp/big; echo $?")  # the disk cap holds
    assert len(obs) < 2000
    assert_unraised_and_alive(env)


def test_a_trajectory_cannot_read_another_ones_workspace(env):
    other = SweEnv(difficulty=1)
    other.reset(seed=4)
    try:
        secret = other.task.files[other.task.bug.path]
        target = other._workspace.root / other.task.bug.path
        obs = bash(env, f"cat {target} 2>&1; ls {other._workspace.root.parent} 2>&1; find / -name '{other.task.bug.path.split('/')[-1]}' 2>/dev/null")
        assert secret not in obs
        refused = env.step(call_text("read_file", path=str(target)))[0]
        assert refused.startswith("read_file refused") and secret not in refused
    finally:
        other.close()


def test_the_openai_agent_example_repairs_through_the_gateway_and_a_bad_call_is_a_penalty():
    """examples/swe/swe_agent.py, the real `openai` client and gateway, a scripted model: the expert's
    tool calls score 1; a reply without a tool call is a penalised turn, then the agent goes on."""
    import asyncio
    import json
    import sys
    from pathlib import Path

    from rollart.config import DomainConfig
    from rollart.envs.agents.gateway import AgentGateway
    from rollart.envs.agents.manager import AgentManager
    from rollart.envs.chat import ChatTokens
    from rollart.envs.domains.swe.expert import expert_patch
    from rollart.envs.domains.swe.generator import generate
    from rollart.envs.seeds import episode_seed
    from rollart.models.tiny import build_tokenizer
    from rollart.types import SamplingParams, Status, Task
    from envs_fakes import ScriptedLLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "swe"))
    import swe_agent

    chat = ChatTokens(build_tokenizer(tool_calls=True))
    task = Task("g0/0", "swe_agent", "", 5, "g0")
    repair = generate(episode_seed(task), 0)

    def tool_call(name, **arguments):
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"

    replies = ["I think it is fine.", tool_call("apply_patch", patch=expert_patch(repair)), tool_call("submit")]
    llm = ScriptedLLM(chat.tokenizer, replies)
    gateway = AgentGateway(llm, chat).start()
    domain = DomainConfig(agent="swe_agent:run", max_turns=4, max_total_tokens=4096,
                          options={"difficulty": 0, "max_calls": 4})
    runner = AgentManager(task, 0, agent=swe_agent.run, domain_cfg=domain, gateway=gateway,
                         sampling=SamplingParams(max_new_tokens=512, stop_token_ids=chat.stop_token_ids))
    try:
        traj = asyncio.run(asyncio.wait_for(runner.run(), 60))
    finally:
        gateway.stop()
    assert traj.status is Status.COMPLETED and len(traj.turns) == 3
    assert traj.env_return == pytest.approx(1.0 + swe_agent.FORMAT_PENALTY)
    assert traj.metrics["agent/solved"] == 1.0 and traj.metrics["agent/malformed"] == 1.0


def test_a_reset_after_its_preload_is_the_same_reset_and_a_preload_of_another_seed_is_undone():
    fresh, staged, other = SweEnv(difficulty=1), SweEnv(difficulty=1), SweEnv(difficulty=1)
    try:
        staged.preload(4)  # what the warm pool does for a forecast group: the task's package, ahead
        other.preload(5)
        root = staged._workspace.root
        expected = fresh.reset(4)
        assert staged.reset(4) == expected and staged._workspace.root == root  # the staged workspace, untouched
        assert other.reset(4) == expected
        assert staged.package_files() == fresh.package_files() == other.package_files()
        staged.step(call_text("write_file", path="notes.txt", content="left by episode one"))
        staged.reset(4)  # a second episode on the same env starts from a fresh workspace
        assert "notes.txt" not in bash(staged, "ls") and staged._workspace.root != root
    finally:
        for env in (fresh, staged, other):
            env.close()
