"""Built-in `math` reward: is the final answer equal to the reference answer? (math-verify, time-bounded)

In: a trajectory whose `reference["answer"]` is the gold answer (a string or number, e.g. "42", "3/4",
"\\frac{1}{2}") and whose last action holds the model's answer (normally `\\boxed{...}`).
Out: `RewardOutput(1.0 or 0.0, details={"parsed": bool, "timeout": bool})` — 1.0 when math-verify finds
them equal. A malformed answer (nothing parseable) scores 0.0 with `parsed=False`; an answer that takes
longer than `timeout_s` to parse/verify scores 0.0 with `timeout=True`. A missing reference is an error
(the trajectory ends FAILED): the env, not the model, is at fault.

Why a process pool: math-verify bounds its own time with `signal.alarm`, which only works on a process's
main thread (it fails in async or threaded actors); a pool worker runs each job on its main thread, so math-verify's own timeouts work
there. On top, the caller waits at most `timeout_s` + 2 s; past that the pool's processes are killed and a
fresh pool is started, so a runaway sympy call can never hold a reward slot.

What never reaches the pool: an answer that is plainly one boxed integer against an integer gold
(`plain_verdict`), and a (gold, answer) pair math-verify has already decided in this instance — its verdicts
are kept, up to `VERDICTS_KEPT` pairs (least recently used forgotten), because a policy repeats its malformed
answers (a tiny model answering a math problem with a FrozenLake move, `\\boxed{Down}`, costs math-verify
5–10 ms of CPU each time). A time-out is never kept: the next call tries again.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rollart.reward.protocol import RewardInputError, RewardOutput, final_action
from rollart.types import Trajectory

_GRACE_S = 2.0
VERDICTS_KEPT = 4096  # (gold, answer) pairs whose math-verify verdict an instance remembers
_KEPT_ANSWER_CHARS = 1024  # longer answers are not kept (their keys would cost more memory than they save)
_INT = re.compile(r"[ \t\r\n]*(-?[0-9]{1,18})[ \t\r\n]*")  # ASCII digits and blanks only: nothing to interpret
_BOXED_INT = re.compile(r"[ \t\r\n]*\\boxed\{[ \t]*(-?[0-9]{1,18})[ \t]*\}[ \t\r\n]*")


def plain_verdict(gold: str, answer: str) -> dict[str, Any] | None:
    """`verify_answer`'s result without math-verify when it is plain: a bare integer gold answer and an answer
    that is exactly one `\\boxed{integer}` (whitespace around); None for anything else."""
    gold_int, boxed = _INT.fullmatch(gold), _BOXED_INT.fullmatch(answer)
    if gold_int is None or boxed is None:
        return None
    return {"correct": int(gold_int.group(1)) == int(boxed.group(1)), "parsed": True}


def verify_answer(gold: str, answer: str, timeout_s: int) -> dict[str, Any]:
    """Runs in a pool worker (main thread): math-verify's parse + verify with its own alarm timeouts."""
    from math_verify import parse, verify

    parsed_gold = parse(gold, parsing_timeout=timeout_s)
    if not parsed_gold:
        raise RewardInputError(f"math reward: reference answer {gold!r:.200} cannot be parsed by math-verify")
    parsed = parse(answer, parsing_timeout=timeout_s)
    if not parsed:
        return {"correct": False, "parsed": False}
    return {"correct": bool(verify(parsed_gold, parsed, timeout_seconds=timeout_s)), "parsed": True}


class MathReward:
    """`math`: async; one process pool of `workers` processes per instance, started on first use."""

    def __init__(self, timeout_s: float = 5.0, workers: int = 1) -> None:
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()  # see the module docstring

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn's resource tracker (a child of this process) goes with the job's other processes when a
                # job is stopped (Ctrl-C); a pool made after that relaunches it with a UserWarning on the console
                # ("process died unexpectedly") that says nothing about the run: that one line is not shown
                warnings.filterwarnings("ignore", message="resource_tracker: process died unexpectedly",
                                        category=UserWarning)
                # spawn: never fork a process that may hold threads (Serve replicas, the driver's loop)
                self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    def _kill_pool(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()  # a worker stuck in sympy ignores a polite shutdown
            pool.shutdown(wait=False, cancel_futures=True)

    def warm(self) -> None:
        """Start the pool and import math-verify in it now (a replica does this before taking requests)."""
        self._executor().submit(verify_answer, "1", "1", 5).result(timeout=120)

    async def __call__(self, trajectory: Trajectory) -> RewardOutput:
        gold = trajectory.reference.get("answer")
        if gold is None or str(gold).strip() == "":
            raise RewardInputError(
                f"math reward: trajectory {trajectory.trajectory_id} has no reference['answer'] "
                f"(reference keys: {sorted(trajectory.reference)})"
            )
        answer = final_action(trajectory)
        if not answer.strip():
            return RewardOutput(0.0, details={"parsed": False, "timeout": False})
        plain = plain_verdict(str(gold), answer)
        if plain is not None:
            return RewardOutput(1.0 if plain["correct"] else 0.0, details={"parsed": True, "timeout": False})
        key = (str(gold), answer)
        if (kept := self._kept(key)) is not None:
            return RewardOutput(1.0 if kept["correct"] else 0.0, details={"parsed": kept["parsed"], "timeout": False})
        loop = asyncio.get_running_loop()
        bound = max(1, int(round(self.timeout_s)))
        try:
            fut = loop.run_in_executor(self._executor(), verify_answer, str(gold), answer, bound)
            result = await asyncio.wait_for(fut, self.timeout_s + _GRACE_S)
        except asyncio.TimeoutError:
            self._kill_pool()
            return RewardOutput(0.0, details={"parsed": True, "timeout": True})
        except BrokenProcessPool:
            self._kill_pool()
            raise RuntimeError("math reward: its worker process died; a fresh pool is started for the next call")
        if len(answer) <= _KEPT_ANSWER_CHARS:
            self._keep(key, result)
        return RewardOutput(1.0 if result["correct"] else 0.0, details={"parsed": result["parsed"], "timeout": False})

    def _kept(self, key: tuple[str, str]) -> dict[str, Any] | None:
        with self._lock:  # (an instance may serve several threads: a Serve replica's)
            result = self._verdicts.get(key)
            if result is not None:
                self._verdicts.move_to_end(key)
            return result

    def _keep(self, key: tuple[str, str], result: dict[str, Any]) -> None:
        with self._lock:
            self._verdicts[key] = result
            if len(self._verdicts) > VERDICTS_KEPT:
                self._verdicts.popitem(last=False)

    def close(self) -> None:
        self._kill_pool()
