"""Limits hold for the program and all its children together (issue 28's red-team findings, one test each),
host Unix sockets are not reachable, invalid text scores 0 with a reason — and nothing a run makes outlives
it: no process, cgroup, mount or staging dir, even when the program misbehaves or rollart is killed."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollart.config import DomainConfig, RunConfig, SandboxConfig
from rollart.reward.code_reward import CodeReward
from rollart.reward.handler import RewardHandler
from rollart.reward.claims import SharedClaimBook
from rollart.reward.protocol import to_payload
from rollart.sandbox import cgroups, isolation
from rollart.sandbox.process import run_sandboxed
from tests.unit.sandbox_util import groups_of, host_processes, killed_by_limit
from rollart.types import Task, Trajectory, Turn

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, cfg: SandboxConfig, env: dict | None = None):
    return run_sandboxed({"main.py": code}, ["python", "main.py"], cfg, env=env)




def staging_of(pid: int) -> list[Path]:
    return list(Path("/tmp").glob(f"{isolation.STAGING_PREFIX}{pid}-*"))


@pytest.fixture(autouse=True)
def _full_isolation():
    assert isolation.probe_isolation().level("deny") == "full", isolation.probe_isolation().missing


def test_six_children_holding_180_mb_each_are_killed_at_the_tree_memory_limit():
    cfg = SandboxConfig(memory_mb=256, max_processes=16, wall_timeout_s=30, cpu_time_s=20)
    code = (
        "import os, time\n"
        "kids = []\n"
        "for i in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        held = b'x' * (180 * 2**20)  # filled: every page is touched\n"
        "        print('held', i, flush=True)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "for pid in kids:\n"
        "    os.waitpid(pid, 0)\n"
    )
    res = run(code, cfg)
    assert res.limit_hit == "memory" and killed_by_limit(res) and not res.timed_out, res
    # 2 × 180 MB is past the tree's 256 + 64 MB: never more than one child held its memory at once
    assert res.stdout.count("held") <= 1, res.stdout


def test_eight_spinning_children_are_killed_at_the_tree_cpu_limit():
    cfg = SandboxConfig(cpu_time_s=1.0, max_processes=16, wall_timeout_s=30)
    code = "import os\nfor i in range(8):\n    if os.fork() == 0:\n        while True:\n            pass\nos.wait()\n"
    res = run(code, cfg)
    assert res.limit_hit == "cpu" and killed_by_limit(res) and not res.timed_out, res
    assert res.cpu_s is not None and 1.0 < res.cpu_s < 2.0, res.cpu_s  # the tree's, not 8 × 1 s


def test_forty_files_of_15_mb_are_refused_at_the_disk_cap():
    cfg = SandboxConfig(file_size_mb=16, disk_mb=64, wall_timeout_s=30, cpu_time_s=20)
    code = (
        "import errno\n"
        "n = 0\n"
        "for i in range(40):\n"
        "    path = f'/tmp/f{i}' if i % 2 else f'f{i}'  # /workspace and /tmp share the cap\n"
        "    try:\n"
        "        with open(path, 'wb') as f:\n"
        "            f.write(b'x' * (15 * 2**20))\n"
        "        n += 1\n"
        "    except OSError as e:\n"
        "        print('refused after', n, errno.errorcode[e.errno])\n"
        "        break\n"
        "else:\n"
        "    print('wrote', n)\n"
    )
    res = run(code, cfg)
    assert res.exit_code == 0, res.stderr
    words = res.stdout.split()
    assert words[:2] == ["refused", "after"] and int(words[2]) <= 4 and words[3] == "ENOSPC", res.stdout
    assert res.limit_hit == "disk"


def _code_trajectory(program: str, tests: list[str], action_text: str | None = None) -> Trajectory:
    action = action_text if action_text is not None else f"```python\n{program}\n```"
    return Trajectory("c/0", Task("c/0", "code", "code", 0, "g"), 0, (Turn((), (), (), (), action=action),),
                      reference={"tests": tests})


def test_thirty_big_files_before_correct_code_do_not_score():
    filler = "for i in range(30):\n    open(f'f{i}', 'wb').write(b'x' * (15 * 2**20))\n"
    right = "def add(a, b):\n    return a + b\n"
    tests = ["assert add(1, 2) == 3", "assert add(2, 5) == 7"]
    reward = CodeReward(SandboxConfig(wall_timeout_s=30, cpu_time_s=20))
    filled = asyncio.run(reward(_code_trajectory(filler + right, tests)))
    assert filled.reward < 1.0 and filled.details["limit_hit"] == "disk", dict(filled.details)
    assert "disk" in filled.details["error"]
    assert asyncio.run(reward(_code_trajectory(right, tests))).reward == 1.0


def test_a_world_writable_host_unix_socket_is_unreachable():
    path = Path("/tmp") / f"rollart-sock-{secrets.token_hex(6)}.sock"
    abstract = f"\0rollart-abstract-{secrets.token_hex(6)}"
    servers = []
    for address in (str(path), abstract):
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(address)
        srv.listen()
        srv.settimeout(0.5)
        servers.append(srv)
    path.chmod(0o777)
    code = (
        "import socket\n"
        f"for address in ({str(path)!r}, {abstract!r}):\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    try:\n"
        "        s.connect(address)\n"
        "        s.sendall(b'escaped')\n"
        "        print('CONNECTED')\n"
        "    except OSError as e:\n"
        "        print('UNREACHABLE', type(e).__name__)\n"
    )
    try:
        res = run(code, SandboxConfig())
        for srv in servers:
            with pytest.raises(socket.timeout):
                srv.accept()  # the host side received nothing
    finally:
        for srv in servers:
            srv.close()
        path.unlink()
    assert res.stdout.count("UNREACHABLE") == 2 and "CONNECTED" not in res.stdout, (res.stdout, res.stderr)


def test_a_lone_surrogate_scores_zero_with_a_reason_and_is_a_422_through_the_service():
    program = "def f():\n    return '\ud800'\n"
    out = asyncio.run(CodeReward(SandboxConfig())(_code_trajectory(program, ["assert f() == 1"])))
    assert out.reward == 0.0 and "not valid text" in out.details["error"] and "surrogate" in out.details["error"]
    with pytest.raises(ValueError, match="sandbox file 'solution.py' is not valid text"):
        run_sandboxed({"solution.py": program}, ["python", "solution.py"], SandboxConfig())

    cfg = RunConfig(domains={"code": DomainConfig(env="code", reward="code")})
    handler = RewardHandler(cfg, SharedClaimBook(10**6, 60, 30), token=None, replica="r")
    traj = _code_trajectory(program, ["assert f() == 1"])

    async def body():
        yield json.dumps(to_payload(traj, "code")).encode()  # JSON carries it as the escape \ud800

    status, answer = asyncio.run(handler.handle({}, body()))
    assert status == 422 and answer["field"] == "turns[0].action" and "not valid text" in answer["error"], answer


def test_a_fork_bomb_is_held_at_the_tree_process_limit():
    cfg = SandboxConfig(max_processes=8, wall_timeout_s=10)
    code = ("import os, time\nn = 0\nfor _ in range(40):\n    try:\n        if os.fork() == 0:\n"
            "            time.sleep(30)\n            os._exit(0)\n        n += 1\n    except OSError:\n        break\n"
            "print('forked', n)\n")
    res = run(code, cfg)
    assert res.limit_hit == "pids" and res.stdout.split() == ["forked", "7"], res  # itself + 7 children


def test_a_misbehaving_program_leaves_nothing_behind():
    """Daemons (setsid, double fork), a fork bomb and a hang: at the end no process, cgroup, mount or
    staging dir of the run is left."""
    marker = f"ROLLART_SBX_{secrets.token_hex(6)}"
    mounts_before = Path("/proc/self/mountinfo").read_text()
    code = (
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(120)\n"
        "        os._exit(0)\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    res = run(code, SandboxConfig(wall_timeout_s=2, max_processes=32), env={"SBX_MARKER": marker})
    assert res.timed_out or killed_by_limit(res)
    assert host_processes(marker) == []
    assert groups_of(os.getpid()) == [] and staging_of(os.getpid()) == []
    assert Path("/proc/self/mountinfo").read_text() == mounts_before


def test_a_killed_parent_takes_its_sandboxes_along_and_leftovers_are_reaped():
    marker = f"ROLLART_SBX_{secrets.token_hex(6)}"
    script = (
        "import os\n"
        "from rollart.config import SandboxConfig\n"
        "from rollart.sandbox import run_sandboxed\n"
        f"run_sandboxed({{'main.py': 'import time\\nprint(1, flush=True)\\ntime.sleep(120)'}}, ['python', 'main.py'],"
        f" SandboxConfig(wall_timeout_s=120), env={{'SBX_MARKER': {marker!r}}})\n"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not host_processes(marker):
            assert parent.poll() is None and time.monotonic() < deadline, "the sandbox never started"
            time.sleep(0.05)
        assert groups_of(parent.pid), "the run's cgroup should exist while it runs"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while host_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes(marker) == [], "the sandbox outlived the process that started it"
    # what a SIGKILLed process could not remove, the next process reaps before its first sandbox
    assert cgroups.reap() >= 1 and isolation.reap_staging() >= 1
    assert groups_of(parent.pid) == [] and staging_of(parent.pid) == []
