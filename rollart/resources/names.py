"""The two names the resource plane gives things: a pool's Ray custom resource and a worker's name.

In: a pool name; a role, pool and index. Out: strings. Guaranteed: these are the only places the
formats are written, so `ray start --resources`, the test Ray (tests/conftest.py) and the placement code
always agree.
"""

from __future__ import annotations

POOL_RESOURCE_PREFIX = "pool_"


def pool_resource(pool: str) -> str:
    """The Ray custom resource that stands for pool `pool` (e.g. `gen_prefill` → `pool_gen_prefill`)."""
    return f"{POOL_RESOURCE_PREFIX}{pool}"


def worker_name(role: str, pool: str, index: int) -> str:
    """A worker's name in spans and metrics: `<role>/<pool>/<index>`, e.g. `inference/gen_prefill/0`."""
    return f"{role}/{pool}/{index}"
