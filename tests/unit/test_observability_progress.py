"""Live progress: the status line, and each mode's output with and without a terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rollart.observability import Progress
from rollart.observability.progress import format_duration, status_line

METRICS = {"time/step": 2.5, "buffer/staleness_mean": 0.5, "env/math/reward": 0.25,
           "env/frozenlake/reward": 0.125, "env/math/success": 1.0, "eval/mean": 0.3}


def test_status_line_shows_step_eta_time_staleness_and_reward_per_domain():
    line = status_line(3, 40, METRICS, eta_s=83)
    assert line == ("step 3/40 | eta 1m23s | step 2.50s | stale 0.50 | "
                    "reward frozenlake=0.125 math=0.250 | eval 0.300")
    assert status_line(1, 2, {}, None) == "step 1/2 | eta ?"
    assert format_duration(7322) == "2h02m" and format_duration(5) == "5s"


def test_plain_mode_prints_one_line_per_step_with_eta(monkeypatch):
    clock = iter([0.0, 10.0, 30.0])  # construction, step 11, step 12 (a run resumed at step 10)
    monkeypatch.setattr("rollart.observability.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    untimed = {k: v for k, v in METRICS.items() if k != "time/step"}
    p = Progress("plain", file=out)
    p.update(11, 20, untimed)
    p.update(12, 20, untimed)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[rollart] step 11/20 | eta 1m30s")  # 10 s/step × 9 left
    assert lines[1].startswith("[rollart] step 12/20 | eta 2m00s")  # 15 s/step × 8 left


def test_the_eta_leaves_out_what_came_before_the_first_step(monkeypatch):
    # 60 s of start-up, warm start and first evaluation, then steps of 2.5 s: the ETA is 2.5 s × steps left
    clock = iter([0.0, 62.5, 65.0])
    monkeypatch.setattr("rollart.observability.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    with Progress("plain", file=out) as p:
        p.update(1, 11, {**METRICS, "time/startup": 60.0})
        p.update(2, 11, {**METRICS, "time/step": 3.5})
    first, second = out.getvalue().splitlines()
    assert first.startswith("[rollart] step 1/11 | eta 25s | step 2.50s")  # not 62.5 s × 10 = 10m25s
    assert second.startswith("[rollart] step 2/11 | eta 27s")  # 3.0 s/step × 9 left


def test_quiet_mode_prints_nothing():
    out = io.StringIO()
    with Progress("quiet", file=out) as p:
        p.update(1, 3, METRICS)
    assert out.getvalue() == ""


def test_rich_mode_without_a_terminal_falls_back_to_plain_lines():
    out = io.StringIO()  # not a TTY: CI logs, pipes
    with Progress("rich", file=out) as p:
        assert p.mode == "plain"
        p.update(1, 2, METRICS)
    assert out.getvalue().startswith("[rollart] step 1/2")


def test_rich_mode_on_a_terminal_draws_the_bar():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with Progress("rich", console=console) as p:
        assert p.mode == "rich"
        p.update(2, 4, METRICS)
    text = out.getvalue()
    assert "2/4" in text and "reward frozenlake=0.125 math=0.250" in text


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="'loud' is not one of rich, plain, quiet"):
        Progress("loud")
