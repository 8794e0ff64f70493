"""`TrainerRanks`: the driver's one handle on N data-parallel trainer actors.

In: the `RunConfig` (`train.workers` ranks, `roles.trainer` may override the `train` pool), the resource
plane's `Resources` (it places the actors), the policy `Objective` (`rollart.algo.PolicyObjective`) and the
weight store's `WeightPublisher`; optionally a checkpoint to resume from. Out: `train_step`, `sft_step`
(metrics of rank 0, after checking every rank agrees), `save_checkpoint`, `version`, `extra_state`,
`restarts`; with a `lent_engine` factory (`train.elastic_generation`) also `lend`, `reclaim` and `actors` (the ranks'
handles, which the LLM proxy calls as the workers of its lendable pool).

    ranks = TrainerRanks(cfg, rt.resources, PolicyObjective.of(cfg), store.publisher(),
                         checkpoint=latest_checkpoint(cfg.run_dir) if cfg.resume else None)

Guarantees: at construction the weights of `ranks.version` (0, or the checkpoint's) are published; every
step publishes the next version before it returns; every call is bounded by `train.timeout_s`; ranks that
disagree on loss or version are an error, never averaged away. Calls from several threads run one after the
other (a loan begun in the background and a checkpoint must not interleave their collectives).

A rank that dies: the moment it is known (a call it ended, or the resource plane's health check) every
other rank is killed too, so none waits out a gloo/NCCL timeout for it. The next call — or the call that
saw the death — rebuilds the ranks: new ranks load the latest checkpoint these ranks wrote or started from
(the initial weights if none), replay the steps taken since (kept in memory: their batches), which gives
the same weights bit for bit on CPU without publishing versions the store already holds, then run the
call. At most `train.restarts` rebuilds; past that the call raises `TrainerFailed` at once. A save that
fails removes its temporary directory; a rebuild first removes temporary directories a kill left behind.
"""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import ray

from rollart.config import RunConfig
from rollart.resources.worker_set import WorkerSet, MemberEvent
from rollart.resources.errors import WorkerDied
from rollart.resources.placement import Resources
from rollart.base.interrupts import Interrupted, interrupted
from rollart.base.run_dir import RunPaths
from rollart.trainer import checkpoint as ckpt
from rollart.trainer.objective import Objective
from rollart.trainer.worker import LENDING_CONCURRENCY, TrainerWorker
from rollart.types import LentEngine, TrainBatch, TrainSample, WeightPublisher

log = logging.getLogger("rollart.trainer")
T = TypeVar("T")
SftData = Sequence[TrainSample | Sequence[Mapping[str, str]]]


class TrainerFailed(RuntimeError):
    """The trainer lost a rank more often than `train.restarts` allows; the run cannot go on here."""


