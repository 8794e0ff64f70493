"""`TrainerWorker`: the Ray actor around one `Trainer` rank, placed on the `train` pool.

In: the `RunConfig`, the injected `Objective` and `WeightPublisher` (the trainer never imports the algo or
weights planes), this rank, the world size, its worker name and torch device (from its placement).
Out: the `Trainer`'s steps and checkpoints as actor methods; rank 0 publishes the weights (a LoRA run:
the adapter alone) after every update (and at setup: version 0, or the version a checkpoint restored) — every
rank takes part, since under fsdp2 each tensor is gathered from all the shards as rank 0 streams it out.
With a `ShardPublisher` (`weights.transport=collective`, full weights) every rank sends its own rows instead
and nothing is gathered; if any rank cannot, all of them publish that version and every later one through
the publisher's store, as above (`weights/collective_fallback` in that step's metrics); until every inference
worker has come, a version goes through the store too and the group forms at a later one
(`weights/collective_pending`).
A group rebuilt after a rank died is set up with `publish_after` = the newest version the store holds: it
replays steps whose versions were published already, and publishes those again with `replace=True` (the
dead rank 0's buckets died with it) if the store may still hold them (the last `weights.keep_versions`).

With a lent-engine factory (`train.elastic_generation`; the job injects it, so the trainer never imports the
inference plane) the rank also lends its device to generation between train steps: `lend()` (every rank at
once: under fsdp2 the weights are gathered) has the engine it builds in this process serve the rank's current
weights, `reclaim()` takes the device back before the next step (and every train or SFT step reclaims first,
whatever the driver did), and in between the rank answers the calls the LLM proxy makes of an inference worker
(`submit`/`take`, `abort`, `preempt`, `ready`, `stats`) on other threads of this actor (it is placed threaded then:
`LENDING_CONCURRENCY`).

Life: constructed cheaply by the resource plane, then `rendezvous` (rank 0 offers a file store on its node
and a TCP address), `setup(init_method, checkpoint)` (process group — gloo on CPU, NCCL on CUDA — the
model, the optional checkpoint), then steps. With every rank on one node the rendezvous is the file store
and the collectives use the loopback interface: nothing listens beyond 127.0.0.1. Every collective has the
`train.timeout_s` bound.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ray
import torch
import torch.distributed as dist

from rollart.config import RunConfig
from rollart.resources.affinity import affinity
from rollart.resources.nodes import loopback_interface
from rollart.trainer import checkpoint as ckpt
from rollart.trainer.core import Trainer
from rollart.trainer.objective import Objective
from rollart.types import LentEngine, LoraAdapter, ShardPublisher, TrainBatch, TrainSample, WeightPublisher

log = logging.getLogger("rollart.trainer")
LENDING_CONCURRENCY = 16  # threads of a lending rank's actor: a proxy's take waits on one, submits and aborts on others


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
        lent_engine: Callable[[str, str], LentEngine] | None = None,
    ) -> None:
        # process-wide settings belong to the process that owns the rank
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (read at CUDA init)
        torch.set_num_threads(cfg.train.threads)
        torch.use_deterministic_algorithms(True, warn_only=True)
        self.cfg, self.objective, self.publisher = cfg, objective, publisher
        self.rank, self.world_size, self.name = rank, world_size, name or f"trainer/train/{rank}"
        self.device = device or "cpu"
        self.trainer: Trainer | None = None
        self._published = -1  # the newest version the store holds from this group (or an earlier one)
        self._collective_broken = False  # the weight group failed once: the store carries every later version
        self._said_pending = False  # the log said once that the weight group waits for its receivers
        self._lent_factory = lent_engine
        self._lent: LentEngine | None = None  # built at the first loan

    def rendezvous(self) -> dict[str, str]:
        """Where the other ranks meet rank 0: a file store on this node (used when every rank runs here:
        no TCP server at all) and a TCP address (used across nodes); plus this node's Ray id."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ray.util.get_node_ip_address(), 0))
            port = s.getsockname()[1]
        return {
            "file": f"file://{tempfile.mkdtemp(prefix='rollart-ddp-')}/store",
            "tcp": f"tcp://{ray.util.get_node_ip_address()}:{port}",
            "node": self.node_id(),
        }

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def setup(self, init_method: str, checkpoint: str | None = None, publish_after: int = -1) -> dict[str, Any]:
        """Join the process group at `init_method`, build the model, load `checkpoint` if given; rank 0
        publishes the weights of the resulting version (and of every later one) if newer than `publish_after`."""
        self._published = publish_after
        if self.device.startswith("cuda"):
            if ray.get_gpu_ids():  # Ray made only this worker's GPU visible: it is device 0 here
                self.device = "cuda:0"
            torch.cuda.set_device(torch.device(self.device))
        if self.world_size > 1:
            if init_method.startswith("file://") and (lo := loopback_interface()):
                # one node: keep the collectives' sockets on loopback too
                os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
                os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
            dist.init_process_group(
                backend="nccl" if self.device.startswith("cuda") else "gloo",
                init_method=init_method,
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.cfg.train.timeout_s),
            )
        self.trainer = Trainer(self.cfg, self.objective, rank=self.rank, world_size=self.world_size,
                               device=self.device)
        extra = self.trainer.load(checkpoint) if checkpoint else {}
        metrics = self.publish()
        return {"version": self.trainer.version, "extra_state": extra if self.rank == 0 else None, **metrics}

    def publish(self) -> dict[str, float]:
        """Publish the current weights under the current version (again, if published before and maybe still
        held). Through the store: rank 0 publishes, the other ranks take part in gathering them (fsdp2) and
        publish nothing. Over the weight group (a `ShardPublisher`): every rank sends its own rows, nothing
        gathered — unless a rank cannot (`_publish_rows`), then all of them take the store path."""
        version = self._t().version
        if version <= self._published - self.cfg.weights.keep_versions:
            return {}
        again = version <= self._published
        self._published = max(self._published, version)
        if isinstance(self.publisher, ShardPublisher) and self.cfg.train.lora is None:
            metrics = self._publish_rows(version)
            if metrics is not None:
                return metrics
            why = "weights/collective_fallback" if self._collective_broken else "weights/collective_pending"
            return {**self._publish_full(self.publisher.store, version, again), why: 1.0}
        return self._publish_full(self.publisher, version, again)

    def _publish_full(self, publisher: WeightPublisher, version: int, again: bool) -> dict[str, float]:
        weights = self._t().published_weights()
        if self.rank != 0:
            for _ in weights if not isinstance(weights, LoraAdapter) else ():
                pass  # every rank gathers every tensor, in the same order
            return {}
        metrics = dict(publisher.publish(version, weights, replace=again))
        return {} if again else metrics

    def _publish_rows(self, version: int) -> dict[str, float] | None:
        """Every rank sends its rows over the weight group; None when any rank could not (the group broke, a
        rank was rebuilt): the ranks agree on that over their own process group, so all fall back together.
        None too, without breaking anything, while a receiver has not yet come (the group forms later)."""
        assert isinstance(self.publisher, ShardPublisher)
        ok = not self._collective_broken and not self.publisher.fell_back()
        metrics: dict[str, float] = {}
        if self._all_ok(ok):
            if not self._all_ok(self.publisher.receivers_joined()):
                if self.rank == 0 and not self._said_pending:
                    log.info("%s: v%d goes through the store: the weight group forms once every inference worker "
                             "has started", self.name, version)
                    self._said_pending = True
                return None
            try:
                metrics = dict(self.publisher.publish_rows(version, self.rank, self.world_size,
                                                           self._t().weight_specs(), self._t().row_chunks()))
            except Exception as exc:  # noqa: BLE001 — any failure of the group: the store carries this version
                log.warning("%s: v%d could not go over the weight group (%s: %s); the store carries it",
                            self.name, version, type(exc).__name__, exc)
                ok = False
            if self._all_ok(ok):
                return metrics if self.rank == 0 else {}
        self._collective_broken = True
        return None

    def _all_ok(self, ok: bool) -> bool:
        """Whether every rank says ok (one all-reduce over the trainer's own group)."""
        if self.world_size == 1:
            return ok
        flag = torch.tensor([0.0 if ok else 1.0], device=self._t().device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() == 0.0)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        self.reclaim()  # (never train while the device generates on these very tensors)
        return self._t().train_step(batch) | self.publish()

    def sft_step(self, data: Sequence[TrainSample | Sequence[Mapping[str, str]]]) -> dict[str, float]:
        self.reclaim()
        return self._t().sft_step(data) | self.publish()

    # --- the device lent to generation between steps (train.elastic_generation) -------------------------
    def lend(self) -> dict[str, float]:
        """Serve generation on this rank's current weights (every rank at once); the version and the seconds it took."""
        if self._lent_factory is None:
            raise RuntimeError(f"{self.name}: lend() needs a lent-engine factory (train.elastic_generation)")
        start = time.perf_counter()
        trainer = self._t()
        if self._lent is None:
            self._lent = self._lent_factory(self.ready(), str(trainer.device))
        self._lent.serve(trainer.version, trainer.published_weights())
        return {"version": float(trainer.version), "lend_s": time.perf_counter() - start}

    def reclaim(self) -> dict[str, float]:
        """Take the device back: every request still there ends aborted (the LLM proxy goes on with it elsewhere).
        How many did, and the seconds the engine generated during the loan."""
        if self._lent is None:
            return {"preempted": 0.0, "busy_s": 0.0}
        return dict(self._lent.stop(self.cfg.inference.request_timeout_s))

    def submit(self, channel: str, items: list[tuple[int, Any]]) -> None:
        self._lender().submit(channel, items)

    def take(self, channel: str, wait_s: float = 30.0) -> list[Any]:
        return self._lender().take(channel, wait_s)

    def abort(self, trajectory_id: str) -> None:
        self._lender().abort(trajectory_id)

    def preempt(self, trajectory_id: str) -> None:
        self._lender().preempt(trajectory_id)

    def ready(self) -> str:
        """The name of the engine this rank lends (the LLM proxy's name for it)."""
        return f"{self.name}/lent"

    def stats(self) -> dict[str, Any]:
        return self._lent.stats() if self._lent is not None else {"worker": self.ready(), "serving": 0.0}

    def _lender(self) -> LentEngine:
        if self._lent is None:
            raise RuntimeError(f"{self.name}: a generation request came before the device was ever lent")
        return self._lent

    def save_checkpoint(self, directory: str, extra_state: Mapping[str, Any] | None) -> None:
        self._t().save(directory, extra_state)

    def finalize_checkpoint(self, tmp: str, final: str, keep: int) -> str:
        return str(ckpt.finalize(Path(tmp), Path(final), keep))

    def pid(self) -> int:
        """This rank's process id (fault-injection tests and benchmarks kill it)."""
        return os.getpid()

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the full weights as this rank gathers them (for checks; every rank must be called at
        once: under fsdp2 it is a collective. The store is the path for serving)."""
        return {k: v.detach().cpu() for k, v in self._t().state_dict().items()}

    def _t(self) -> Trainer:
        if self.trainer is None:
            raise RuntimeError(f"{self.name}: setup() was not called")
        return self.trainer
