"""Ctrl-C stops a job within seconds at any phase (`rollart.base.interrupts.run`): waiting on the loop, running
synchronous code on it (starting Ray, placing workers, the warm start: asyncio's own handler let those run
on), or stuck in its teardown. Each case in a process of its own, signalled as a user's Ctrl-C is."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

JOB = textwrap.dedent("""
    import asyncio, os, signal, sys, threading, time
    from rollart.base import interrupts

    phase = sys.argv[1]

    async def busy():
        # another task's synchronous step on the loop's thread (an import in an HTTP call), Ctrl-C'd during it
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        await asyncio.sleep(60)

    async def job():
        try:
            if phase == "sync":
                time.sleep(60)  # synchronous code on the loop's thread
            elif phase == "child":
                child = asyncio.create_task(busy())  # an episode the job gathers later, say
                await asyncio.sleep(60)
            else:
                await asyncio.sleep(60)
            return "done"
        finally:
            print("cleanup", flush=True)
            if phase == "stuck":
                time.sleep(60)  # a teardown that hangs

    if phase not in ("none", "child"):
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        print(interrupts.run(job() if phase != "none" else asyncio.sleep(0, "value"), grace_s=2), flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    import gc; gc.collect()  # a task whose exception nobody read says so when it is collected
""")


@pytest.mark.parametrize("phase, bound_s", [("await", 5), ("sync", 5), ("child", 5), ("stuck", 8)])
def test_ctrl_c_stops_the_job_and_runs_its_cleanup(tmp_path, phase, bound_s):
    (tmp_path / "job.py").write_text(JOB)
    began = time.monotonic()
    out = subprocess.run([sys.executable, str(tmp_path / "job.py"), phase], capture_output=True, text=True,
                         timeout=60)
    took = time.monotonic() - began
    assert out.stdout.split() == ["cleanup", "interrupted"], out.stdout + out.stderr
    assert took <= bound_s, took  # asyncio.run: 60 s for "sync" (the sleep ran on), forever for "stuck"
    assert "Ctrl-C again to stop at once" in out.stderr
    # "child": the interrupt raised in another task's step left that task's KeyboardInterrupt to asyncio,
    # which printed it as an unhandled exception with its traceback
    assert "Traceback" not in out.stderr and "exception" not in out.stderr, out.stderr


def test_an_uninterrupted_job_returns_its_value(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    out = subprocess.run([sys.executable, str(tmp_path / "job.py"), "none"], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["value"], out.stdout + out.stderr


def test_a_cancelled_wait_on_many_calls_leaves_no_exception_unretrieved(caplog):
    """Ctrl-C cancels a job's task while it waits on many calls (an evaluation's episodes, a health check's
    probes): asyncio logs nothing (CPython 3.11's wait_for left the cancelled gather's exception
    unretrieved: "_GatheringFuture exception was never retrieved" and a traceback on the console)."""
    import asyncio
    import gc

    from rollart.resources.health import gather_alive

    async def job() -> None:
        task = asyncio.create_task(gather_alive({i: asyncio.sleep(30) for i in range(3)}, 20, lambda k, e: None))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(TimeoutError):  # and its bound still holds
            await gather_alive({0: asyncio.sleep(30)}, 0.05, lambda k, e: None)

    gc.collect()  # what earlier tests left: its logs are not this test's
    with caplog.at_level("ERROR", logger="asyncio"):
        asyncio.run(job())
        gc.collect()
    unretrieved = [r.getMessage() for r in caplog.records if "_GatheringFuture" in r.getMessage()]
    assert not unretrieved, unretrieved


def test_what_the_interrupt_brings_down_ends_the_job_as_an_interrupt(tmp_path):
    """A part of the job that dies of the same Ctrl-C (the trainer ranks share the terminal's process group) sees
    `interrupted()`, raises `Interrupted` instead of mending it, and the job ends with KeyboardInterrupt — not that
    error's traceback; `interrupted()` is false again once the job has stopped."""
    script = textwrap.dedent("""
        import asyncio, os, signal, threading
        from rollart.base import interrupts

        async def job():
            def rank_call():  # a train step in a thread, its rank killed by the same SIGINT
                os.kill(os.getpid(), signal.SIGINT)
                threading.Event().wait(0.5)
                if interrupts.interrupted():
                    raise interrupts.Interrupted("trainer rank 0 stopped with the job's Ctrl-C")
                return "rebuilt"
            return await asyncio.to_thread(rank_call)

        print("before", interrupts.interrupted(), flush=True)
        try:
            print(interrupts.run(job(), grace_s=5), flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        print("after", interrupts.interrupted(), flush=True)
    """)
    (tmp_path / "job.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "job.py")], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["before", "False", "interrupted", "after", "False"], out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
