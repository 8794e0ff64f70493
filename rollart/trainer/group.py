"""`TrainerGroup`: the driver's one handle on N data-parallel trainer actors.

In: the `RunConfig` (`train.workers` ranks, `roles.trainer` may override the `train` pool), the resource
plane's `Resources` (it places the actors), the policy `Objective` (`rollart.algo.PolicyObjective`) and the
weight store's `WeightPublisher`; optionally a checkpoint to resume from. Out: `train_step`, `sft_step`
(metrics of rank 0, after checking every rank agrees), `save_checkpoint`, `version`, `extra_state`.

    group = TrainerGroup(cfg, rt.resources, PolicyObjective.from_config(cfg.train), store.publisher(),
                         checkpoint=latest_checkpoint(cfg.run_dir) if cfg.resume else None)

Guarantees: at construction the weights of `group.version` (0, or the checkpoint's) are published; every
step publishes the next version before it returns; every call is bounded by `train.timeout_s`; ranks that
disagree on loss or version are an error, never averaged away.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Mapping, Sequence

import ray

from rollart.config import RunConfig
from rollart.resources.placement import Resources
from rollart.trainer import checkpoint as ckpt
from rollart.trainer.objective import Objective
from rollart.trainer.worker import TrainerWorker
from rollart.types import TrainBatch, TrainSample, WeightPublisher


class TrainerGroup:
    def __init__(
        self,
        cfg: RunConfig,
        resources: Resources,
        objective: Objective,
        publisher: WeightPublisher,
        *,
        checkpoint: str | Path | None = None,
    ) -> None:
        self.cfg = cfg
        n = cfg.train.workers
        ranks = itertools.count()
        self.cluster = resources.place(
            TrainerWorker,
            replicas=n,
            args=(cfg, objective, publisher),
            worker_kwargs=lambda p: {"rank": next(ranks), "world_size": n, "name": p.worker, "device": p.device},
            call_timeout_s=cfg.train.timeout_s,
        )
        try:
            meet = self.cluster.gather([self.cluster.call_one(0, "rendezvous")])[0]
            one_node = all(other == meet["node"] for other in self.cluster.gather(self.cluster.call_all("node_id")))
            init_method = meet["file"] if one_node else meet["tcp"]
            ready = self.cluster.gather(self.cluster.call_all("setup", init_method,
                                                              str(checkpoint) if checkpoint else None))
        except BaseException:
            self.cluster.shutdown()
            raise
        self.version: int = self._agree(ready, "version")
        self.extra_state: dict[str, Any] = ready[0]["extra_state"] or {}
        self.setup_metrics: dict[str, float] = {k: v for k, v in ready[0].items()
                                                if k not in ("version", "extra_state")}

    @property
    def names(self) -> list[str]:
        return self.cluster.names

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One RL step on every rank (the batch is put in the object store once); publishes version + 1."""
        ref = ray.put(batch)
        results = self.cluster.gather(self.cluster.call_all("train_step", ref))
        self._agree(results, "train/loss")
        self.version = int(self._agree(results, "train/version"))
        return results[0]

    def sft_step(self, data: Sequence[TrainSample | Sequence[Mapping[str, str]]]) -> dict[str, float]:
        """One supervised step (samples or chat conversations); publishes version + 1."""
        ref = ray.put(list(data))
        results = self.cluster.gather(self.cluster.call_all("sft_step", ref))
        self._agree(results, "sft/loss")
        self.version = int(self._agree(results, "train/version"))
        return results[0]

    def save_checkpoint(self, extra_state: Mapping[str, Any] | None = None) -> Path:
        """Write RUN_DIR/checkpoints/step_<version> (complete or absent), keep the newest K; its path."""
        final = ckpt.step_path(self.cfg.run_dir, self.version).resolve()
        tmp = ckpt.temporary_path(final)
        self.cluster.gather(self.cluster.call_all("save_checkpoint", str(tmp), dict(extra_state or {})))
        keep = self.cfg.train.keep_checkpoints
        return Path(self.cluster.gather([self.cluster.call_one(0, "finalize_checkpoint", str(tmp), str(final), keep)])[0])

    def weights(self, rank: int = 0) -> dict[str, Any]:
        """A copy of one rank's weights (for checks)."""
        return self.cluster.gather([self.cluster.call_one(rank, "weights")])[0]

    def close(self) -> None:
        self.cluster.shutdown()

    def __enter__(self) -> TrainerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _agree(self, results: list[dict[str, Any]], key: str) -> Any:
        values = [r[key] for r in results]
        if any(v != values[0] for v in values):
            raise RuntimeError(f"trainer ranks disagree on {key}: {dict(zip(self.names, values))}")
        return values[0]
