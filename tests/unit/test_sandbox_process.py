"""The code sandbox stops an infinite loop, a memory bomb, a fork bomb and an output bomb, confines reads and
writes to its own private root, has no network, says which isolation it had — and refuses to run (never as
root) when the isolation the config asks for cannot be had. (Limits of the whole process tree:
test_sandbox_tree_limits.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import threading
import uuid
from pathlib import Path

import psutil
import pytest

import rollart
from rollart.config import SandboxConfig
from rollart.sandbox import isolation
from rollart.sandbox.isolation import STAGING_PREFIX, SandboxUnavailable, probe_isolation
from rollart.sandbox.process import run_sandboxed
from tests.unit.sandbox_util import host_processes, killed_by_limit

CFG = SandboxConfig(cpu_time_s=1.0, memory_mb=128, wall_timeout_s=4.0, max_processes=8)


def run(code: str, cfg: SandboxConfig = CFG, env: dict | None = None):
    return run_sandboxed({"main.py": code}, ["python", "main.py"], cfg, env=env)



def test_full_isolation_is_had_and_reported():
    res = run("import os\nprint('ok', os.getuid(), os.geteuid())")
    assert res.exit_code == 0, res.stderr
    word, uid, euid = res.stdout.split()
    assert word == "ok" and int(uid) != 0 and int(euid) != 0  # never root
    iso = probe_isolation()
    assert iso.level("deny") == "full", f"this machine must give the sandbox full isolation: {iso.missing}"
    assert res.isolation == ("process+rlimits+" + ("uid" if iso.root else "user")
                             + "+landlock+netns+pidns+mntns+tmpfs+cgroup")


def test_infinite_loop_is_stopped():
    res = run("while True:\n    pass\n")
    assert killed_by_limit(res) and res.exit_code is None
    assert res.wall_s < CFG.wall_timeout_s + 3


def test_memory_bomb_is_stopped():
    res = run("chunks = []\nwhile True:\n    chunks.append(bytearray(10 * 2**20))\n")
    assert res.exit_code != 0
    assert "MemoryError" in res.stderr or killed_by_limit(res)


def test_fork_bomb_is_stopped_and_leaves_no_process():
    marker = f"ROLLART_SBX_{secrets.token_hex(6)}"
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    res = run(code, env={"SBX_MARKER": marker})
    assert killed_by_limit(res) or res.exit_code != 0
    assert res.wall_s < CFG.wall_timeout_s + 5
    assert host_processes(marker) == []


def test_writes_stay_inside_the_sandbox(tmp_path):
    """Nothing the program writes reaches the host: not its /tmp (the sandbox has its own), not the project
    dir, not /dev/shm."""
    name = f"rollart-escape-{uuid.uuid4().hex}"
    targets = [Path.cwd() / name, Path("/dev/shm") / name, Path("/") / name]
    code = "import sys\nok = 0\nfor p in sys.argv[1:] or %r:\n" % [str(t) for t in targets] + (
        "    try:\n        open(p, 'w').write('x')\n        print('WROTE', p)\n    except OSError as e:\n"
        "        print('DENIED', p)\nopen('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
    )
    res = run(code)
    assert res.exit_code == 0, res.stderr
    assert "WROTE" not in res.stdout and res.stdout.count("DENIED") == 3 and "fine" in res.stdout
    private_tmp = run(f"open('/tmp/{name}', 'w').write('x')\nprint(open('/tmp/{name}').read())")
    assert private_tmp.stdout == "x\n", private_tmp.stderr
    assert not any(t.exists() for t in targets + [Path("/tmp") / name])


def test_no_network_when_denied():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('CONNECTED')\n"
        "except OSError as e:\n    print('NO-NET', type(e).__name__)\n"
    )
    try:
        res = run(code)
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached the host's loopback
    finally:
        listener.close()
    assert "NO-NET" in res.stdout, (res.stdout, res.stderr)
    assert "netns" in res.isolation or "landlock-net" in res.isolation


def _staging_dirs() -> set[Path]:
    from rollart.sandbox.cgroups import owner_tag

    return set(Path("/tmp").glob(f"{STAGING_PREFIX}{owner_tag()}-*"))


def test_working_dir_is_removed_afterwards():
    before = _staging_dirs()
    res = run("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())")
    assert res.exit_code == 0 and res.stdout == "/workspace\n", res.stderr
    assert _staging_dirs() == before


def test_file_names_cannot_escape():
    with pytest.raises(ValueError, match="outside the working dir"):
        run_sandboxed({"../evil.py": "x"}, ["python", "evil.py"], CFG)


def test_reads_are_confined_to_the_interpreter_and_the_working_dir():
    project_file = Path(rollart.__file__)
    targets = ["/etc/passwd", "/etc/shadow", str(project_file), str(project_file.parent), "/proc/1/cmdline",
               f"/proc/{os.getpid()}/cmdline", "/proc/self/status", "/root", "/home", str(Path.cwd()), "/"]
    code = (
        "import os, sys\n"
        f"for p in {targets!r}:\n"
        "    try:\n"
        "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1)\n"
        "        print('READ', p)\n"
        "    except OSError:\n"
        "        print('DENIED', p)\n"
        "print('OWN', open('main.py').read(6), len(os.listdir('.')))\n"
        "import json, collections, fractions  # the standard library stays readable\n"
    )
    res = run(code)
    assert res.exit_code == 0, res.stderr
    assert "READ" not in res.stdout and res.stdout.count("DENIED") == len(targets), res.stdout
    assert "OWN import 1" in res.stdout


def _peak_rss_growth(fn) -> tuple[object, float]:
    """fn()'s result and how much this process's RSS grew above its start while fn ran (MB, sampled)."""
    proc = psutil.Process()
    base = peak = proc.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            done.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return result, (peak - base) / 2**20


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_bomb_is_capped_and_the_parent_stays_small(stream):
    cfg = SandboxConfig(max_output_kb=1024, wall_timeout_s=20, cpu_time_s=20)
    code = f"import sys\nchunk = 'x' * 2**20\nfor _ in range(3 * 1024):  # 3 GiB\n    sys.{stream}.write(chunk)\n"
    res, growth = _peak_rss_growth(lambda: run(code, cfg))
    assert res.output_capped and killed_by_limit(res) and not res.timed_out
    assert len(getattr(res, stream)) == 1024 * 1024
    assert growth < 50, f"the scoring process grew {growth:.0f} MB"
    assert res.wall_s < 10


def test_wall_limit_holds_whatever_the_program_prints():
    cfg = SandboxConfig(wall_timeout_s=2.0, cpu_time_s=30, max_output_kb=64)
    res = run("import time\nwhile True:\n    print('still here', flush=True)\n    time.sleep(0.01)\n", cfg)
    assert res.timed_out and not res.output_capped and "still here" in res.stdout
    assert res.wall_s < cfg.wall_timeout_s + 2


@pytest.fixture
def machine_without(monkeypatch):
    """Make the sandbox believe this machine lacks some mechanisms (the probe's answer, nothing else)."""

    def lacking(*, landlock: bool = True, namespaces: bool = True, cgroups: bool = True) -> None:
        real = probe_isolation()
        fake = dataclasses.replace(
            real,
            namespaces=real.namespaces and namespaces, netns=real.netns and namespaces,
            landlock_abi=real.landlock_abi if landlock else 0,
            cgroups=real.cgroups if cgroups else 0,
            missing=(() if namespaces else ("no namespaces (test)",)) + (() if landlock else ("no landlock (test)",))
            + (() if cgroups else ("no cgroups (test)",)),
        )
        monkeypatch.setattr(isolation, "probe_isolation", lambda: fake)

    return lacking


def test_refuses_without_cgroups_unless_namespaces_are_accepted(machine_without):
    machine_without(cgroups=False)
    with pytest.raises(SandboxUnavailable,
                       match=r"level 'full' \(reward.sandbox.min_isolation\).*only 'namespaces': no cgroups"):
        run("print('ran')")
    res = run("print('ran')", CFG.model_copy(update={"min_isolation": "namespaces"}))
    assert res.stdout == "ran\n" and res.isolation.endswith("+pidns+mntns+tmpfs") and res.cpu_s is None


def test_refuses_without_namespaces_unless_landlock_is_accepted(machine_without):
    machine_without(namespaces=False)
    for level in ("full", "namespaces"):
        with pytest.raises(SandboxUnavailable,
                           match=rf"level '{level}' \(reward.sandbox.min_isolation\).*only 'landlock': no namespaces"):
            run("print('ran')", CFG.model_copy(update={"min_isolation": level}))
    res = run("print('ran')", CFG.model_copy(update={"min_isolation": "landlock"}))
    assert res.stdout == "ran\n" and "landlock" in res.isolation and "pidns" not in res.isolation


def test_refuses_without_landlock_unless_rlimits_are_accepted(machine_without):
    machine_without(landlock=False)
    for level in ("full", "namespaces", "landlock"):
        with pytest.raises(SandboxUnavailable, match=f"needs isolation level '{level}'.*no landlock"):
            run("print('ran')", CFG.model_copy(update={"min_isolation": level}))
    res = run("print('ran')", CFG.model_copy(update={"min_isolation": "rlimits"}))
    assert res.stdout == "ran\n" and "landlock" not in res.isolation


def test_never_runs_as_root(tmp_path):
    """As root, an interpreter the sandbox uid cannot reach is refused at every level — the program never
    falls back to running as root. (As another user, programs run as that user: asserted too.)"""
    if os.geteuid() != 0:
        res = run("import os\nprint(os.geteuid())")
        assert int(res.stdout) == os.geteuid() != 0
        return
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    marker = tmp_path / "ran-as-root"
    python = private / "python3"
    python.write_text(f"#!/bin/sh\ntouch {marker}\n")
    python.chmod(0o755)
    cfg = CFG.model_copy(update={"python": str(python), "min_isolation": "rlimits"})
    with pytest.raises(SandboxUnavailable, match="never runs a program as root.*reward.sandbox.python"):
        run("print('ran')", cfg)
    assert not marker.exists()


def test_code_rewards_refuse_before_anything_starts(machine_without):
    """A run whose code domain cannot have its isolation fails when the router is built, naming the setting;
    the service answers 501 (not retried) instead of scoring."""
    import asyncio

    from rollart.config import DomainConfig, RunConfig
    from rollart.reward import RewardRouter
    from rollart.reward.handler import RewardHandler
    from rollart.reward.claims import SharedClaimBook
    from rollart.reward.protocol import to_payload
    from rollart.types import Task, Trajectory, Turn

    machine_without(landlock=False)
    cfg = RunConfig(domains={"code": DomainConfig(env="code", reward="code")})
    with pytest.raises(SandboxUnavailable, match="reward.sandbox.min_isolation=rlimits"):
        RewardRouter(cfg)
    traj = Trajectory("c/0", Task("c/0", "code", "code", 0, "g"), 0, (Turn((), (), (), (), action="def f(): pass"),),
                      reference={"tests": ["assert f() is None"]})
    handler = RewardHandler(cfg, SharedClaimBook(10**6, 60, 30), token=None, replica="r")

    async def body():
        yield json.dumps(to_payload(traj, "code")).encode()

    status, answer = asyncio.run(handler.handle({}, body()))
    assert (status, answer["code"]) == (501, "reward_unavailable") and "min_isolation" in answer["error"]
