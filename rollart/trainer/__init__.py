"""The training plane: data-parallel trainer ranks under a parallelism strategy (torch FSDP2 or DDP), packed
micro-batches, chunked log-probs, checkpoints that any number of ranks resumes.

Driver API: `TrainerRanks` (ranks.py), `latest_checkpoint` (checkpoint.py). The loss is injected (an
`Objective`, e.g. `rollart.algo.PolicyObjective`) and so is the weight publisher
(`rollart.types.WeightPublisher`): this package imports neither the algo nor the weights plane.
`Trainer` (core.py) is the Ray-free rank, usable directly in tests and single-process tools.
"""

from rollart.trainer.checkpoint import latest_checkpoint, list_checkpoints
from rollart.trainer.core import Trainer
from rollart.trainer.ranks import TrainerFailed, TrainerRanks
from rollart.trainer.objective import Objective
from rollart.trainer.worker import TrainerWorker

__all__ = ["Objective", "Trainer", "TrainerFailed", "TrainerRanks", "TrainerWorker", "latest_checkpoint",
           "list_checkpoints"]
