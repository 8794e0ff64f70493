"""How `build_system` starts its two chains: side by side only where no pool is shared (`trainer_pools_apart`),
and `BackgroundStart`'s guarantees — its stop callbacks join the caller's stack, its error reaches the caller,
and a part the caller abandoned stops what it started, whether it was done then or finished later."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import pytest

from rollart.base.background_start import BackgroundStart
from rollart.config.loader import load_config
from rollart.job.system import trainer_pools_apart


def test_the_default_pools_start_side_by_side_and_a_shared_pool_does_not():
    assert trainer_pools_apart(load_config(None, []))
    # the trainer falling back to a generation pool could take a slot an engine would have had
    assert not trainer_pools_apart(load_config(None, ["pools.train.fallback=[gen_decode]"]))
    assert not trainer_pools_apart(load_config(None, ["roles.env.pool=train"]))


def test_a_joined_part_hands_over_its_stop_callbacks_and_its_errors_reach_the_caller():
    stopped: list[str] = []

    def start(stack: ExitStack) -> str:
        stack.callback(stopped.append, "engines")
        return "ready"

    with ExitStack() as stack:
        assert BackgroundStart("engines", start).join(into=stack, timeout_s=10) == "ready"
        assert stopped == []
    assert stopped == ["engines"]

    def failing(stack: ExitStack) -> None:
        stack.callback(stopped.append, "half-started")
        raise RuntimeError("no room on pool env")

    with pytest.raises(RuntimeError, match="no room on pool env"):
        BackgroundStart("env workers", failing).join(into=ExitStack(), timeout_s=10)
    assert stopped == ["engines", "half-started"]  # what it had started is stopped before the error is seen


def test_an_abandoned_part_stops_what_it_started_now_or_when_it_returns():
    stopped: list[str] = []
    release = threading.Event()

    def slow(stack: ExitStack) -> None:
        stack.callback(stopped.append, "slow")
        release.wait(10)

    part = BackgroundStart("slow part", slow)
    with pytest.raises(TimeoutError, match="slow part did not finish within 0 s"):
        part.join(into=ExitStack(), timeout_s=0.05)  # a join past its bound abandons the part
    assert stopped == []
    release.set()
    deadline = time.monotonic() + 10
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stopped == ["slow"]  # stopped on its own thread, the moment it returned

    done = BackgroundStart("quick part", lambda stack: stack.callback(stopped.append, "quick"))
    deadline = time.monotonic() + 10
    while not done._done.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    done.abandon()
    assert stopped == ["slow", "quick"]


def _failing_stop(stack: ExitStack, release: threading.Event | None = None) -> None:
    def stop() -> None:
        raise ConnectionError("Ray has been shut down")

    stack.callback(stop)
    if release is not None:
        release.wait(10)


def test_a_stop_that_fails_is_one_warning_and_never_a_thread_traceback(caplog, monkeypatch):
    unhandled: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))

    # a part that fails and whose stop fails too: the caller still gets the part's own error, at once
    def start_then_fail(stack: ExitStack) -> None:
        _failing_stop(stack)
        raise RuntimeError("no room on pool env")

    with pytest.raises(RuntimeError, match="no room on pool env"):
        BackgroundStart("env workers", start_then_fail).join(into=ExitStack(), timeout_s=10)

    # a part abandoned while it starts, whose stop fails when it returns (Ctrl-C shut Ray down meanwhile)
    release = threading.Event()
    part = BackgroundStart("inference engines", lambda stack: _failing_stop(stack, release))
    part.abandon()
    release.set()
    part._thread.join(10)
    assert not part._thread.is_alive()

    # and one abandoned after it finished: abandon() itself does not raise
    done = BackgroundStart("reward service", _failing_stop)
    done._done.wait(10)
    done.abandon()

    assert unhandled == []
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("env workers: could not stop what it had started (it failed to start): ConnectionError" in w for w in warnings), warnings
    assert any(w.startswith("inference engines: could not stop what it had started (the caller gave up") for w in warnings), warnings
    assert any(w.startswith("reward service: could not stop") for w in warnings), warnings
