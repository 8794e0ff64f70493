"""What only one workspace backend has. The contract both keep (lifecycle, limits, network, paths, tools) is
tests/contracts/test_workspace_contract.py, which runs the native and the podman backend alike.

Native: the isolation label, the tmpfs mount and cgroup each workspace holds and drops, commands that die with
the process that created the workspace (their launchers watch a pipe only it held), other processes' /proc
entries denied, a fork bomb's peak. Container: the run arguments that carry the limits, the trailer the
supervisor writes after each command (and forgeries of it), the refusal where an engine does not answer, the
image recipe (its mirror read from apt's own sources, its label, the config's default naming it).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollart.config import WorkspaceConfig
from rollart.sandbox import cgroups, image, isolation
from rollart.sandbox.container_engine import container_args
from rollart.sandbox.container_scripts import Counters, limit_hit, split_trailer
from rollart.sandbox.workspace import BASE, open_workspace, reap_leftovers
from tests.unit.sandbox_util import groups_of, host_processes, mounted

ROOT = Path(__file__).resolve().parents[2]
LIMITS = WorkspaceConfig(cpu_time_s=5, wall_timeout_s=10, memory_mb=256, max_processes=32, disk_mb=32,
                         max_output_kb=64)


def running(word: str) -> list[int]:
    return host_processes(word, "cmdline")


@pytest.fixture
def full_isolation():
    assert isolation.probe_isolation().level("deny") == "full", isolation.probe_isolation().missing


def test_native_workspace_holds_a_tmpfs_and_a_cgroup_until_closed(full_isolation):
    ws = open_workspace(LIMITS, {"a.txt": "x"})
    assert ws.isolation == "process+rlimits+uid+landlock+netns+pidns+mntns+tmpfs+cgroup"
    assert mounted(ws.directory) and groups_of(os.getpid())
    ws.close()
    assert not ws.directory.exists() and not mounted(ws.directory) and groups_of(os.getpid()) == []


def test_native_commands_die_with_the_process_that_made_the_workspace(full_isolation):
    """An env worker killed with SIGKILL mid-command: its commands die with it; reap_leftovers removes its
    tmpfs, cgroup and directory."""
    owner = f"test-{secrets.token_hex(4)}"
    word = f"{secrets.randbelow(10**6) + 10**6}"
    script = (
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


def test_native_proc_of_the_sandbox_init_is_denied(full_isolation):
    with open_workspace(LIMITS, {}) as ws:
        res = ws.run("cat /proc/1/environ || echo DENIED")
        assert "DENIED" in res.stdout, res


def test_native_fork_bomb_peak_stays_under_the_pids_limit(full_isolation):
    with open_workspace(LIMITS, {}) as ws:
        group = cgroups.TreeGroup(cgroups.support(), groups_of(os.getpid())[0].name)
        res = ws.run("bomb(){ bomb|bomb& }; bomb; sleep 2; echo the shell lived on", timeout_s=8)
        assert res.limit_hit == "pids"
        peak = group._dir("pids") / ("pids.peak")
        if peak.exists():
            assert int(peak.read_text()) <= LIMITS.max_processes
        assert group.pids() == []  # the bomb died with its command


def test_container_arguments_carry_the_limits():
    args = container_args(LIMITS.model_copy(update={"backend": "podman", "container_runtime": "runc"}), "n", "env",
                          "1-2")
    for flag, value in (("--network", "none"), ("--memory", "288m"), ("--memory-swap", "288m"),
                        ("--pids-limit", "32"), ("--cap-drop", "ALL"), ("--security-opt", "no-new-privileges"),
                        ("--pull", "never"), ("--runtime", "runc"), ("--shm-size", "8m")):
        assert args[args.index(flag) + 1] == value, flag
    assert "--read-only" in args and "--init" in args and "--read-only-tmpfs=false" in args
    assert "/workspace:rw,exec,nosuid,nodev,size=32m,mode=1777" in args
    assert "-v" not in args and "--volume" not in args and "--mount" not in args  # no host path goes in
    assert args[-3:] == [LIMITS.image, "sleep", "infinity"]
    docker = container_args(LIMITS.model_copy(update={"backend": "docker", "network": "allow"}), "n", "env", "1-2")
    assert "--network" not in docker and "--read-only-tmpfs=false" not in docker and "--runtime" not in docker


def test_the_trailer_is_the_supervisors_last_one():
    mark = "@@rollart-0123456789abcdef@@"
    counters = "== memory/memory.oom_control\noom_kill 2\n== pids/pids.events\nmax 5\n== cpuacct/cpuacct.usage\n" \
               "3000000000\n== df\nFilesystem 1024-blocks Used Available Capacity Mounted on\n" \
               "tmpfs 32768 32700 68 100% /workspace\ntmpfs 8192 0 8192 0% /tmp\n"
    forged = f"\n{mark} 0\n== pids/pids.events\nmax 0\n"  # what a command could print (it knows the mark)
    stderr = f"real error\n{forged}".encode() + f"\n{mark} 3\n{counters}".encode()
    head, status, after = split_trailer(stderr, mark)
    assert head == f"real error\n{forged}".encode() and status == 3
    assert after == Counters(2, 5, 3.0, (68, 8192))
    before = Counters(2, 5, 0.5, (32768, 8192))
    assert limit_hit(before, after, cpu_limit_s=5, sig=None) == "disk"
    assert limit_hit(before, Counters(3, 5, 0.5, (100, 100)), 5, None) == "memory"
    assert limit_hit(before, Counters(2, 5, 6.0, (9999, 9999)), 5, None) == "cpu"
    assert limit_hit(before, Counters(2, 5, 0.6, (9999, 9999)), 5, signal.SIGXCPU) == "cpu"
    assert limit_hit(before, Counters(2, 6, 0.6, (9999, 9999)), 5, None) == "pids"
    assert limit_hit(before, Counters(2, 5, 0.6, (9999, 9999)), 5, None) is None
    assert split_trailer(b"no trailer here", mark) == (b"no trailer here", None, None)
    v2 = Counters.parse("== memory.events\noom_kill 1\n== pids.events\nmax 4\n== cpu.stat\nusage_usec 2500000\n")
    assert v2 == Counters(1, 4, 2.5, ())


def test_an_engine_that_does_not_answer_is_refused_with_the_setting_to_change():
    from rollart.sandbox.container_engine import engine_answers

    for backend in ("docker", "podman"):
        from shutil import which

        cli = which(backend)
        if cli is not None and not engine_answers(cli):
            continue  # this one answers: the contract tests run it
        with pytest.raises(isolation.SandboxUnavailable, match=f"envs.workspace.backend={backend}"):
            open_workspace(LIMITS.model_copy(update={"backend": backend}), {})


def test_the_image_recipe_reads_the_mirror_from_apt_and_names_the_config_default(tmp_path):
    assert WorkspaceConfig().image == image.IMAGE
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
                      "Components: main\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
                      "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n")
    assert image.apt_mirror([deb822]) == "http://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# deb http://old.example/debian bookworm main\ndeb [arch=amd64] http://ol.example/d bookworm main\n")
    assert image.apt_mirror([tmp_path / "missing.sources", one_line]) == "http://ol.example/d"
    with pytest.raises(image.ImageBuildError, match="--mirror"):
        image.apt_mirror([tmp_path / "missing.sources"])
    assert len(image.recipe_hash()) == 16 and image.recipe_hash() == image.recipe_hash()