class TrainerRanks:
    def __init__(
        self,
        cfg: RunConfig,
        resources: Resources,
        objective: Objective,
        publisher: WeightPublisher,
        *,
        checkpoint: str | Path | None = None,
        lent_engine: Callable[[str, str], LentEngine] | None = None,
    ) -> None:
        self.cfg, self.resources, self.objective, self.publisher = cfg, resources, objective, publisher
        self.lent_engine = lent_engine
        self._calls = threading.RLock()  # one call on the ranks at a time (a rebuild inside one re-enters)
        self.restarts = 0
        self._checkpoint = Path(checkpoint) if checkpoint else None  # what a rebuild starts from
        self._replay: list[tuple[str, Any]] = []  # steps since that checkpoint: ("train", batch) | ("sft", data)
        self._death: WorkerDied | None = None  # a rank died while no call was running
        self._lock = threading.Lock()
        self._listeners: list[Callable[[MemberEvent], None]] = []
        ckpt.remove_partial(cfg.run_dir)
        ready = self._start(publish_after=-1)
        self.version: int = self._agree(ready, "version")
        self.extra_state: dict[str, Any] = ready[0]["extra_state"] or {}
        self.setup_metrics: dict[str, float] = {k: v for k, v in ready[0].items()
                                                if k not in ("version", "extra_state")}

    @property
    def names(self) -> list[str]:
        return self.worker_set.names

    def on_change(self, listener: Callable[[MemberEvent], None]) -> None:
        """Call `listener` when a rank dies, and for each rank of a rebuilt set of ranks (`joined`, its `cause`
        saying what it was rebuilt from); see `rollart.resources.WorkerSet.on_change`."""
        self._listeners.append(listener)
        self.worker_set.on_change(listener)

    # --- steps ---------------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One RL step on every rank (the batch is put in the object store once); publishes version + 1."""
        metrics = self._call(lambda: self._train(batch))
        self._replay.append(("train", batch))
        return metrics

    def sft_step(self, data: SftData) -> dict[str, float]:
        """One supervised step (samples or chat conversations); publishes version + 1."""
        metrics = self._call(lambda: self._sft(data))
        self._replay.append(("sft", list(data)))
        return metrics

    def save_checkpoint(self, step: int, extra_state: Mapping[str, Any] | None = None) -> Path:
        """Write RUN_DIR/checkpoints/step_<step> (complete or absent), keep the newest K; its path. `step`
        is the RL step the checkpoint continues from — named so, not by the policy version, which counts
        the warm start's supervised steps too (that lives in the checkpoint's trainer_state.json)."""
        path = self._call(lambda: self._save(step, dict(extra_state or {})))
        self._checkpoint, self._replay = path, []
        return path

    def weights(self, rank: int = 0) -> dict[str, Any]:
        """A copy of the full weights as one rank holds or gathers them (for checks; every rank takes part)."""
        return self._call(lambda: self.worker_set.gather(self.worker_set.call_all("weights"))[rank])

    def lend(self) -> dict[str, float]:
        """Every rank's device generates on its current weights until `reclaim` (rank 0's version and seconds)."""
        return self._call(lambda: self.worker_set.gather(self.worker_set.call_all("lend"))[0])

    def reclaim(self) -> dict[str, float]:
        """Every rank takes its device back: `preempted`, the requests still running there (they ended aborted),
        and `busy_s`, the seconds a rank's engine generated during the loan (the ranks' mean)."""
        results = self._call(lambda: self.worker_set.gather(self.worker_set.call_all("reclaim")))
        return {"preempted": sum(r["preempted"] for r in results),
                "busy_s": sum(r["busy_s"] for r in results) / len(results)}

    def actors(self) -> list[Any]:
        """The ranks' actor handles, in rank order."""
        return [member.actor for member in self.worker_set.members()]

    def pids(self) -> list[int]:
        """Each rank's process id (fault injection)."""
        return self.worker_set.gather(self.worker_set.call_all("pid"))

    def _train(self, batch: TrainBatch) -> dict[str, float]:
        ref = ray.put(batch)
        results = self.worker_set.gather(self.worker_set.call_all("train_step", ref))
        self._agree(results, "train/loss")
        self.version = int(self._agree(results, "train/version"))
        return results[0]

    def _sft(self, data: SftData) -> dict[str, float]:
        ref = ray.put(list(data))
        results = self.worker_set.gather(self.worker_set.call_all("sft_step", ref))
        self._agree(results, "sft/loss")
        self.version = int(self._agree(results, "train/version"))
        return results[0]

    def _save(self, step: int, extra_state: dict[str, Any]) -> Path:
        paths = RunPaths.of(self.cfg.run_dir)
        paths.make_dir(paths.checkpoints)  # a link there (or on the way) is refused: checkpoints stay in the run
        final = ckpt.step_path(self.cfg.run_dir, step).absolute()
        tmp = ckpt.temporary_path(final)
        writes: list[ray.ObjectRef] = []
        try:
            writes = self.worker_set.call_all("save_checkpoint", str(tmp), extra_state)
            self.worker_set.gather(writes)
            keep = self.cfg.train.keep_checkpoints
            return Path(self.worker_set.gather([self.worker_set.call_one(0, "finalize_checkpoint", str(tmp), str(final),
                                                                   keep)])[0])
        except BaseException:
            # gather fails at the first rank's error while the others may still be writing into tmp: wait for them
            # (bounded) first, else one of them recreates it after the discard (a make test on 2026-12-06 saw that)
            if writes:
                ray.wait(writes, num_returns=len(writes), timeout=self.cfg.train.timeout_s)
            ckpt.discard(tmp)  # a failed write leaves nothing behind
            raise

    # --- deaths and rebuilds -------------------------------------------------------------------------
    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the ranks; a rank's death (before or during it) rebuilds them and runs it again."""
        with self._calls:
            while True:
                try:
                    if self._death is not None:
                        raise self._death
                    return fn()
                except WorkerDied as death:
                    self._abort()
                    if interrupted():  # the user's Ctrl-C reached the ranks too: nothing to mend, the job is stopping
                        raise Interrupted(f"trainer rank {death.worker} stopped with the job's Ctrl-C") from None
                    self._rebuild(death)

    def _rebuild(self, death: WorkerDied) -> None:
        limit = self.cfg.train.restarts
        if self.restarts >= limit:
            raise TrainerFailed(
                f"trainer rank {death.worker} died ({death.cause}) and the ranks were already rebuilt "
                f"{self.restarts} time{'s' * (self.restarts != 1)} (train.restarts={limit}): stopping"
            ) from death
        self.restarts += 1
        target = self.version
        source = str(self._checkpoint) if self._checkpoint else "the initial weights"
        replayed = f"{len(self._replay)} step{'s' * (len(self._replay) != 1)}"
        log.warning("trainer rank %s died (%s): rebuilding the ranks from %s and replaying %s to version %d "
                    "(restart %d of %d)", death.worker, death.cause, source, replayed, target, self.restarts, limit)
        self._death = None
        ckpt.remove_partial(self.cfg.run_dir)
        # the dead rank may have published the version of the step it died in (the store holds it, its buckets
        # died with it): the replayed or retried step publishes it again, replacing them
        ready = self._start(publish_after=max(target, self.publisher.latest()))
        self.version = self._agree(ready, "version")
        for kind, data in self._replay:
            self._train(data) if kind == "train" else self._sft(data)
        if self.version != target:
            raise TrainerFailed(f"the rebuilt trainer ranks replayed to version {self.version}, not {target}")
        for member in self.worker_set.members():
            event = MemberEvent("joined", self.worker_set.role, member.slot, member.worker, member.placement.pool,
                                actor=member.actor,
                                cause=f"rebuilt from {source}, {replayed} replayed")
            for listener in self._listeners:
                listener(event)

    def _start(self, publish_after: int) -> list[dict[str, Any]]:
        """Place the ranks, meet, set up from the checkpoint; rank 0 publishes versions > `publish_after`."""
        n = self.cfg.train.workers
        ranks = itertools.count()
        self.worker_set: WorkerSet = self.resources.place(
            TrainerWorker,
            replicas=n,
            args=(self.cfg, self.objective, self.publisher),
            kwargs={"lent_engine": self.lent_engine} if self.lent_engine else None,
            actor_options={"max_concurrency": LENDING_CONCURRENCY} if self.lent_engine else None,
            worker_kwargs=lambda p: {"rank": next(ranks), "world_size": n, "name": p.worker, "device": p.device},
            call_timeout_s=self.cfg.train.timeout_s,
            replace_dead=False,  # ranks are rebuilt together, from a checkpoint (see the module doc)
            elastic=False,
        )
        self.worker_set.on_change(self._on_change)
        for listener in self._listeners:
            self.worker_set.on_change(listener)
        try:
            meet = self.worker_set.gather([self.worker_set.call_one(0, "rendezvous")])[0]
            one_node = all(other == meet["node"] for other in self.worker_set.gather(self.worker_set.call_all("node_id")))
            init_method = meet["file"] if one_node else meet["tcp"]
            checkpoint = str(self._checkpoint) if self._checkpoint else None
            return self.worker_set.gather(self.worker_set.call_all("setup", init_method, checkpoint, publish_after))
        except BaseException:
            self.worker_set.shutdown()
            raise

    def _on_change(self, event: MemberEvent) -> None:
        """A rank died (seen by the health check or a caller): kill the others now, so no rank sits in a
        collective waiting for it, and let the next call rebuild."""
        if event.kind != "died":
            return
        with self._lock:
            if self._death is None:
                self._death = WorkerDied(event.worker, event.cause)
        self._abort()

    def _abort(self) -> None:
        self.worker_set.shutdown()

    # --- ending --------------------------------------------------------------------------------------
    def close(self) -> None:
        self.worker_set.shutdown()

    def __enter__(self) -> TrainerRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _agree(self, results: list[dict[str, Any]], key: str) -> Any:
        values = [r[key] for r in results]
        if any(v != values[0] for v in values):
            raise RuntimeError(f"trainer ranks disagree on {key}: {dict(zip(self.names, values))}")
        return values[0]
