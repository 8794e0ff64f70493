"""Run untrusted code (a model's program, a test harness) in a sandbox that fails closed, and say what it had.

In: files to write into a fresh working dir, a command run there, stdin bytes, `SandboxConfig`.
Out: `SandboxResult` — exit code, stdout/stderr (each at most `max_output_kb`), whether the wall timeout,
a limit or the output cap stopped it (`limit_hit`: "memory" | "cpu" | "pids" | "disk" | None), and
`isolation`, a '+'-joined list of the mechanisms really applied (isolation.py), e.g.
`process+rlimits+uid+landlock+netns+pidns+mntns+tmpfs+cgroup`. `run_pair` runs two programs, each in its own
sandbox, talking over a pair of pipes (what the `code` reward uses to keep the candidate away from its judge).

Limits for the program and all its children together (with `cgroup`): memory `memory_mb` + `disk_mb` (the
files live in RAM), `max_processes`, and `cpu_time_s` of CPU — watched every 50 ms while it runs; an OOM
kill or the CPU budget ends the whole run. The files of the whole tree sit on a tmpfs of `disk_mb`
(`tmpfs`): a write past it fails with ENOSPC and the result says `limit_hit="disk"`. Per process, the
launcher's rlimits apply as well (launch.py).

Nothing outlives a run: the wall timeout, the end of the primary program or a limit kills every process
(the PID namespace's init dies and takes everything in it along; its cgroup is emptied and removed, the
staging dir deleted, and the mount namespace with its tmpfs goes with its last process). If this process
itself dies, the launchers see their lifeline close and kill their sandboxes; what such a death leaves on
disk or in the cgroup tree is reaped by the next process's first sandbox (isolation.probe_isolation).

Output: every stdout/stderr pipe is read incrementally; a stream past `max_output_kb` kills the sandbox
(`output_capped`), so neither the scoring process's memory nor the wall limit depends on what the
program prints.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollart.config import SandboxConfig, SandboxLimits
from rollart.sandbox import cgroups, isolation
from rollart.sandbox.isolation import (
    UID_BASE, Interpreter, Isolation, SandboxUnavailable, hand_over, launcher_argv, launcher_env, launcher_spec,
    lifeline_fd,
    new_staging,
)

log = logging.getLogger("rollart.sandbox")

_DRAIN_S = 2.0  # after a kill, how long pipes are drained before giving up on them
_WATCH_S = 0.05  # how often a run's cgroup is read (CPU time, OOM kills) while it runs
_BACKSTOP_S = 5.0  # the launcher's own wall limit lies this far past the parent's
_PEER_GRACE_S = 0.5  # after the primary ends, how long a peer may take to end by itself before it is killed
_DISK_FULL_BYTES = 256 * 1024  # less free than this on the tmpfs after a run: the disk cap was reached
_run_counter = itertools.count()


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    stdout: str
    stderr: str
    timed_out: bool  # the wall timeout fired
    wall_s: float
    isolation: str
    output_capped: bool = False  # a stream passed max_output_kb: the sandbox was killed
    limit_hit: str | None = None  # "memory" | "cpu" | "pids" | "disk": a limit of the whole tree was reached
    cpu_s: float | None = None  # CPU time of the whole tree (with cgroups)


@dataclass(frozen=True)
class Program:
    """One sandboxed program of `run_pair`: its files, its command (`python` = the sandbox's
    interpreter) and extra environment variables."""

    files: dict[str, str]
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


def encode_text(what: str, text: str) -> bytes:
    """`text` as UTF-8, or ValueError saying `what` (e.g. "sandbox file 'a.py'") is not valid text and why
    (e.g. a lone surrogate)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid text: {exc.reason} ({exc.object[exc.start:exc.end]!r} at "
                         f"character {exc.start})") from None


def allocate_uid(interp: Interpreter) -> int | None:
    """A dedicated uid for one sandbox (root only), so RLIMIT_NPROC and signals stay inside it."""
    if not interp.use_uid:
        return None
    return UID_BASE + (os.getpid() * 997 + next(_run_counter)) % 100_000


@dataclass
class Launched:
    """One started sandbox: its launcher process and what must be read and removed after it."""

    proc: subprocess.Popen
    staging: Path
    isolation: str
    group: cgroups.TreeGroup | None
    owns_group: bool  # remove the group afterwards (a workspace keeps its own)
    report_r: int | None
    cpu_limit_s: float
    cpu_at_start: float = 0.0
    oom_at_start: int = 0
    pids_at_start: int = 0
    streams: dict[str, bytearray] = field(default_factory=dict)


