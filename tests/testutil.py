"""Small helpers shared by tests of several planes (importable: tests/ is on sys.path via its conftest)."""

from __future__ import annotations

import socket
import time
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
