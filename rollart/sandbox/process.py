"""Run untrusted code (a model's program, a test harness) in a sandbox that fails closed, and say what it had.

In: files to write into a fresh temporary working dir, a command run there, stdin bytes, `SandboxConfig`.
Out: `SandboxResult` — exit code, stdout/stderr (each at most `max_output_kb`), whether the wall timeout,
a limit or the output cap stopped it, and `isolation`, a '+'-joined list of the mechanisms really applied,
e.g. `process+rlimits+uid+landlock+netns+pidns`. `run_pair` runs two programs, each in its own sandbox,
talking over a pair of pipes (what the `code` reward uses to keep the candidate away from its judge).

Mechanisms (probed once per process, `probe_isolation`):
- `process`, `rlimits`: always — own process and session; CPU time, address space, process count, file
  size, open files (`launch.py`); the wall timeout kills the whole process group.
- `uid` (rollart runs as root): the program runs as a dedicated unprivileged uid — never as root. If no
  Python is runnable by that uid, nothing runs: `SandboxUnavailable`, at every isolation level.
- `landlock`: reads confined to the interpreter's files and the system libraries, reads and writes to the
  working dir, nothing else (`launch.py`); TCP denied when the network is (ABI ≥ 4).
- `netns` (a new network namespace: no interface but a downed loopback) and `pidns` (a new PID and mount
  namespace with its own /proc: the program sees only its own processes, and when its init dies the
  kernel kills everything left in it, fork bombs included): `unshare` as root, or with
  `--user --map-root-user` where unprivileged user namespaces are enabled.

Isolation levels, weakest first — `reward.sandbox.min_isolation` says which one a run needs:
- `rlimits`: never root, resource limits, process-group kill. Files are protected only by permissions.
- `landlock`: + Landlock (reads and writes confined as above).
- `full` (default): + a PID/mount namespace with its own /proc, and a network namespace when the network
  is denied.
Fail closed: when this machine gives less than `min_isolation`, `run_sandboxed`/`run_pair` raise
`SandboxUnavailable` naming what is missing and the setting that would accept less; nothing runs.

Output: every stdout/stderr pipe is read incrementally; a stream past `max_output_kb` kills the sandbox
(`output_capped`), so neither the scoring process's memory nor the wall limit depends on what the
program prints.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollart.config import SandboxConfig

log = logging.getLogger("rollart.sandbox")

LAUNCHER = Path(__file__).with_name("launch.py")
LEVELS = ("rlimits", "landlock", "full")  # weakest first
UID_BASE = 200_000  # dedicated uids for sandboxed runs (root only): UID_BASE + (pid, run) mix
SYSTEM_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")  # the dynamic loader and shared libraries
SYSTEM_FILES = ("/etc/ld.so.cache",)
_DRAIN_S = 2.0  # after a kill, how long pipes are drained before giving up on them
_run_counter = itertools.count()


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot give the isolation the config asks for (or would run as root); nothing ran."""


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox use (see module docstring)."""

    unshare_prefix: tuple[str, ...]  # () when no namespaces are available
    netns: bool
    pidns: bool  # with a mount namespace and its own /proc
    landlock_abi: int  # 0 = unavailable
    root: bool
    missing: tuple[str, ...] = ()  # why a mechanism is unavailable, for error messages

    def level(self, network: str) -> str:
        if self.landlock_abi < 1:
            return "rlimits"
        if self.pidns and (self.netns or network == "allow"):
            return "full"
        return "landlock"

    def label(self, network: str, uid: bool) -> str:
        parts = ["process", "rlimits", "uid" if uid else "user"]
        if self.landlock_abi >= 1:
            parts.append("landlock")
        if network == "deny":
            if self.netns:
                parts.append("netns")
            elif self.landlock_abi >= 4:
                parts.append("landlock-net")
            else:
                parts.append("network-open")
        if self.pidns:
            parts.append("pidns")
        return "+".join(parts)


@dataclass(frozen=True)
class Interpreter:
    """The Python that sandboxed programs run with, and the files Landlock lets it read."""

    path: str  # resolved: no symlink or venv indirection the sandbox could not read
    use_uid: bool  # run as a dedicated uid (rollart runs as root)
    read_dirs: tuple[str, ...]
    read_files: tuple[str, ...]


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

    @property
    def killed_by_limit(self) -> bool:
        """Killed by the CPU limit (SIGXCPU/SIGKILL), the wall timeout or the output cap."""
        return self.timed_out or self.output_capped or self.signal in (signal.SIGXCPU, signal.SIGKILL)


@dataclass(frozen=True)
class Program:
    """One sandboxed program of `run_pair`: its files, its command (`python` = the sandbox's
    interpreter) and extra environment variables."""

    files: dict[str, str]
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


# --- probing ---------------------------------------------------------------------------------------------


def _works(cmd: list[str]) -> tuple[bool, str]:
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    return res.returncode == 0, res.stderr.decode("utf-8", "replace").strip()[-300:]


def _landlock_abi() -> int:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))))
    except (OSError, AttributeError):
        return 0


@functools.lru_cache(maxsize=1)
def probe_isolation() -> Isolation:
    """Which namespaces and Landlock work here (cached: probing costs a few process starts)."""
    root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    prefix: tuple[str, ...] = ()
    netns = pidns = False
    missing: list[str] = []
    if unshare:
        base = [unshare] if root else [unshare, "--user", "--map-root-user"]
        pid_flags = ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
        for flags, net, pid in ((["--net"] + pid_flags, True, True), (["--net"], True, False),
                                (pid_flags, False, True)):
            ok, why = _works(base + flags + ["true"])
            if ok:
                prefix, netns, pidns = tuple(base + flags), net, pid
                break
            missing.append(f"`{' '.join(['unshare'] + base[1:] + flags)}` failed: {why or 'no reason given'}")
    else:
        missing.append("`unshare` (util-linux) is not installed")
    abi = _landlock_abi()
    if abi < 1:
        missing.append("Landlock is unavailable (Linux ≥ 5.13 with the landlock LSM enabled)")
    return Isolation(prefix, netns, pidns, abi, root, tuple(missing))


def _interpreter(python: str, use_uid: bool) -> Interpreter:
    real = os.path.realpath(python)
    prefix = os.path.dirname(os.path.dirname(real))
    dirs = [d for d in (os.path.join(prefix, "lib"), *SYSTEM_LIB_DIRS) if os.path.isdir(d)]
    files = [f for f in (real, *SYSTEM_FILES) if os.path.isfile(f)]
    return Interpreter(real, use_uid, tuple(dict.fromkeys(dirs)), tuple(files))


@functools.lru_cache(maxsize=8)
def _find_interpreter(configured: str) -> Interpreter | str:
    """The sandbox's Python (see `sandbox_python`), or why there is none."""
    iso = probe_isolation()
    candidates = [configured] if configured else [sys.executable, shutil.which("python3", path="/usr/bin:/bin")]
    tried = []
    for python in filter(None, candidates):
        interp = _interpreter(python, iso.root)
        res = _launch_and_wait(interp, iso)
        if res is None:
            return interp
        tried.append(f"{python} ({interp.path}): {res}")
    who = f"uid {UID_BASE} (rollart runs as root and never runs a program as root)" if iso.root else "this user"
    return (f"no Python interpreter runs in the sandbox as {who}; tried: {'; '.join(tried) or 'none'}. Set "
            "reward.sandbox.python to an interpreter that user can read (outside /root, e.g. /usr/bin/python3 "
            "from the python3-minimal package)")


