"""The workspace sandbox (issue 25): each trajectory's own tree and processes, created at open and destroyed at
close — normal, cancelled, timed out, or the worker killed — and every class of malice a policy's commands
can try: symlinks out, other processes' /proc, fork bombs, background processes, the network (127.0.0.1
services included), huge outputs, another workspace's files. These tests ran the native backend (no
Docker or Podman engine on the build machines)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollart.config import WorkspaceConfig
from rollart.sandbox import cgroups, isolation
from rollart.sandbox.workspace import BASE, WorkspaceClosed, open_workspace, reap_leftovers
from tests.unit.sandbox_util import groups_of, host_processes, mounted

ROOT = Path(__file__).resolve().parents[2]
LIMITS = WorkspaceConfig(cpu_time_s=5, wall_timeout_s=10, memory_mb=256, max_processes=32, disk_mb=32,
                         max_output_kb=64)





def running(word: str) -> list[int]:
    return host_processes(word, "cmdline")


def assert_gone(ws, word: str | None = None) -> None:
    assert not ws.directory.exists() and not mounted(ws.directory)
    assert groups_of(os.getpid()) == []
    if word:
        assert running(word) == []


@pytest.fixture(autouse=True)
def _full_isolation():
    assert isolation.probe_isolation().level("deny") == "full", isolation.probe_isolation().missing


def test_lifecycle_normal():
    ws = open_workspace(LIMITS, {"pkg/mod.py": "X = 41\n", "README": "hi"})
    assert ws.isolation == "process+rlimits+uid+landlock+netns+pidns+mntns+tmpfs+cgroup"
    assert mounted(ws.directory) and groups_of(os.getpid())
    res = ws.run("cd pkg && python3 -c 'import mod; print(mod.X + 1)' && pwd && id -u", timeout_s=10)
    assert res.exit_code == 0 and res.stdout.splitlines()[:2] == ["42", "/workspace/pkg"], res
    assert int(res.stdout.splitlines()[2]) != 0  # never root
    assert ws.run("cat", stdin="piped").stdout == "piped"
    assert ws.run("exit 7").exit_code == 7
    ws.write_file("/workspace/new/dir/f.txt", "written")
    assert ws.run("cat new/dir/f.txt").stdout == "written"
    ws.run("echo from-command > out.txt")
    assert ws.read_file("out.txt", 100) == "from-command\n"
    assert ws.snapshot(10_000) == {"pkg/mod.py": "X = 41\n", "README": "hi", "new/dir/f.txt": "written",
                                   "out.txt": "from-command\n"}
    ws.close()
    ws.close()  # idempotent
    assert_gone(ws)
    with pytest.raises(WorkspaceClosed):
        ws.run("true")


def test_lifecycle_cancelled():
    """A trajectory cancelled while a command runs: close() kills it at once, and nothing is left."""
    word = f"{secrets.randbelow(10**6) + 10**6}"
    ws = open_workspace(LIMITS, {})

    async def trajectory():
        await asyncio.to_thread(ws.run, f"sleep {word}", timeout_s=60)

    async def main():
        task = asyncio.create_task(trajectory())
        deadline = time.monotonic() + 20
        while not running(f"sleep {word}"):
            assert time.monotonic() < deadline, "the command never started"
            await asyncio.sleep(0.02)
        task.cancel()
        t0 = time.monotonic()
        await asyncio.to_thread(ws.close)  # the env's close, on cancellation
        return time.monotonic() - t0

    close_s = asyncio.run(main())
    assert close_s < 5, f"close took {close_s:.1f}s"
    assert_gone(ws, f"sleep {word}")


def test_lifecycle_timed_out():
    word = f"{secrets.randbelow(10**6) + 10**6}"
    with open_workspace(LIMITS, {}) as ws:
        res = ws.run(f"echo started; sleep {word}", timeout_s=1)
        assert res.timed_out and res.exit_code is None and res.stdout == "started\n", res
        assert running(f"sleep {word}") == []
        assert ws.run("echo still usable").stdout == "still usable\n"
    assert_gone(ws)


def test_lifecycle_worker_killed():
    """An env worker killed with SIGKILL mid-command: its commands die with it, and reap_leftovers (what the
    next worker calls at start) removes its tmpfs, cgroup and directory."""
    owner = f"test-{secrets.token_hex(4)}"
    word = f"{secrets.randbelow(10**6) + 10**6}"
    script = (
        "import sys\n"
        "from rollart.config import WorkspaceConfig\n"
        "from rollart.sandbox.workspace import open_workspace\n"
        f"ws = open_workspace(WorkspaceConfig(), {{'a.txt': 'x'}}, owner={owner!r})\n"
        "print(ws.directory, flush=True)\n"
        f"ws.run('sleep {word}', timeout_s=120)\n"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    try:
        directory = Path(worker.stdout.readline().strip())
        deadline = time.monotonic() + 30
        while not running(f"sleep {word}"):
            assert worker.poll() is None and time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker.stdout.close()
    deadline = time.monotonic() + 10
    while running(f"sleep {word}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(f"sleep {word}") == [], "a command outlived its worker"
    assert directory.exists() and mounted(directory) and groups_of(worker.pid)  # what only a reap removes
    assert reap_leftovers(owner) == 1
    assert not directory.exists() and not mounted(directory) and groups_of(worker.pid) == []
    assert not (BASE / owner).exists()


def test_symlinks_and_paths_out_of_the_workspace_are_refused():
    secret = Path("/tmp") / f"rollart-host-secret-{secrets.token_hex(4)}"
    secret.write_text("host secret")
    try:
        with open_workspace(LIMITS, {"a.txt": "inside"}) as ws:
            res = ws.run(f"ln -s {secret} out; ln -s / root; ln -s a.txt in; mkdir d; ln -s /etc d/etc; mkfifo fifo; "
                         f"cat out; cat root{secret}")
            assert "host secret" not in res.stdout  # inside, the host's paths are not there at all
            for path in ("out", "root/etc/passwd", f"root{secret}", "in", "d/etc/passwd", "../a.txt",
                         "/etc/passwd", str(ws.root / "a.txt"), "fifo"):
                with pytest.raises(ValueError):
                    ws.read_file(path, 100)
            for path in ("out", "root/tmp/x", "d/etc/x", "../x", "/tmp/x", "fifo"):
                with pytest.raises(ValueError):
                    ws.write_file(path, "overwritten")
            assert secret.read_text() == "host secret" and not Path("/tmp/x").exists()
            assert ws.read_file("a.txt", 100) == "inside"
    finally:
        secret.unlink()


def test_other_processes_proc_is_not_visible():
    with open_workspace(LIMITS, {}) as ws:
        res = ws.run(f"ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '; echo; "
                     f"cat /proc/{os.getpid()}/cmdline || echo NO-SUCH; cat /proc/1/environ || echo DENIED")
        pids = [int(p) for p in res.stdout.splitlines()[0].split()]
        assert pids and max(pids) < 100 and os.getpid() not in pids, res.stdout  # only its own few processes
        assert "NO-SUCH" in res.stdout and "DENIED" in res.stdout, res


def test_a_fork_bomb_is_contained():
    with open_workspace(LIMITS, {}) as ws:
        group = cgroups.TreeGroup(cgroups.support(), groups_of(os.getpid())[0].name)
        t0 = time.monotonic()
        res = ws.run("bomb(){ bomb|bomb& }; bomb; sleep 2; echo the shell lived on", timeout_s=8)
        assert time.monotonic() - t0 < 15
        assert res.limit_hit == "pids" and "lived on" in res.stdout, res
        peak = group._dir("pids") / ("pids.peak")
        if peak.exists():
            assert int(peak.read_text()) <= LIMITS.max_processes
        assert group.pids() == []  # and the bomb died with its command
        assert ws.run("echo after").stdout == "after\n"  # the workspace is fine afterwards


def test_background_processes_never_outlive_their_command_or_the_workspace():
    word = f"{secrets.randbelow(10**6) + 10**6}"
    ws = open_workspace(LIMITS, {})
    res = ws.run(f"nohup sleep {word} >/dev/null 2>&1 & setsid sleep {word}1 >/dev/null 2>&1 < /dev/null & "
                 f"(sleep {word}2 &) ; echo started", timeout_s=10)
    assert res.stdout == "started\n" and res.exit_code == 0
    assert running(f"sleep {word}") == []  # killed when the command ended
    ws.close()
    assert_gone(ws, f"sleep {word}")


def test_no_network_not_even_the_loopback_services():
    """Listeners on 127.0.0.1 stand in for Ray's GCS, the reward service and the agent gateway."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in ("ray", "reward", "gateway")]
    ports = [s.getsockname()[1] for s in listeners]
    try:
        with open_workspace(LIMITS, {}) as ws:
            checks = "; ".join(f"(exec 3<>/dev/tcp/127.0.0.1/{p} && echo REACHED {p}) 2>/dev/null || echo NO {p}"
                               for p in ports)
            res = ws.run(checks + "; python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
                         f"{ports[0]}), timeout=1)\" 2>&1 | tail -1; getent hosts example.com || echo NO-DNS")
            for s in listeners:
                s.settimeout(0.3)
                with pytest.raises(socket.timeout):
                    s.accept()
    finally:
        for s in listeners:
            s.close()
    assert "REACHED" not in res.stdout and res.stdout.count("NO ") == 3, res.stdout
    assert "Error" in res.stdout and "NO-DNS" in res.stdout, res.stdout  # python's connect failed too


