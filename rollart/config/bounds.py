"""The upper bounds of the config's counts, sizes and times, and the units of time they are written in.

In: nothing. Out: `HOUR_S`, `DAY_S`, `WEEK_S` and the `MAX_*` bounds the sections' fields are checked against.

Guarantee: each bound is far past what a real cluster uses (the paper's runs: 3,000+ GPUs, batches of
thousands), so a bound only catches a typo or a hostile run file before it costs anything.
"""

from __future__ import annotations

HOUR_S, DAY_S = 3600, 86_400
WEEK_S = 7 * DAY_S
MAX_WORKERS = 100_000  # actors (or worker slots) of one kind
MAX_THREADS = 4096  # threads, processes or CPUs on one machine
MAX_BATCH = 1_000_000  # trajectories, episodes or requests at once
MAX_TOKENS = 1 << 24  # tokens of one context (16 M)
MAX_VOCAB = 1 << 22
MAX_STEPS = 10_000_000
MAX_RETRIES = 100
MAX_MB = 1 << 20  # 1 TiB, in MiB
MAX_SEED = (1 << 32) - 1
MAX_ENTRIES = 1024  # named entries (pools, domains, roles), fallbacks, module names
MAX_SAMPLES = 1_000_000  # values of an empirical distribution
