"""Envs that declare `runs_inline = True` (quick, never-blocking calls): built, reset, stepped and closed on the
event loop's own thread, no thread-pool hop; every other env's sync calls still go to the thread pool."""

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor

from rollart.envs.domains.math_env import MathEnv
from rollart.envs.protocol import AsyncEnv, runs_inline
from rollart.envs.warm_pool import build_prepared


class ThreadRecordingEnv:
    """Records the thread of each call."""

    def __init__(self) -> None:
        self.threads = {"init": threading.get_ident()}

    def reset(self, seed=None):
        self.threads["reset"] = threading.get_ident()
        return "obs", {}

    def step(self, action):
        self.threads["step"] = threading.get_ident()
        return "obs", 0.0, True, False, {}

    def prepare(self) -> None:
        self.threads["prepare"] = threading.get_ident()

    def close(self) -> None:
        self.threads["close"] = threading.get_ident()


class InlineEnv(ThreadRecordingEnv):
    runs_inline = True


async def _episode(factory) -> dict[str, int]:
    with ThreadPoolExecutor(1) as pool:
        env = await build_prepared(factory, pool, timeout_s=5.0)
        await env.reset(1)
        await env.step("a")
        await env.close()
    return env.inner.threads


def test_an_inline_env_runs_every_call_on_the_loop_thread():
    threads = asyncio.run(_episode(InlineEnv))
    assert set(threads) == {"init", "prepare", "reset", "step", "close"}
    assert set(threads.values()) == {threading.get_ident()}  # asyncio.run's loop runs on this thread


def test_an_env_that_does_not_declare_it_keeps_its_thread_pool():
    threads = asyncio.run(_episode(ThreadRecordingEnv))
    assert threading.get_ident() not in threads.values()


def test_the_declaration_is_read_from_a_class_a_partial_or_an_instance():
    assert runs_inline(InlineEnv) and runs_inline(functools.partial(InlineEnv)) and runs_inline(InlineEnv())
    assert not runs_inline(ThreadRecordingEnv) and not runs_inline(functools.partial(ThreadRecordingEnv))
    assert runs_inline(MathEnv) and AsyncEnv(MathEnv())._inline
