"""A trainer's checkpoint, written and read back: `save_checkpoint(trainer, dir, extra)` / `load_checkpoint`.

In: a `Trainer` (core.py) and a checkpoint directory. Out: the files checkpoint.py describes — the exported
weights, the KL reference, each optimizer's rows, a critic's weights and optimizer (critic.py), the RNG
states, the trainer state and the driver's `extra_state` — and, loading, all of it restored from a checkpoint
written with any number of ranks and either strategy. Every rank calls both, in step (gathers and writes are
collectives under fsdp2). (`trainer` is typed Any: core.py imports this module, not the other way round.)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from rollart.models.lora import ADAPTER_WEIGHTS
from rollart.trainer import checkpoint as ckpt
from rollart.trainer.policy import load_weights
from rollart.trainer.tensor_files import TensorReader

log = logging.getLogger("rollart.trainer")


def save_checkpoint(trainer: Any, path: Path, extra_state: Mapping[str, Any] | None) -> None:
    """Write this rank's part of a checkpoint into `path`."""
    path.mkdir(parents=True, exist_ok=True)
    ckpt.save_rng(path, trainer.rank)
    trainer.export(path)
    if trainer.ref_policy is not None:  # a LoRA run's reference differs from the base by its adapter only
        trainer._write_tensors(path / ckpt.REFERENCE_FILE, ("adapter" if trainer.lora is not None else "base",),
                               trainer.ref_policy)
    named = trainer._named_trainable()
    ckpt.save_optimizer_shard(path / ckpt.OPTIMIZER, trainer.rank, named, trainer.optimizer, trainer.strategy)
    if trainer.sft_optimizer is not None:
        ckpt.save_optimizer_shard(path / ckpt.SFT_OPTIMIZER, trainer.rank, named, trainer.sft_optimizer,
                                  trainer.strategy)
    critic_state = trainer.critic.save(path) if trainer.critic is not None and trainer.critic.ready else {}
    if trainer.rank != 0:
        return
    ckpt.save_extra(path, dict(extra_state or {}))
    ckpt.save_trainer_state(path, {
        "version": trainer.version,
        "world_size": trainer.world_size,
        "strategy": trainer.strategy.name,
        "scheduler": trainer.scheduler.state_dict(),
        "optimizer": ckpt.param_groups(trainer.optimizer, named),
        "sft_optimizer": ckpt.param_groups(trainer.sft_optimizer, named) if trainer.sft_optimizer else None,
        **critic_state,
    })


def load_checkpoint(trainer: Any, path: Path) -> dict[str, Any]:
    """Restore `trainer` from the checkpoint at `path`; returns its `extra_state`."""
    ckpt.check_checkpoint_files(path)
    state = ckpt.load_trainer_state(path, trainer.device)
    lora = trainer.lora is not None
    if lora:  # a PEFT adapter directory: the base is model.path, unchanged
        adapter = TensorReader.of_files([path / ADAPTER_WEIGHTS])
        load_weights(trainer.policy, trainer.strategy, {"adapter": adapter}, lora, kinds=("adapter",))
    else:
        load_weights(trainer.policy, trainer.strategy, {"base": TensorReader.of_checkpoint(path)}, lora,
                     kinds=("base",))
    named = trainer._named_trainable()
    ckpt.load_optimizer(path / ckpt.OPTIMIZER, state["optimizer"], named, trainer.optimizer, trainer.strategy)
    trainer.scheduler.load_state_dict(state["scheduler"])
    if state["sft_optimizer"] is not None:
        trainer.sft_optimizer = trainer._sft_optimizer()
        ckpt.load_optimizer(path / ckpt.SFT_OPTIMIZER, state["sft_optimizer"], named, trainer.sft_optimizer,
                            trainer.strategy)
    trainer.version = int(state["version"])
    reference = path / ckpt.REFERENCE_FILE
    if trainer.objective.uses_reference and not reference.is_file():
        log.warning("%s holds no KL reference (written with kl_coef=0?): the reference becomes the weights "
                    "at the next RL step, not the ones this run started RL from", path)
    if reference.is_file():
        trainer.ref_policy = trainer._frozen_copy()
        kind = "adapter" if lora else "base"
        load_weights(trainer.ref_policy, trainer.strategy, {kind: TensorReader.of_files([reference])}, lora,
                     kinds=(kind,))
    if trainer.critic is not None:
        trainer.critic.load(path, state)
    ckpt.load_rng(path, trainer.rank)  # a rank the checkpoint did not have keeps its seeded RNG
    return ckpt.load_extra(path)
