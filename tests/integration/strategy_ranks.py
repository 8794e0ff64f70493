"""Trainer ranks as plain processes (no Ray) for the strategy tests: `spawn(world, jobs)` starts `world` ranks
on one gloo process group, runs the jobs in order on every rank and returns rank 0's results.

A job is (kind, tag, options): "steps" trains `steps` RL steps from the model (or from `resume`, a
checkpoint, loaded first) and returns each step's loss and grad norm, the full weights and AdamW moments
right after the load and at the end; `save_after` writes a checkpoint (and those tensors, `-saved`) after
that many steps. Tensors come back through
safetensors files in the job directory, nothing is pickled but plain numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from trainer_helpers import synthetic_batch


def config(model_path: str, **train: Any):
    """The trainer's config with room for `train.workers` ranks on its pool."""
    from rollart.config import PoolConfig, RunConfig, default_pools

    pools = {**default_pools(), "train": PoolConfig(kind="cpu", capacity=train.get("workers", 1))}
    return RunConfig(model={"path": model_path}, pools=pools, train=train)


def run_steps(rank: int, world: int, out: Path, model_path: str, tag: str, steps: int = 3, resume: str = "",
              save_after: int = -1, start: int = 0, **train: Any) -> dict[str, Any]:
    from rollart.algo import PolicyObjective
    from rollart.trainer import Trainer

    cfg = config(model_path, workers=world, **train)
    trainer = Trainer(cfg, PolicyObjective.of(cfg), rank=rank, world_size=world)
    if resume:
        trainer.load(resume)
    loaded = snapshot(trainer)
    result: dict[str, Any] = {"loss": [], "grad_norm": []}
    for step in range(start, start + steps):
        if step == save_after:
            trainer.save(out / f"{tag}-ckpt", {"step": step})
            saved = snapshot(trainer)
            if rank == 0:
                save_file(saved, str(out / f"{tag}-saved.safetensors"))
        metrics = trainer.train_step(synthetic_batch(version=trainer.version, seed=step))
        result["loss"].append(metrics["train/loss"])
        result["grad_norm"].append(metrics["train/grad_norm"])
    final = snapshot(trainer)
    if rank == 0:
        save_file(loaded, str(out / f"{tag}-loaded.safetensors"))
        save_file(final, str(out / f"{tag}-final.safetensors"))
        master = {str(p.dtype) for p in trainer.trainable()}
        (out / f"{tag}.json").write_text(json.dumps(result | {"master_dtypes": sorted(master)}))
    return result


def snapshot(trainer) -> dict[str, torch.Tensor]:
    """The full weights and AdamW moments (`optimizer/<name>/<key>`), and a critic's weights (`critic/<name>`),
    gathered on every rank."""
    out = {k: v.contiguous() for k, v in trainer.state_dict().items()}
    if trainer.critic is not None:
        from rollart.trainer.critic import critic_entries

        for entry in critic_entries(trainer.critic.module):
            out[f"critic/{entry.name}"] = trainer.strategy.full(entry.tensor.detach()).clone().contiguous()
    for name, param in trainer._named_trainable():
        for key, value in trainer.optimizer.state.get(param, {}).items():
            out[f"optimizer/{name}/{key}"] = trainer.strategy.full(value).detach().clone().contiguous()
    return out


def _rank(rank: int, world: int, store: str, out: str, model_path: str, jobs: list) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        for kind, tag, options in jobs:
            assert kind == "steps", kind
            run_steps(rank, world, Path(out), model_path, tag, **options)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(world: int, out: Path, model_path: str, jobs: list) -> None:
    """Run `jobs` on `world` fresh rank processes (results in `out`, read them with `result`)."""
    out.mkdir(parents=True, exist_ok=True)
    store = out / f"store-{world}"
    mp.spawn(_rank, args=(world, str(store), str(out), model_path, jobs), nprocs=world, join=True)


def result(out: Path, tag: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(losses and grad norms, weights and moments after the load, final ones) of a job."""
    return (json.loads((out / f"{tag}.json").read_text()), load_file(str(out / f"{tag}-loaded.safetensors")),
            load_file(str(out / f"{tag}-final.safetensors")))