def tree_group(cfg: SandboxLimits, iso: Isolation, setting: str) -> cgroups.TreeGroup | None:
    """A fresh cgroup for one sandbox's tree (None where this machine has none); a group the kernel refuses
    is `SandboxUnavailable` when `cfg.min_isolation` is `full`, else the run goes on without one."""
    if not iso.cgroups:
        return None
    try:
        return cgroups.new_group((cfg.memory_mb + cfg.disk_mb) << 20, cfg.max_processes)
    except OSError as exc:
        if cfg.min_isolation == "full":
            raise SandboxUnavailable(f"the sandbox's cgroup could not be made ({exc}); {setting}.min_isolation="
                                     "full needs one (set it to namespaces to run without)") from None
        log.warning("the sandbox's cgroup could not be made (%s): running without whole-tree limits", exc)
        return None


def launch(
    command: list[str], cfg: SandboxLimits, *, iso: Isolation, interp: Interpreter | None, stdin: int,
    staging: Path, uid: int | None, group: cgroups.TreeGroup | None, owns_group: bool,
    env: dict[str, str], read: tuple[str, ...], channel_fd: int | None = None, wall_s: float | None = None,
    cpu_limit_s: float | None = None, proc: bool = False, exec_write: bool = False,
    bind_work: str | None = None, bind_tmp: str | None = None, disk_cap: bool = True,
) -> Launched:
    """Start `command` in a sandbox over `staging` (files already in place); `command[0]` "python" means
    `interp`. On failure nothing is left running; the caller still owns `staging` and `group`."""
    wall_s = cfg.wall_timeout_s if wall_s is None else wall_s
    report_r, report_w = os.pipe()
    spec = launcher_spec(
        iso=iso, network=cfg.network, staging=staging, uid=uid, limits=cfg, read=read, proc=proc,
        exec_write=exec_write, bind_work=bind_work, bind_tmp=bind_tmp,
        cgroup_procs=group.procs_files if group else None, channel_fd=channel_fd, report_fd=report_w,
        wall_s=wall_s + _BACKSTOP_S,
    )
    argv = [interp.path, "-I", "-S"] + command[1:] if interp and command[0] == "python" else list(command)
    home = "/workspace" if iso.namespaces else spec["cwd"]
    full_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
                "TMPDIR": "/tmp" if iso.namespaces else home, **env}
    fds = tuple(fd for fd in (channel_fd, lifeline_fd(), report_w) if fd is not None)
    try:
        popen = subprocess.Popen(
            launcher_argv(argv), cwd=staging, env=launcher_env(spec, full_env), stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, pass_fds=fds,
        )
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)
    run = Launched(popen, staging, iso.label(cfg.network, uid is not None, disk_cap, group is not None), group,
                   owns_group, report_r, cfg.cpu_time_s if cpu_limit_s is None else cpu_limit_s)
    if group is not None:
        run.cpu_at_start, run.oom_at_start, run.pids_at_start = group.cpu_s(), group.oom_kills(), group.pids_refused()
    return run


def _launch_program(program: Program, cfg: SandboxConfig, *, stdin: int, channel_fd: int | None,
                    iso: Isolation, interp: Interpreter) -> Launched:
    staging = new_staging()
    group = None
    try:
        files = staging / "files"
        for name, text in program.files.items():
            target = (files / name).resolve()
            if files.resolve() not in target.parents:
                raise ValueError(f"sandbox file name {name!r} points outside the working dir")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(encode_text(f"sandbox file {name!r}", text))
        uid = allocate_uid(interp)
        hand_over(staging, uid, iso)
        group = tree_group(cfg, iso, "reward.sandbox")
        return launch(program.command, cfg, iso=iso, interp=interp, stdin=stdin, staging=staging, uid=uid,
                      group=group, owns_group=True, env=program.env, read=interp.read_dirs + interp.read_files,
                      channel_fd=channel_fd)
    except BaseException:
        if group is not None:
            group.remove()
        shutil.rmtree(staging, ignore_errors=True)
        raise


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _over_limit(runs: list[Launched]) -> str | None:
    for run in runs:
        if run.group is None:
            continue
        if run.group.oom_kills() > run.oom_at_start:
            return "memory"
        if run.group.cpu_s() - run.cpu_at_start > run.cpu_limit_s:
            return "cpu"
    return None


