"""Small helpers shared by tests of several planes (importable: tests/ is on sys.path via its conftest)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Callable


def wait_until(predicate: Callable[[], bool], what: str = "a condition", timeout_s: float = 60.0,
               poll_s: float = 0.02) -> None:
    """Poll `predicate` until it holds; past `timeout_s` fail the test, saying what it waited for."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (servers in tests bind loopback only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ListeningSockets:
    """Every listening socket of a process tree, sampled in a thread while it runs: `with
    ListeningSockets(pid) as seen: ...`; then `seen.found` maps (ip, port) → the process command line."""

    def __init__(self, pid: int, poll_s: float = 0.25) -> None:
        import threading

        self.pid, self.poll_s = pid, poll_s
        self.found: dict[tuple[str, int], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                conns = proc.net_connections(kind="inet")
                name = " ".join(proc.cmdline())[:120] or proc.name()
            except psutil.Error:
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    self.found.setdefault((c.laddr.ip, c.laddr.port), name)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.poll_s)

    def public(self) -> dict[tuple[str, int], str]:
        """The sockets listening beyond loopback."""
        from rollart.config import is_loopback_host

        return {addr: who for addr, who in self.found.items() if not is_loopback_host(addr[0])}

    def __enter__(self) -> ListeningSockets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def unknown_run_dir_entries(run_dir: Path) -> list[str]:
    """What a run left in its run directory that the run-directory contract does not name (a file written past
    `RunPaths`, a temporary file left behind), and what the run-directory check would refuse there."""
    from rollart.base.run_dir import ARTEFACTS, RunPaths

    top = [p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir()]
    unknown = [f"{run_dir / name}: not in rollart.base.run_dir.ARTEFACTS" for name in top if name not in ARTEFACTS]
    leftovers = [f"{p}: a temporary file left behind" for p in run_dir.rglob(".*.tmp-*")]
    return unknown + leftovers + RunPaths.of(run_dir).unsafe_paths()
