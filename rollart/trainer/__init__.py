"""The training plane: data-parallel trainer ranks under a parallelism strategy (torch FSDP2 or DDP), packed
micro-batches, chunked log-probs, checkpoints that any number of ranks resumes.

Driver API: `TrainerRanks` (ranks.py), `latest_checkpoint` (checkpoint.py). The loss is injected (an
`Objective`, e.g. `rollart.algo.PolicyObjective`) and so is the weight publisher
(`rollart.types.WeightPublisher`): this package imports neither the algo nor the weights plane.
`Trainer` (core.py) is the Ray-free rank, usable directly in tests and single-process tools: the Ray-bound names
(`TrainerRanks`, `TrainerFailed`, `TrainerWorker`) are imported on first use, so a process without Ray — the GPU
checks of benchmarks/gpu/ on a machine that has none — imports `Trainer` alone.
"""

from typing import TYPE_CHECKING, Any

from rollart.trainer.checkpoint import latest_checkpoint, list_checkpoints
from rollart.trainer.core import Trainer
from rollart.trainer.objective import Objective

if TYPE_CHECKING:
    from rollart.trainer.ranks import TrainerFailed, TrainerRanks
    from rollart.trainer.worker import TrainerWorker

__all__ = ["Objective", "Trainer", "TrainerFailed", "TrainerRanks", "TrainerWorker", "latest_checkpoint",
           "list_checkpoints"]


_RAY_BOUND = {"TrainerRanks": "ranks", "TrainerFailed": "ranks", "TrainerWorker": "worker"}


def __getattr__(name: str) -> Any:
    """The Ray-bound names, imported when first asked for."""
    if name in _RAY_BOUND:
        import importlib

        return getattr(importlib.import_module(f"rollart.trainer.{_RAY_BOUND[name]}"), name)
    raise AttributeError(f"module 'rollart.trainer' has no attribute {name!r}")