def test_huge_outputs_are_capped():
    with open_workspace(LIMITS, {}) as ws:
        t0 = time.monotonic()
        res = ws.run("yes | head -c 1000000000; echo done", timeout_s=30)
        assert time.monotonic() - t0 < 15
        assert res.stdout.endswith("\n[truncated]") and len(res.stdout) <= 64 * 1024 + len("\n[truncated]")
        assert "done" not in res.stdout
        assert ws.run("echo ok").stdout == "ok\n"


def test_one_workspace_cannot_read_another():
    with open_workspace(LIMITS, {"secret.txt": "A's secret"}) as a, open_workspace(LIMITS, {}) as b:
        res = b.run(f"cat {a.root}/secret.txt; cat /proc/*/root/workspace/secret.txt; "
                    "find / -name secret.txt 2>/dev/null; echo END")
        assert "A's secret" not in res.stdout and res.stdout.endswith("END\n"), res
        assert a.run("cat secret.txt").stdout == "A's secret"


def test_the_disk_cap_holds_for_commands_and_writes():
    with open_workspace(LIMITS, {}) as ws:
        res = ws.run("head -c 100M /dev/zero > big; echo $?; head -c 100M /dev/zero > /tmp/big2; echo $?")
        assert res.limit_hit == "disk" and res.stdout.split() == ["1", "1"], res
        with pytest.raises(OSError) as caught:
            ws.write_file("more.txt", "x" * (4 << 20))
        assert caught.value.errno == errno.ENOSPC and "envs.workspace.disk_mb=32" in str(caught.value)
        ws.run("rm -f big /tmp/big2")
        ws.write_file("more.txt", "x" * (4 << 20))  # room again


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="owner"):
        open_workspace(LIMITS, {}, owner="../x")
    with pytest.raises(ValueError, match="leaves the workspace"):
        open_workspace(LIMITS, {"../escape.txt": "x"})
    with open_workspace(LIMITS, {}) as ws:
        with pytest.raises(ValueError, match="not valid text"):
            ws.write_file("a.txt", "\ud800")
        with pytest.raises(ValueError, match="not valid text"):
            ws.run("echo '\ud800'")
        with pytest.raises(ValueError, match="file_size_mb"):
            ws.write_file("a.txt", "x" * (LIMITS.file_size_mb * 2**20 + 1))


def test_the_container_backend_is_refused_where_no_engine_is_installed_and_asks_for_the_limits():
    """No Docker or Podman here: the backend says so instead of running unconfined; its container gets the
    workspace's limits (checked on its arguments — the one part that can be checked without an engine)."""
    from rollart.sandbox.container import container_args

    for backend in ("docker", "podman"):
        if shutil.which(backend):
            continue
        with pytest.raises(isolation.SandboxUnavailable, match=f"envs.workspace.backend={backend}.*no `{backend}`"):
            open_workspace(LIMITS.model_copy(update={"backend": backend}), {})
    args = container_args(LIMITS, "n", "env", "1-2")
    for flag, value in (("--network", "none"), ("--memory", "288m"), ("--memory-swap", "288m"),
                        ("--pids-limit", "32"), ("--user", "65534:65534"), ("--cap-drop", "ALL"),
                        ("--security-opt", "no-new-privileges")):
        assert args[args.index(flag) + 1] == value, flag
    assert "--read-only" in args and "/workspace:rw,exec,size=32m,mode=1777" in args
    assert args[-3:] == [LIMITS.image, "sleep", "infinity"]