def pump(runs: list[Launched], cfg: SandboxLimits, stdin_data: bytes | None,
         wall_s: float | None = None) -> tuple[bool, bool, str | None]:
    """Read every stdout/stderr incrementally until the first run (the primary) has exited and its pipes
    closed (and the others have, or `_PEER_GRACE_S` has passed), the wall deadline passes, a stream passes
    the cap, or a tree passes its memory or CPU limit.
    Returns (timed_out, output_capped, limit). Everything still running at the end is killed: with a PID
    namespace its init dies and takes every process of the sandbox with it."""
    cap = cfg.max_output_kb * 1024
    deadline = time.monotonic() + (cfg.wall_timeout_s if wall_s is None else wall_s)
    watched = any(run.group is not None for run in runs)
    sel = selectors.DefaultSelector()
    for run in runs:
        for name in ("stdout", "stderr"):
            pipe = getattr(run.proc, name)
            os.set_blocking(pipe.fileno(), False)
            run.streams[name] = bytearray()
            sel.register(pipe, selectors.EVENT_READ, (run, name))
    pending = memoryview(stdin_data or b"")
    if stdin_data is not None and runs[0].proc.stdin is not None:
        os.set_blocking(runs[0].proc.stdin.fileno(), False)
        if pending:
            sel.register(runs[0].proc.stdin, selectors.EVENT_WRITE, None)
        else:
            runs[0].proc.stdin.close()
    timed_out = capped = False
    limit = None
    primary_open = 2  # the primary's stdout and stderr
    grace_until = None
    next_watch = 0.0
    try:
        while not capped and limit is None:
            if not primary_open:  # peers get a moment to end on their own (and report what they hit)
                grace_until = grace_until or time.monotonic() + _PEER_GRACE_S
                if time.monotonic() >= grace_until or not any(
                        key.data is not None and key.data[0] is not runs[0] for key in sel.get_map().values()):
                    break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(remaining, _WATCH_S if watched else 0.5)):
                if key.data is None:  # stdin of the primary
                    try:
                        n = os.write(key.fileobj.fileno(), pending[:65536])
                    except (BrokenPipeError, OSError):
                        n = len(pending)
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                    continue
                run, name = key.data
                chunk = _read(key.fileobj)
                if chunk is None:
                    continue
                if chunk:
                    buf = run.streams[name]
                    buf += chunk[: cap + 1 - len(buf)]
                    if len(buf) > cap:
                        del buf[cap:]
                        capped = True
                    continue
                sel.unregister(key.fileobj)
                if run is runs[0]:
                    primary_open -= 1
            if watched and time.monotonic() >= next_watch:  # at most every _WATCH_S, however chatty the run
                limit = _over_limit(runs)
                next_watch = time.monotonic() + _WATCH_S
    finally:
        for run in runs:
            kill_group(run.proc)  # whatever is left (the pid namespace already took the rest)
        drain_until = time.monotonic() + _DRAIN_S
        while sel.get_map() and time.monotonic() < drain_until:  # pipes close once the groups are dead
            for key, _ in sel.select(0.1):
                if key.data is None or _read(key.fileobj) == b"":
                    sel.unregister(key.fileobj)
        sel.close()
        for run in runs:
            for pipe in (run.proc.stdin, run.proc.stdout, run.proc.stderr):
                if pipe is not None:
                    pipe.close()
            try:
                run.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("sandbox process %d did not exit after SIGKILL", run.proc.pid)
    return timed_out, capped, limit


