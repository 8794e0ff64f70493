"""WeightPrefetcher: background pull of the newest version, no double pull, exposed vs background time."""

from __future__ import annotations

import threading
import time


from rollart.inference.prefetch import WeightPrefetcher
from testutil import wait_until


class SlowSubscriber:
    def __init__(self, latest: int, delay_s: float = 0.0, fail_first: bool = False) -> None:
        self.latest = latest
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.pulls: list[int] = []
        self.pulling = threading.Event()

    def latest_version(self) -> int:
        return self.latest

    def pull(self, version: int) -> dict[str, int]:
        self.pulls.append(version)
        self.pulling.set()
        if self.fail_first:
            self.fail_first = False
            raise ConnectionError("store unreachable")
        time.sleep(self.delay_s)
        return {"w": version}



def test_prefetched_version_is_taken_without_an_exposed_pull():
    sub = SlowSubscriber(latest=3)
    pre = WeightPrefetcher(sub, served_version=0, poll_s=0.01)
    try:
        wait_until(lambda: pre.stats()["prefetched_version"] == 3)
        assert pre.take(3) == {"w": 3}
        s = pre.stats()
        assert sub.pulls == [3] and s["pulls_background"] == 1 and s["pulls_exposed"] == 0
        assert s["prefetched_version"] == -1
        time.sleep(0.05)
        assert sub.pulls == [3]  # nothing newer than what is served: no further pull
    finally:
        pre.close()


def test_take_waits_for_the_pull_in_progress_instead_of_pulling_twice():
    sub = SlowSubscriber(latest=1, delay_s=0.3)
    pre = WeightPrefetcher(sub, served_version=0, poll_s=0.01)
    try:
        assert sub.pulling.wait(5)
        assert pre.take(1) == {"w": 1}
        assert sub.pulls == [1] and pre.stats()["pulls_exposed"] == 0
        assert pre.stats()["pull_s_exposed"] > 0  # the wait for the unfinished pull was exposed time
    finally:
        pre.close()


def test_version_not_prefetched_is_pulled_on_demand_and_errors_are_retried():
    sub = SlowSubscriber(latest=0, fail_first=True)
    pre = WeightPrefetcher(sub, served_version=0, poll_s=0.01)
    try:
        sub.latest = 2
        wait_until(lambda: pre.stats()["prefetched_version"] == 2)  # the first pull failed, the next one worked
        assert "ConnectionError: store unreachable" in pre.last_error
        assert pre.take(4) == {"w": 4} and pre.stats()["pulls_exposed"] == 1
    finally:
        pre.close()


def test_close_stops_the_thread():
    pre = WeightPrefetcher(SlowSubscriber(latest=0), served_version=0, poll_s=0.01)
    pre.close()
    assert not pre._thread.is_alive()
