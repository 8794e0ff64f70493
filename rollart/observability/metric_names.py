"""Metric names: `<namespace>/<name>`, with the namespaces below (where the files go: `rollart.base.run_dir`).

Guarantees: `check_metric_name` accepts exactly `<namespace>/<name>` with a namespace of `NAMESPACES`, so
a typo fails at the first step with the list of valid namespaces instead of producing a silent new curve.
"""

from __future__ import annotations

# Metric namespaces. `weights/*` carries what a WeightPublisher returns (bytes, buckets).
NAMESPACES: tuple[str, ...] = (
    "time", "rollout", "env", "eval", "reward", "train", "buffer", "pools", "system", "weights", "profile",
)
RESERVED_KEYS = ("step", "wall_s", "time")


def check_metric_name(name: str) -> None:
    """Raise ValueError unless `name` is `<namespace>/<name>` with a known namespace."""
    ns, sep, rest = name.partition("/")
    if not sep or not rest or ns not in NAMESPACES:
        raise ValueError(
            f"metric name '{name}' must be '<namespace>/<name>' with a namespace of {list(NAMESPACES)}"
        )
