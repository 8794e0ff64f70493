"""The environment protocol (GEM's shape) and a uniform async facade over sync or async envs.

An environment is any object with
    reset(seed: int | None = None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)
and optionally close(), prepare() and preload(seed). Each method may be a plain function or `async def`.
`prepare()` is the part of a reset that needs no seed (create a sandbox, start a process), `preload(seed)`
the part that does (write that seed's task files): the warm pool (`envs.warm_pool`) calls them ahead of
time — preload only for seeds it was told to expect — and `reset(seed)` must work whether they were called
or not, and return the same after `preload(seed)` as without it (a preload of another seed is undone). Observations are text;
the action is the model's whole response text (the env parses it, as GEM's envs do).

Conventions in `info` that the EnvManager reads (all optional):
- reset info `"reference"` (a dict: reference answer, hidden tests …) → `Trajectory.reference`, for the
  reward plane;
- reset info `"prompt_messages"` (a list of chat messages) → the first prompt is that chat under the chat
  template (a dataset row's `messages`, or its own system prompt), instead of the observation as one user
  message;
- reset info `"metrics"` (name → number) → the trajectory's `data/<name>` metrics (a dataset row's epoch);
- step info `"format_error"` (a message) → the action was malformed: the turn gets the domain's
  `format_penalty` instead of the env reward, and the episode goes on unless `end_on_format_error`.

`AsyncEnv` gives every env the same awaitable interface: async methods are awaited on the event loop,
sync ones run in the given thread pool so a CPU-heavy env never blocks the loop that drives many
trajectories — unless the env's class says `runs_inline = True`: its constructor and sync methods are quick,
pure Python that never block (the math domain's: a problem drawn from a seed, a `\boxed{}` found), so they run
on the loop itself, saving a thread-pool round trip per call (the hop cost more CPU than such a call); no
timeout can interrupt them there. Timeouts are the caller's (EnvManager) job. A thread cannot be stopped: a
sync call whose caller timed out or was cancelled runs on to its end, so `close()` first waits (at most
`CLOSE_WAITS_FOR_CALL_S`, then closes anyway) for such a call — a `prepare()` cut short by a shutdown, still
starting its container, must not set it on an env already closed, where nothing would ever remove it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from concurrent.futures import Executor
from typing import Any, Callable, Protocol, runtime_checkable

StepResult = tuple[str, float, bool, bool, dict[str, Any]]
ResetResult = tuple[str, dict[str, Any]]

REFERENCE_KEY = "reference"
PROMPT_MESSAGES_KEY = "prompt_messages"
METRICS_KEY = "metrics"
FORMAT_ERROR_KEY = "format_error"
INLINE_ATTR = "runs_inline"  # an env class's declaration that its calls are quick and never block (above)
CLOSE_WAITS_FOR_CALL_S = 5.0  # then close anyway: closing may be what unblocks a hung call (a killed subprocess)


@runtime_checkable
class Env(Protocol):
    """A text environment (GEM's interface). Methods may also be `async def`; `close` is optional."""

    def reset(self, seed: int | None = None) -> ResetResult: ...

    def step(self, action: str) -> StepResult: ...


EnvFactory = Callable[[], Any]  # builds a fresh Env


def runs_inline(env_or_factory: Any) -> bool:
    """Whether an env (or a factory: its class, or a `functools.partial` of it) declares `runs_inline = True`."""
    target = env_or_factory.func if isinstance(env_or_factory, functools.partial) else env_or_factory
    return getattr(target, INLINE_ATTR, False) is True


class AsyncEnv:
    """Awaitable reset/step/close over a sync or async env; sync calls run in `executor` (None = the
    loop's default thread pool). `inner` is the wrapped env (for expert/random actions)."""

    def __init__(self, env: Any, executor: Executor | None = None) -> None:
        for name in ("reset", "step"):
            if not callable(getattr(env, name, None)):
                raise TypeError(
                    f"{type(env).__name__} is not an environment: it has no {name}() method "
                    "(an env needs reset(seed) -> (obs, info) and step(action) -> (obs, reward, terminated, "
                    "truncated, info))"
                )
        self.inner = env
        self._executor = executor
        self._inline = runs_inline(env)
        self.staged_for: int | None = None  # the seed a warm pool ran `preload` for (its reset will find it done)
        self._running: asyncio.Future[Any] | None = None  # the sync call in the thread pool, if one is running

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        if self._inline:
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(self._executor, fn, *args)
        # shielded: a cancelled caller leaves the future to end with its thread, which close() waits for
        result = await asyncio.shield(self._running)
        if inspect.isawaitable(result):  # a sync wrapper around an async implementation
            result = await result
        return result

    async def reset(self, seed: int | None = None) -> ResetResult:
        out = await self._call(self.inner.reset, seed)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                f"{type(self.inner).__name__}.reset must return (observation, info); got {type(out).__name__}"
            )
        obs, info = out
        return str(obs), dict(info or {})

    async def step(self, action: str) -> StepResult:
        out = await self._call(self.inner.step, action)
        if not (isinstance(out, tuple) and len(out) == 5):
            raise TypeError(
                f"{type(self.inner).__name__}.step must return (observation, reward, terminated, truncated, "
                f"info); got {out!r:.200}"
            )
        obs, reward, terminated, truncated, info = out
        return str(obs), float(reward), bool(terminated), bool(truncated), dict(info or {})

    async def prepare(self) -> None:
        prepare = getattr(self.inner, "prepare", None)
        if callable(prepare):
            await self._call(prepare)

    async def preload(self, seed: int) -> None:
        preload = getattr(self.inner, "preload", None)
        if callable(preload):
            await self._call(preload, seed)
        self.staged_for = seed

    async def close(self) -> None:
        running = self._running
        if running is not None and not running.done():
            await asyncio.wait({running}, timeout=CLOSE_WAITS_FOR_CALL_S)
        close = getattr(self.inner, "close", None)
        if callable(close):
            await self._call(close)