def _launch_and_wait(interp: Interpreter, iso: Isolation) -> str | None:
    """Start `interp` under this machine's strongest isolation and import a few stdlib modules; None if it
    worked, else what went wrong."""
    workdir = Path(tempfile.mkdtemp(prefix="rollart-sbx-probe-"))
    try:
        spec = _spec(workdir, iso, interp, SandboxConfig(), UID_BASE if interp.use_uid else None, None)
        if interp.use_uid:
            os.chown(workdir, UID_BASE, UID_BASE)
        argv = list(iso.unshare_prefix) + [sys.executable, "-I", str(LAUNCHER), json.dumps(spec), interp.path,
                                           "-I", "-S", "-c", "import json, math, re, collections, itertools"]
        ok, why = _works(argv)
        return None if ok else (why or "it exited with an error")
    except OSError as exc:
        return str(exc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def sandbox_python(configured: str) -> Interpreter:
    """The interpreter of sandboxed programs: `configured`, else this one, else /usr/bin/python3 — the first
    that really starts under the sandbox (as the dedicated uid when rollart runs as root: a venv under
    /root, mode 0700, is out of its reach). Raises `SandboxUnavailable` when none does."""
    found = _find_interpreter(configured)
    if isinstance(found, str):
        raise SandboxUnavailable(found)
    return found


def check_isolation(cfg: SandboxConfig) -> str:
    """The isolation label this config gets here, or `SandboxUnavailable` saying what is missing and which
    setting would accept less. Probes once per process (a few process starts)."""
    iso = probe_isolation()
    sandbox_python(cfg.python)
    have = iso.level(cfg.network)
    if LEVELS.index(have) < LEVELS.index(cfg.min_isolation):
        missing = "; ".join(iso.missing) or "unknown"
        raise SandboxUnavailable(
            f"the code sandbox needs isolation level '{cfg.min_isolation}' (reward.sandbox.min_isolation) but "
            f"this machine gives only '{have}': {missing}. Fix the machine, or set "
            f"reward.sandbox.min_isolation={have} to accept running untrusted code with less isolation "
            f"(levels, weakest first: {', '.join(LEVELS)})"
        )
    if have != "full":
        _warn_once(have)
    return iso.label(cfg.network, sandbox_python(cfg.python).use_uid)


@functools.lru_cache(maxsize=4)
def _warn_once(level: str) -> None:
    log.warning("the code sandbox runs at isolation level '%s' (below 'full', accepted by "
                "reward.sandbox.min_isolation)", level)


# --- launching -------------------------------------------------------------------------------------------


def _spec(workdir: Path, iso: Isolation, interp: Interpreter, cfg: SandboxConfig, uid: int | None,
          channel_fd: int | None) -> dict:
    nproc = cfg.max_processes
    if uid is None and not iso.root:
        nproc += _processes_of(os.getuid())  # RLIMIT_NPROC counts every process of this user
    return {
        "workdir": str(workdir),
        "uid": uid,
        "userns": not iso.root and bool(iso.unshare_prefix),
        "cpu_time_s": cfg.cpu_time_s,
        "memory_mb": cfg.memory_mb,
        "max_processes": nproc,
        "file_size_mb": cfg.file_size_mb,
        "channel_fd": channel_fd,
        "landlock": {"read": list(interp.read_dirs), "read_files": list(interp.read_files),
                     "deny_network": cfg.network == "deny"} if iso.landlock_abi >= 1 else None,
    }


def _processes_of(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n


def _prefix_for(iso: Isolation, network: str) -> list[str]:
    """The unshare prefix, without --net when the network is allowed on purpose."""
    prefix = list(iso.unshare_prefix)
    if network == "allow" and "--net" in prefix:
        prefix.remove("--net")
        if not iso.pidns:
            return []
    return prefix


@dataclass
class _Launched:
    proc: subprocess.Popen
    workdir: Path
    isolation: str
    streams: dict[str, bytearray] = field(default_factory=dict)


def _launch(program: Program, cfg: SandboxConfig, *, stdin: int, channel_fd: int | None,
            iso: Isolation, interp: Interpreter) -> _Launched:
    workdir = Path(tempfile.mkdtemp(prefix="rollart-sbx-"))
    try:
        for name, text in program.files.items():
            target = (workdir / name).resolve()
            if workdir.resolve() not in target.parents:
                raise ValueError(f"sandbox file name {name!r} points outside the working dir")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        uid = None
        if interp.use_uid:
            uid = UID_BASE + (os.getpid() * 997 + next(_run_counter)) % 100_000
            for p in [workdir, *workdir.rglob("*")]:
                os.chown(p, uid, uid)
            os.chmod(workdir, 0o700)
        spec = _spec(workdir, iso, interp, cfg, uid, channel_fd)
        command = program.command
        argv = [interp.path, "-I", "-S"] + command[1:] if command[0] == "python" else list(command)
        full = _prefix_for(iso, cfg.network) + [sys.executable, "-I", str(LAUNCHER), json.dumps(spec)] + argv
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir), "TMPDIR": str(workdir),
               **program.env}
        proc = subprocess.Popen(
            full, cwd=workdir, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, pass_fds=(channel_fd,) if channel_fd is not None else (),
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return _Launched(proc, workdir, iso.label(cfg.network, uid is not None))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(runs: list[_Launched], cfg: SandboxConfig, stdin_data: bytes | None) -> tuple[bool, bool]:
    """Read every stdout/stderr incrementally until the first run (the primary) has exited and its pipes
    closed, the wall deadline passes, or a stream passes the cap. Returns (timed_out, output_capped).
    Everything still running at the end is killed: with a PID namespace its init dies and takes every
    process of the sandbox with it."""
    cap = cfg.max_output_kb * 1024
    deadline = time.monotonic() + cfg.wall_timeout_s
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
    primary_open = 2  # the primary's stdout and stderr
    try:
        while primary_open and not capped:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(remaining, 0.5)):
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
    finally:
        for run in runs:
            _kill_group(run.proc)  # whatever is left (the pid namespace already took the rest)
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
    return timed_out, capped


