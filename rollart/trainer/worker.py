"""`TrainerWorker`: the Ray actor around one `Trainer` rank, placed on the `train` pool.

In: the `RunConfig`, the injected `Objective` and `WeightPublisher` (the trainer never imports the algo or
weights planes), this rank, the world size, its worker name and torch device (from its placement).
Out: the `Trainer`'s steps and checkpoints as actor methods; rank 0 publishes the weights after every
update (and at setup: version 0, or the version a checkpoint restored), other ranks hold the same weights.

Life: constructed cheaply by the resource plane, then `rendezvous` (rank 0 names a TCP port),
`setup(host, port, checkpoint)` (process group — gloo on CPU, NCCL on CUDA — the model, the optional
checkpoint), then steps. Every collective has the `train.timeout_s` bound.
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from rollart.config import RunConfig
from rollart.resources.affinity import affinity
from rollart.trainer import checkpoint as ckpt
from rollart.trainer.core import Trainer
from rollart.trainer.objective import Objective
from rollart.types import TrainBatch, TrainSample, WeightPublisher


@affinity("train", role="trainer")
class TrainerWorker:
    def __init__(
        self,
        cfg: RunConfig,
        objective: Objective,
        publisher: WeightPublisher,
        *,
        rank: int,
        world_size: int,
        name: str = "",
        device: str = "cpu",
    ) -> None:
        self.cfg, self.objective, self.publisher = cfg, objective, publisher
        self.rank, self.world_size, self.name = rank, world_size, name or f"trainer/train/{rank}"
        self.device = device or "cpu"
        self.trainer: Trainer | None = None

    def rendezvous(self) -> tuple[str, int, str]:
        """(this node's IP, a free TCP port, Ray node id): where the other ranks meet rank 0."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port, ray.get_runtime_context().get_node_id()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def setup(self, host: str, port: int, checkpoint: str | None = None) -> dict[str, Any]:
        """Join the process group, build the model, load `checkpoint` if given, rank 0 publishes."""
        if self.world_size > 1:
            dist.init_process_group(
                backend="nccl" if self.device.startswith("cuda") else "gloo",
                init_method=f"tcp://{host}:{port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.cfg.train.timeout_s),
            )
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
        self.trainer = Trainer(self.cfg, self.objective, rank=self.rank, world_size=self.world_size,
                               device=self.device)
        extra = self.trainer.load(checkpoint) if checkpoint else {}
        metrics = self.publish()
        return {"version": self.trainer.version, "extra_state": extra if self.rank == 0 else None, **metrics}

    def publish(self) -> dict[str, float]:
        """Rank 0 publishes the current weights under the current version; other ranks do nothing."""
        if self.rank != 0:
            return {}
        return dict(self.publisher.publish(self._t().version, self._t().state_dict()))

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return self._t().train_step(batch) | self.publish()

    def sft_step(self, data: Sequence[TrainSample | Sequence[Mapping[str, str]]]) -> dict[str, float]:
        return self._t().sft_step(data) | self.publish()

    def save_checkpoint(self, directory: str, extra_state: Mapping[str, Any] | None) -> None:
        self._t().save(directory, extra_state)

    def finalize_checkpoint(self, tmp: str, final: str, keep: int) -> str:
        return str(ckpt.finalize(Path(tmp), Path(final), keep))

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of this rank's weights (for checks; the store is the path for serving)."""
        return {k: v.detach().cpu().clone() for k, v in self._t().state_dict().items()}

    def _t(self) -> Trainer:
        if self.trainer is None:
            raise RuntimeError(f"{self.name}: setup() was not called")
        return self.trainer
