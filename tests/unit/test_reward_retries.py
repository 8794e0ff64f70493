"""The reward clients' retry loop (`_Tries`), on scripted tries: `reward.retries` bounds the failures the
service answers; the tries an outage took (timeouts, refused connections) do not use them up."""

from __future__ import annotations

import asyncio

from rollart.config import RewardConfig
from rollart.reward.client import BackendStats, _Tries
from rollart.types import Task, Trajectory

TRAJ = Trajectory("t0", Task("k", "d", "d", 0, "g"), 0, ())
OUTAGE = (None, True, "timeout after 1.0s", True, None)  # (result, retryable, error, outage, fault)
ANSWERED_500 = (None, True, "HTTP 500: reward failed", False, None)
OK = ({"reward": 1.0, "details": {}}, False, "", False, None)


def run(script, retries=3, outage_budget_s=60.0, on_outage=True):
    cfg = RewardConfig(retries=retries, backoff_s=0.0, backoff_max_s=0.0, outage_budget_s=outage_budget_s)
    waited = []

    async def wait_out() -> None:
        waited.append(1)

    tries = _Tries(cfg, BackendStats(), seed=0, on_outage=wait_out if on_outage else None)
    steps = iter(script)

    async def attempt():
        return next(steps)

    return asyncio.run(tries.run(TRAJ, "serverless", attempt)), len(waited)


def test_an_answer_to_retry_after_an_outage_that_used_up_the_retries_is_retried():
    result, waited = run([OUTAGE] * 6 + [ANSWERED_500, OK], retries=3)
    assert result.ok and result.attempts == 8 and waited == 3  # tries 5, 6 and 7 waited the outage out


def test_the_failures_the_service_answers_are_bounded_by_the_retries():
    result, _ = run([ANSWERED_500] * 4 + [OK], retries=3)
    assert not result.ok and result.attempts == 4 and "HTTP 500" in result.error
    result, _ = run([OUTAGE, ANSWERED_500, OUTAGE, ANSWERED_500, ANSWERED_500, ANSWERED_500, OK], retries=3)
    assert not result.ok and result.attempts == 6  # four answered failures: one more than the retries allow


def test_without_an_outage_handler_an_outage_ends_at_the_retries():
    result, waited = run([OUTAGE] * 5 + [OK], retries=3, on_outage=False)
    assert not result.ok and result.attempts == 4 and waited == 0
