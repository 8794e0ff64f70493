"""Run untrusted code (a model's program and its tests) in a sandbox, and say which isolation it had.

In: files to write into a fresh temporary working dir, a command run there, stdin bytes, `SandboxConfig`.
Out: `SandboxResult` — exit code, stdout/stderr (bounded), whether the wall timeout or a limit killed it, and
`isolation`, a '+'-joined list of the mechanisms that were really applied, e.g.
`process+rlimits+uid+landlock+netns+pidns`.

Mechanisms, each used where this machine allows it (probed once per process, `probe_isolation`):
- `process`, `rlimits`: always — own process and session; CPU time, address space, process count, file
  size, open files (see `sandbox_launch.py`); a wall timeout kills the whole process group.
- `netns` (no network: a new network namespace has only a downed loopback) and `pidns` (a new PID
  namespace: when its first process dies the kernel kills every process in it, so nothing a fork bomb
  left behind survives): `unshare --net --pid --fork --kill-child` as root, or the same with
  `--user --map-root-user` for an unprivileged user where user namespaces are enabled.
- `uid`: as root, the program runs as a dedicated unprivileged uid (so RLIMIT_NPROC applies — root ignores
  it — and file permissions protect the rest of the system); the working dir is chowned to it.
- `landlock`: writes only beneath the working dir; TCP denied when network is denied (kernel ABI ≥ 4).
Fallback where a mechanism is missing (documented, and visible in `isolation`): without `netns`, network
is denied only for TCP by Landlock ABI ≥ 4, else not at all (`network-open`); without `pidns`, stray
processes are killed by process group (one that calls setsid() could escape until RLIMIT_NPROC stops it);
without `landlock` and `uid`, files are protected only by the permissions of the user running rollart.
`SandboxConfig.network="allow"` skips the network namespace on purpose.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rollart.config import SandboxConfig

LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
OUTPUT_LIMIT = 64 * 1024  # bytes of stdout/stderr kept
UID_BASE = 200_000  # dedicated uids for sandboxed runs (root only): UID_BASE + (pid, run) mix
_run_counter = itertools.count()


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox use (see module docstring)."""

    unshare_prefix: tuple[str, ...]  # () when no namespaces are available
    netns: bool
    pidns: bool
    landlock_abi: int  # 0 = unavailable
    root: bool

    def label(self, network: str, uid: bool) -> str:
        parts = ["process", "rlimits"]
        if uid:
            parts.append("uid")
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
class SandboxResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    stdout: str
    stderr: str
    timed_out: bool  # the wall timeout fired
    wall_s: float
    isolation: str

    @property
    def killed_by_limit(self) -> bool:
        """Killed by the CPU limit (SIGXCPU/SIGKILL) or the wall timeout."""
        return self.timed_out or self.signal in (signal.SIGXCPU, signal.SIGKILL)


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


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
    if unshare:
        base = [unshare] if root else [unshare, "--user", "--map-root-user"]
        for flags, net, pid in (
            (["--net", "--pid", "--fork", "--kill-child"], True, True),
            (["--net"], True, False),
            (["--pid", "--fork", "--kill-child"], False, True),
        ):
            if _works(base + flags + ["true"]):
                prefix, netns, pidns = tuple(base + flags), net, pid
                break
    return Isolation(unshare_prefix=prefix, netns=netns, pidns=pidns, landlock_abi=_landlock_abi(), root=root)


@functools.lru_cache(maxsize=8)
def sandbox_python(configured: str) -> tuple[str, bool]:
    """(interpreter, run as the dedicated uid?) for sandboxed programs.

    As root the program runs as an unprivileged uid, which may not reach this interpreter (a venv under
    /root, mode 0700): try the configured one, else this one, else python3 from /usr/bin, each by really
    launching it as that uid. If none works, the program runs without the uid switch (`uid` is then
    missing from the isolation label)."""
    candidates = [configured] if configured else [sys.executable, shutil.which("python3", path="/usr/bin:/bin")]
    if os.geteuid() != 0:
        return candidates[0] or sys.executable, False
    for python in filter(None, candidates):
        workdir = tempfile.mkdtemp(prefix="rollart-sbx-probe-")
        try:
            os.chown(workdir, UID_BASE, UID_BASE)
            spec = {"workdir": workdir, "uid": UID_BASE, "cpu_time_s": 5, "memory_mb": 512, "max_processes": 8,
                    "file_size_mb": 1, "landlock": False}
            if _works([sys.executable, "-I", str(LAUNCHER), json.dumps(spec), python, "-I", "-c", "pass"]):
                return python, True
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return configured or sys.executable, False


def _prefix_for(iso: Isolation, network: str) -> list[str]:
    """The unshare prefix, without --net when the network is allowed on purpose."""
    if not iso.unshare_prefix:
        return []
    prefix = list(iso.unshare_prefix)
    if network == "allow" and "--net" in prefix:
        prefix.remove("--net")
        if not iso.pidns:
            return []
    return prefix


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(
    files: dict[str, str],
    command: list[str],
    cfg: SandboxConfig,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
) -> SandboxResult:
    """Write `files` into a fresh temp dir, run `command` there under the limits of `cfg`, clean up.

    `command[0]` may be "python": it is replaced by the sandbox's interpreter (`sandbox_python`), run with
    -I (isolated mode: no environment variables, no user site, no script dir on the path).
    Blocking; call it from a worker thread. The temp dir is removed afterwards, whatever the program did.
    """
    iso = probe_isolation()
    python, use_uid = sandbox_python(cfg.python)
    workdir = Path(tempfile.mkdtemp(prefix="rollart-sbx-"))
    uid = None
    try:
        for name, text in files.items():
            target = (workdir / name).resolve()
            if workdir.resolve() not in target.parents:
                raise ValueError(f"sandbox file name {name!r} points outside the working dir")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        if use_uid:
            uid = UID_BASE + (os.getpid() * 997 + next(_run_counter)) % 100_000
            for p in [workdir, *workdir.rglob("*")]:
                os.chown(p, uid, uid)
        spec = {
            "workdir": str(workdir),
            "uid": uid,
            "cpu_time_s": cfg.cpu_time_s,
            "memory_mb": cfg.memory_mb,
            "max_processes": cfg.max_processes,
            "file_size_mb": cfg.file_size_mb,
            "landlock": iso.landlock_abi >= 1,
            "deny_network": cfg.network == "deny",
        }
        program = [python, "-I"] + command[1:] if command[0] == "python" else list(command)
        argv = _prefix_for(iso, cfg.network) + [sys.executable, "-I", str(LAUNCHER), json.dumps(spec)] + program
        child_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(workdir), "TMPDIR": str(workdir)}
        child_env.update(env or {})
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=workdir, env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )
        timed_out = False
        try:
            out, err = proc.communicate(stdin, timeout=cfg.wall_timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate(timeout=10)
        finally:
            _kill_group(proc)  # children left in the group (the pid namespace already took the rest)
        code = proc.returncode
        # under `unshare --fork`, a child killed by signal N is reported as exit code 128 + N
        sig = -code if code < 0 else (code - 128 if iso.pidns and 128 < code < 160 else None)
        return SandboxResult(
            exit_code=None if sig else code,
            signal=sig,
            stdout=out[-OUTPUT_LIMIT:].decode("utf-8", "replace"),
            stderr=err[-OUTPUT_LIMIT:].decode("utf-8", "replace"),
            timed_out=timed_out,
            wall_s=time.monotonic() - t0,
            isolation=iso.label(cfg.network, uid is not None),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
