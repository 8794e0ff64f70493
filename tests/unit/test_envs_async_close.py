"""`AsyncEnv.close` after a sync call whose caller gave up: the call's thread runs on, and close must come after
it (or after `CLOSE_WAITS_FOR_CALL_S` when it hangs), never beside it — what a late `prepare` opens would be left
on an env already closed (the podman e2e's leftover containers at a shutdown)."""

import asyncio
import threading
import time

import pytest

from rollart.envs import protocol
from rollart.envs.protocol import AsyncEnv


class SlowPrepareEnv:
    """prepare() opens a resource after `delay_s`; close() records what was open when it ran."""

    def __init__(self, delay_s: float, release: threading.Event | None = None) -> None:
        self.delay_s, self.release = delay_s, release
        self.opened = False
        self.open_at_close: bool | None = None

    def reset(self, seed=None):
        return "obs", {}

    def step(self, action):
        return "obs", 0.0, True, False, {}

    def prepare(self) -> None:
        if self.release is not None:
            self.release.wait(10)
        time.sleep(self.delay_s)
        self.opened = True

    def close(self) -> None:
        self.open_at_close = self.opened
        self.opened = False


def test_close_after_a_cancelled_prepare_waits_for_its_thread_and_closes_what_it_opened():
    async def scenario() -> SlowPrepareEnv:
        inner = SlowPrepareEnv(0.3)
        env = AsyncEnv(inner)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(env.prepare(), 0.05)
        await env.close()
        return inner

    inner = asyncio.run(scenario())
    assert inner.open_at_close is True and inner.opened is False


def test_a_hung_call_delays_close_by_the_bound_only(monkeypatch):
    monkeypatch.setattr(protocol, "CLOSE_WAITS_FOR_CALL_S", 0.2)
    release = threading.Event()

    async def scenario() -> tuple[SlowPrepareEnv, float]:
        inner = SlowPrepareEnv(0.0, release)
        env = AsyncEnv(inner)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(env.prepare(), 0.05)
        t0 = time.monotonic()
        await env.close()
        waited = time.monotonic() - t0
        release.set()
        return inner, waited

    inner, waited = asyncio.run(scenario())
    assert inner.open_at_close is False  # closed while the call still hung: closing may be what unblocks it
    assert 0.15 <= waited < 5.0
