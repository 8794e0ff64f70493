"""Background weight prefetch: pull the newest published version while the engine keeps generating.

In: a `rollart.types.WeightSubscriber` (the weights plane's, injected by the driver) and the version the
engine serves. Out: `take(version)` — that version's tensors, already pulled if the background thread
got them, else pulled now — and timing: how long pulls took in the background versus how long a swap
had to wait for one (the exposed part of a weight update).

Guarantees: only versions newer than the served one are pulled; at most one prefetched version is held
(a newer one replaces an older); a `take` of the version being pulled waits for that pull (bounded by
`wait_s`) instead of pulling it twice; the thread polls every `poll_s` seconds and stops on `close()`; a pull
that raises is recorded in `last_error` and retried at the next poll, never crashing the worker.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rollart.types import WeightSubscriber


class WeightPrefetcher:
    def __init__(
        self, subscriber: WeightSubscriber, served_version: int, poll_s: float = 0.5, wait_s: float = 300.0
    ) -> None:
        self._subscriber = subscriber
        self._served = served_version
        self._poll_s = poll_s
        self._wait_s = wait_s
        self._lock = threading.Condition()
        self._ready: tuple[int, dict[str, Any]] | None = None
        self._pulling: int | None = None
        self._stop = threading.Event()
        self.background_pull_s = 0.0
        self.background_pulls = 0
        self.exposed_pull_s = 0.0
        self.exposed_pulls = 0
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name="weight-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                latest = self._subscriber.latest_version()
                with self._lock:
                    if latest <= max(self._served, self._ready[0] if self._ready else -1):
                        continue
                    self._pulling = latest
                start = time.perf_counter()
                tensors = None
                try:
                    tensors = self._subscriber.pull(latest)
                finally:
                    with self._lock:  # publish and wake waiters in one critical section
                        self._pulling = None
                        if tensors is not None:
                            self.background_pull_s += time.perf_counter() - start
                            self.background_pulls += 1
                            if latest > self._served and (self._ready is None or latest > self._ready[0]):
                                self._ready = (latest, tensors)
                        self._lock.notify_all()
            except Exception as exc:  # noqa: BLE001 — reported in stats, retried at the next poll
                self.last_error = f"{type(exc).__name__}: {exc}"

    def take(self, version: int) -> dict[str, Any]:
        """Tensors of `version` (prefetched if available, else pulled now); marks it as served."""
        start = time.perf_counter()
        with self._lock:
            self._lock.wait_for(lambda: self._pulling != version, timeout=self._wait_s)
            ready = self._ready
            if ready is not None and ready[0] <= version:
                self._ready = None
            self._served = max(self._served, version)
        if ready is None or ready[0] != version:
            ready = (version, self._subscriber.pull(version))
            self.exposed_pulls += 1
        self.exposed_pull_s += time.perf_counter() - start
        return ready[1]

    def latest_version(self) -> int:
        return self._subscriber.latest_version()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def stats(self) -> dict[str, float]:
        with self._lock:
            ready = float(self._ready[0]) if self._ready else -1.0
        return {
            "prefetched_version": ready,
            "pull_s_background": self.background_pull_s,
            "pulls_background": float(self.background_pulls),
            "pull_s_exposed": self.exposed_pull_s,
            "pulls_exposed": float(self.exposed_pulls),
        }