def _read(pipe) -> bytes | None:
    """The bytes ready on a non-blocking pipe; b"" at EOF; None when nothing is ready after all."""
    try:
        return os.read(pipe.fileno(), 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _result(run: _Launched, iso: Isolation, timed_out: bool, capped: bool, t0: float) -> SandboxResult:
    code = run.proc.returncode
    if code is None:
        code = -signal.SIGKILL
    # under `unshare --fork`, a child killed by signal N is reported as exit code 128 + N
    sig = -code if code < 0 else (code - 128 if iso.pidns and 128 < code < 160 else None)
    return SandboxResult(
        exit_code=None if sig else code,
        signal=sig,
        stdout=run.streams.get("stdout", b"").decode("utf-8", "replace"),
        stderr=run.streams.get("stderr", b"").decode("utf-8", "replace"),
        timed_out=timed_out,
        wall_s=time.monotonic() - t0,
        isolation=run.isolation,
        output_capped=capped,
    )


def run_sandboxed(
    files: dict[str, str],
    command: list[str],
    cfg: SandboxConfig,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
) -> SandboxResult:
    """Write `files` into a fresh temp dir, run `command` there under the limits of `cfg`, clean up.

    `command[0]` may be "python": it is replaced by the sandbox's interpreter (`sandbox_python`), run with
    -I -S (isolated mode, no site-packages: the standard library only). Blocking; call it from a worker
    thread. Raises `SandboxUnavailable` (before anything runs) when `cfg.min_isolation` cannot be had.
    The temp dir is removed afterwards, whatever the program did.
    """
    check_isolation(cfg)
    iso, interp = probe_isolation(), sandbox_python(cfg.python)
    t0 = time.monotonic()
    run = _launch(Program(files, command, env or {}), cfg, stdin=subprocess.PIPE, channel_fd=None,
                  iso=iso, interp=interp)
    try:
        timed_out, capped = _pump([run], cfg, stdin)
        return _result(run, iso, timed_out, capped, t0)
    finally:
        shutil.rmtree(run.workdir, ignore_errors=True)


def run_pair(primary: Program, peer: Program, cfg: SandboxConfig) -> tuple[SandboxResult, SandboxResult]:
    """Run two programs, each in its own sandbox (own working dir, uid and namespaces), connected by two
    pipes: what one writes to fd 3 the other reads on stdin. The run ends when `primary` exits (the peer
    is then killed), at the wall deadline, or when any stdout/stderr passes the cap — all limits of `cfg`
    apply to each. Raises `SandboxUnavailable` as `run_sandboxed` does."""
    check_isolation(cfg)
    iso, interp = probe_isolation(), sandbox_python(cfg.python)
    to_peer_r, to_peer_w = os.pipe()
    to_primary_r, to_primary_w = os.pipe()
    runs: list[_Launched] = []
    t0 = time.monotonic()
    try:
        runs.append(_launch(primary, cfg, stdin=to_primary_r, channel_fd=to_peer_w, iso=iso, interp=interp))
        runs.append(_launch(peer, cfg, stdin=to_peer_r, channel_fd=to_primary_w, iso=iso, interp=interp))
    except BaseException:
        for run in runs:
            _kill_group(run.proc)
            run.proc.wait()
            shutil.rmtree(run.workdir, ignore_errors=True)
        raise
    finally:
        for fd in (to_peer_r, to_peer_w, to_primary_r, to_primary_w):  # only the sandboxes hold them now
            os.close(fd)
    try:
        timed_out, capped = _pump(runs, cfg, None)
        return _result(runs[0], iso, timed_out, capped, t0), _result(runs[1], iso, timed_out, capped, t0)
    finally:
        for run in runs:
            shutil.rmtree(run.workdir, ignore_errors=True)
