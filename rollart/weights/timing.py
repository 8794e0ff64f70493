"""The weight plane's two timings of a sync, by name: one constant each, for the writer and every reader.

- `time/weights.publish` — the trainer turning its weights into buckets in the object store (publisher).
- `time/weights.pull`    — a subscriber fetching one version's buckets and rebuilding the tensors.

The third, `time/weights.exposed` (the part of a sync that stops generation: from the RL loop's suspend to
its resume, i.e. waiting for a pull that has not finished yet plus the swap itself), is measured by the
loop (`rollart/loop/rl_loop.py`), not here.
"""

PUBLISH = "time/weights.publish"
PULL = "time/weights.pull"
