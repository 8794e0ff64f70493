"""The env server (`rollart env serve`) and the `remote` env kind: tokens per trajectory, bounded bodies,
limits, idle sessions closed, every error a JSON answer; a server that dies mid-trajectory ends that
trajectory FAILED naming the server, and new resets go to a server that answers."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from rollart.config import DomainConfig, EnvServerConfig, EnvsConfig
from rollart.envs import ChatTokens, EnvManager, make_env, resolve_env
from rollart.envs.adapters.remote import RemoteEnvError
from rollart.envs.serving.server import EnvServer
from rollart.models import load_tokenizer
from rollart.types import SamplingParams, Status, Task
from envs_fakes import ScriptedLLM

TOKEN = "server-test-token"


class Closing:
    """A built-in-like env that counts closes and can be told to fail."""

    closed = 0

    def reset(self, seed=None):
        if seed == 13:
            raise ValueError("seed 13 is unlucky")
        return f"seed {seed}", {"reference": {"answer": str(seed)}, "odd": {1, 2}}

    def step(self, action):
        if action == "slow":
            time.sleep(1.0)
        return f"got {action}", 0.5, action == "stop", False, {}

    def expert_action(self):
        return "stop"

    def close(self):
        Closing.closed += 1


@pytest.fixture(autouse=True)
def token(monkeypatch):
    monkeypatch.setenv("ROLLART_ENV_TOKEN", TOKEN)
    Closing.closed = 0


def serve(factory=Closing, **cfg):
    cfg = EnvServerConfig(port=0, **cfg)
    return EnvServer("d", "custom", factory, cfg, EnvsConfig(step_timeout_s=0.5), token=TOKEN).start()


def call(server, method, path, token=TOKEN, **kwargs):
    return httpx.request(method, server.url + path, headers={"authorization": f"Bearer {token}"}, timeout=10, **kwargs)


def test_sessions_are_each_their_own_and_errors_are_json():
    server = serve(max_sessions=2, max_body_kb=1)
    try:
        a = call(server, "POST", "/v1/reset", json={"seed": 1}).json()
        b = call(server, "POST", "/v1/reset", json={"seed": 2}).json()
        assert a["observation"] == "seed 1" and a["info"]["reference"] == {"answer": "1"}
        assert a["info"]["odd"] == "{1, 2}"  # what is not JSON arrives as its text
        # one trajectory's token opens no other session; the server token opens none either
        assert call(server, "POST", f"/v1/sessions/{b['session']}/step", a["token"], json={"action": "x"}).status_code == 401
        assert call(server, "POST", f"/v1/sessions/{a['session']}/step", TOKEN, json={"action": "x"}).status_code == 401
        step = call(server, "POST", f"/v1/sessions/{a['session']}/step", a["token"], json={"action": "x"})
        assert step.json() == {"observation": "got x", "reward": 0.5, "terminated": False, "truncated": False, "info": {}}
        assert call(server, "POST", "/v1/reset", "wrong", json={"seed": 3}).status_code == 401
        full = call(server, "POST", "/v1/reset", json={"seed": 3})
        assert full.status_code == 429 and full.json()["error"]["code"] == "too_many_sessions"
        big = call(server, "POST", f"/v1/sessions/{a['session']}/step", a["token"], content=b"x" * 2048)
        assert big.status_code == 413 and "envs.server.max_body_kb" in big.json()["error"]["message"]
        for body, code in ((b"{", "invalid_json"), (b'{"action": 3}', "invalid_field"), (b"[]", "invalid_field")):
            bad = call(server, "POST", f"/v1/sessions/{a['session']}/step", a["token"], content=body)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == code
        assert call(server, "POST", "/v1/reset", json={"seed": True}).status_code == 400
        slow = call(server, "POST", f"/v1/sessions/{a['session']}/step", a["token"], json={"action": "slow"})
        assert slow.status_code == 504 and "timed out after 0.5s" in slow.json()["error"]["message"]
        assert call(server, "DELETE", f"/v1/sessions/{a['session']}", a["token"]).json() == {"closed": True}
        assert call(server, "DELETE", f"/v1/sessions/{a['session']}", a["token"]).status_code == 404
        failed = call(server, "POST", "/v1/reset", json={"seed": 13})
        assert failed.status_code == 502 and failed.json()["error"]["message"] == "ValueError: seed 13 is unlucky"
        assert httpx.get(server.url + "/v1/health").json() == {"domain": "d", "env": "custom", "sessions": 1,
                                                               "max_sessions": 2}
    finally:
        server.stop()
    assert Closing.closed == 3  # a, the failed reset's env, and b (closed by stop)


def test_idle_sessions_are_closed():
    server = serve(idle_timeout_s=0.2)
    try:
        call(server, "POST", "/v1/reset", json={"seed": 1})
        deadline = time.monotonic() + 10
        while (server.sessions or not Closing.closed) and time.monotonic() < deadline:  # the reaper closes
            time.sleep(0.05)                                                              # after it drops the session
        assert server.sessions == 0 and Closing.closed == 1
    finally:
        server.stop()


def test_remote_env_speaks_the_protocol_and_names_a_server_that_is_gone():
    server = serve()
    url = server.url
    env = make_env(f"remote:{url}")
    assert env.reset(seed=5) == ("seed 5", {"reference": {"answer": "5"}, "odd": "{1, 2}"})
    assert env.expert_action() == "stop" and env.step("stop")[2] is True
    with pytest.raises(RemoteEnvError, match="seed 13 is unlucky"):
        env.reset(seed=13)
    env.reset(seed=6)
    server.stop()
    with pytest.raises(RemoteEnvError, match=r"env server http://127\.0\.0\.1:\d+ did not answer .*did it die\?"):
        env.step("x")
    env.close()  # a dead server's session died with it: no error
    with pytest.raises(ValueError, match="set \\$NOPE"):
        make_env(f"remote:{url}", {"token_env": "NOPE"})
    with pytest.raises(ValueError, match="remote:http://HOST:PORT"):
        make_env("remote:ftp://x")


def test_a_server_that_dies_mid_trajectory_fails_it_and_new_resets_go_to_one_alive(tiny_model_path):
    chat = ChatTokens(load_tokenizer(tiny_model_path))
    first, second = serve(), serve()
    factory = resolve_env(f"remote:{first.url}", {"urls": [second.url]})

    def manager(tid, actions):
        task = Task(trajectory_id=tid, domain="d", env="remote", seed=1, group_id="g")
        return EnvManager(task, 0, make_env=factory, domain_cfg=DomainConfig(env="remote", max_turns=3),
                          envs=EnvsConfig(retry_backoff_s=0.0), llm=ScriptedLLM(chat.tokenizer, actions), chat=chat,
                          sampling=SamplingParams(max_new_tokens=8, stop_token_ids=chat.stop_token_ids))

    async def scenario():
        doomed = manager("doomed", ["go", "go", "stop"])
        doomed.llm.delay_s = 0.3
        run = asyncio.ensure_future(doomed.run())
        await asyncio.sleep(0.2)  # reset done, first generation under way
        victim = first if first.sessions else second
        survivor = second if victim is first else first
        victim.stop()  # the env server dies mid-trajectory
        failed = await run
        later = [await manager(f"later-{i}", ["stop"]).run() for i in range(3)]
        return victim, survivor, failed, later

    try:
        victim, survivor, failed, later = asyncio.run(scenario())
    finally:
        first.stop()
        second.stop()
    assert failed.status is Status.FAILED and f"env server {victim.url} did not answer" in failed.status_reason
    assert all(t.status is Status.COMPLETED for t in later)  # the dead server is skipped; the other serves
    assert survivor.sessions == 0


def test_the_serve_command_serves_a_domain_until_sigterm_and_refuses_a_public_host(tmp_path):
    import re
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    command = [sys.executable, "-m", "rollart.cli", "env", "serve", "math", f"run_dir={tmp_path}"]
    refused = subprocess.run([*command, "--host", "0.0.0.0"], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "envs.server.allow_non_loopback=true" in refused.stderr
    unknown = subprocess.run([*command[:-2], "nope"], env=env, capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "'nope' is not an env domain" in unknown.stderr
    proc = subprocess.Popen([*command, "--port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.1:\d+)", line).group(1)
        assert "generated token" not in line and "Bearer token from $ROLLART_ENV_TOKEN" in proc.stdout.readline()
        opened = httpx.post(url + "/v1/reset", json={"seed": 4}, headers={"authorization": f"Bearer {TOKEN}"})
        assert opened.status_code == 200 and opened.json()["info"]["reference"]["answer"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