def _read(pipe) -> bytes | None:
    """The bytes ready on a non-blocking pipe; b"" at EOF; None when nothing is ready after all."""
    try:
        return os.read(pipe.fileno(), 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _report(run: Launched) -> dict:
    """What the launcher reported (the program's status, the tmpfs's free space); {} when it was killed."""
    if run.report_r is None:
        return {}
    try:
        os.set_blocking(run.report_r, False)
        data = os.read(run.report_r, 65536)
        report = json.loads(data.splitlines()[0]) if data else {}
        return report if isinstance(report, dict) else {}
    except (OSError, ValueError, IndexError):
        return {}
    finally:
        os.close(run.report_r)
        run.report_r = None


def finish(run: Launched, timed_out: bool, capped: bool, limit: str | None, t0: float) -> SandboxResult:
    """The result of a run that `pump` ended, its cgroup emptied (and removed when the run owns it)."""
    report = _report(run)
    if "exit" in report or "signal" in report:
        code, sig = report.get("exit"), report.get("signal")
    else:
        rc = run.proc.returncode if run.proc.returncode is not None else -signal.SIGKILL
        # the launcher relays a signal death as 128 + N; its own death (we killed it) is negative
        sig = -rc if rc < 0 else (rc - 128 if 128 < rc < 160 else None)
        code = None if sig else rc
    cpu_s = None
    if run.group is not None:
        run.group.kill()
        cpu_s = run.group.cpu_s() - run.cpu_at_start
        if limit is None and run.group.oom_kills() > run.oom_at_start:
            limit = "memory"
        if limit is None and cpu_s > run.cpu_limit_s:
            limit = "cpu"
    if limit is None and sig == signal.SIGXCPU:
        limit = "cpu"
    if limit is None and report.get("disk_size") and report.get("disk_free", 1 << 62) < _DISK_FULL_BYTES:
        limit = "disk"
    if limit is None and run.group is not None and run.group.pids_refused() > run.pids_at_start:
        limit = "pids"
    if run.group is not None and run.owns_group:
        run.group.remove()
    return SandboxResult(
        exit_code=code, signal=sig,
        stdout=run.streams.get("stdout", b"").decode("utf-8", "replace"),
        stderr=run.streams.get("stderr", b"").decode("utf-8", "replace"),
        timed_out=timed_out, wall_s=time.monotonic() - t0, isolation=run.isolation, output_capped=capped,
        limit_hit=limit, cpu_s=cpu_s,
    )


def cleanup(run: Launched, remove_staging: bool = True) -> None:
    """Whatever a run left: its launcher (killed if still running), report pipe, own cgroup, staging dir
    (unless it belongs to a workspace). Idempotent."""
    if run.proc.returncode is None:
        kill_group(run.proc)
        run.proc.wait()
    if run.report_r is not None:
        os.close(run.report_r)
        run.report_r = None
    if run.group is not None and run.owns_group:
        run.group.remove()
    if remove_staging:
        shutil.rmtree(run.staging, ignore_errors=True)


def run_sandboxed(
    files: dict[str, str],
    command: list[str],
    cfg: SandboxConfig,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
) -> SandboxResult:
    """Write `files` into a fresh working dir, run `command` there under the limits of `cfg`, clean up.

    `command[0]` may be "python": it is replaced by the sandbox's interpreter (`sandbox_python`), run with
    -I -S (isolated mode, no site-packages: the standard library only). Blocking; call it from a worker
    thread. Raises `SandboxUnavailable` (before anything runs) when `cfg.min_isolation` cannot be had, and
    ValueError for a file name leaving the working dir or a file that is not valid text.
    """
    isolation.check_isolation(cfg)
    iso = isolation.probe_isolation()
    interp = isolation.sandbox_python(cfg.python)
    t0 = time.monotonic()
    run = _launch_program(Program(files, command, env or {}), cfg, stdin=subprocess.PIPE, channel_fd=None,
                          iso=iso, interp=interp)
    try:
        timed_out, capped, limit = pump([run], cfg, stdin)
        return finish(run, timed_out, capped, limit, t0)
    finally:
        cleanup(run)


def run_pair(primary: Program, peer: Program, cfg: SandboxConfig) -> tuple[SandboxResult, SandboxResult]:
    """Run two programs, each in its own sandbox (own working dir, uid, namespaces and cgroup), connected by
    two pipes: what one writes to fd 3 the other reads on stdin. The run ends when `primary` exits (the peer
    is then killed), at the wall deadline, when any stdout/stderr passes the cap, or when either tree passes
    its memory or CPU limit — all limits of `cfg` apply to each. Raises `SandboxUnavailable` as
    `run_sandboxed` does."""
    isolation.check_isolation(cfg)
    iso = isolation.probe_isolation()
    interp = isolation.sandbox_python(cfg.python)
    to_peer_r, to_peer_w = os.pipe()
    to_primary_r, to_primary_w = os.pipe()
    runs: list[Launched] = []
    t0 = time.monotonic()
    try:
        runs.append(_launch_program(primary, cfg, stdin=to_primary_r, channel_fd=to_peer_w, iso=iso, interp=interp))
        runs.append(_launch_program(peer, cfg, stdin=to_peer_r, channel_fd=to_primary_w, iso=iso, interp=interp))
    except BaseException:
        for run in runs:
            cleanup(run)
        raise
    finally:
        for fd in (to_peer_r, to_peer_w, to_primary_r, to_primary_w):  # only the sandboxes hold them now
            os.close(fd)
    try:
        timed_out, capped, limit = pump(runs, cfg, None)
        return (finish(runs[0], timed_out, capped, limit, t0), finish(runs[1], timed_out, capped, limit, t0))
    finally:
        for run in runs:
            cleanup(run)
