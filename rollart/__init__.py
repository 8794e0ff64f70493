"""rollart: disaggregated, multi-task, agentic RL training of LLMs.

The public API is imported lazily so that `rollart --help` and config checks start fast (no torch or Ray
import until something needs them).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "RunConfig": "rollart.config",
    "load_config": "rollart.config.loader",
    "ConfigError": "rollart.config.loader",
    "train": "rollart.job.driver",  # train(cfg) -> summary dict (blocking)
    "evaluate": "rollart.job.driver",  # evaluate(cfg) -> Evaluation (scores, scored, failed) of cfg.model.path
    "affinity": "rollart.resources.affinity",  # @affinity(pool, fallback=[...], role=...)
    "Runtime": "rollart.resources.runtime",
}


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rollart' has no attribute {name!r}")
