"""The three timings of a weight sync, by name, and a helper for the one only the swapper can measure.

- `time/weights.publish` — the trainer turning its weights into buckets in the object store (publisher).
- `time/weights.pull`    — a subscriber fetching one version's buckets and rebuilding the tensors.
- `time/weights.exposed` — the part of a sync that stops generation: from the moment an inference worker
  stops for the update (suspend) until it generates again, i.e. waiting for a pull that has not finished
  yet plus the swap itself. With the pull overlapped with rollout this is ≈ the swap alone; with a naive
  synchronous push-then-pull it is publish + pull + swap.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, MutableMapping

PUBLISH = "time/weights.publish"
PULL = "time/weights.pull"
EXPOSED = "time/weights.exposed"


@contextmanager
def exposed_timer(metrics: MutableMapping[str, float]) -> Iterator[None]:
    """Wrap exactly the span during which generation is stopped for a sync; adds `time/weights.exposed`.

    >>> m = {}
    >>> with exposed_timer(m):
    ...     pass  # e.g. tensors = subscriber.pull(v); engine.update_weights(v, tensors)
    >>> EXPOSED in m
    True
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics[EXPOSED] = metrics.get(EXPOSED, 0.0) + time.perf_counter() - start
