"""Weights from the trainer's shards to the inference workers over a process group (`weights.transport=collective`).

In: a `WeightGroupSpec` (where the members meet: a TCP store the driver serves — `WeightGroupServer` —, how
many senders and receivers, the bucket size, the timeouts). Out: `CollectivePublisher` — every trainer rank
calls `publish_rows(version, rank, world, specs, chunks)` with the rows it holds (`shard_plan.py`); no rank
gathers a full tensor — and `CollectiveSubscriber` — an inference worker's `WeightSubscriber`: the versions
received in the background, `{name: tensor}` bit-identical to the trainer's.

How: sender r and the M receivers form a gloo process group of their own (M + 1 members, the sender its
rank 0; W groups in all, each receiver in every one of them). A version's transfer is announced through the
store (per publish, each sender writes a header: the version, its bucket sizes), then each sender
broadcasts its buckets one at a time — a bucket holding one piece is sent straight from the shard's memory,
several pieces are packed into one buffer — and finally a CRC-32 of everything it sent. The receivers, on a
thread of their own, wait for the headers, check them against the plan both ends compute from the specs
(rank 0 writes those to the store once, as JSON), receive each bucket straight into the rows of the full
tensors it fills, check the CRC, and stage the version. The inference worker's prefetch takes it from there
as from the store path: pulled in the background while the engine generates, swapped at the next suspend.

Bytes on the wire per version: every receiver gets the whole model once (M × model bytes), every sender
sends its 1/W of it to M receivers. Memory: a sender holds its shard and at most one packed bucket.

Forming, never waiting on a member that is not there: a receiver counts itself in the store when it starts
and forms its groups only once the senders announce they form theirs (`forming`); the trainer ranks form
them only at a version where every receiver has counted itself (`receivers_joined`, agreed over the ranks'
own group), and until then publish through the object store — the run's first versions when the inference
workers start after the trainer (a pool they share), counted in `weights/collective_pending`. A receiver
serves those from the store until the group carries its first version.

Fallback, never silent: the object-store path stays — across clusters (`weights.transport=store`), and
whenever this one cannot serve. A sender whose group cannot form or whose send fails raises
`CollectiveFailed`; the trainer ranks agree on it (rollart/trainer/worker.py) and publish that version and
every later one through the store, and the store key `fallback` tells the receivers, which then pull from
the store. A receiver that joins after the group formed (a replacement worker) or a sender of a rebuilt
trainer cannot enter the running groups: it sets `fallback` itself. Counted in `weights/collective_fallback`.

GPUs: the same protocol over NCCL is what `benchmarks/gpu/weights_nccl_check.py` runs (FSDP2 shards to a vLLM
engine's weight-transfer API); this module's groups are gloo (CPU tensors), the only backend this repository
tests.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist

from rollart.weights.shard_plan import (
    DTYPE_BYTES,
    Piece,
    TensorSpec,
    bucket_sizes,
    plan_buckets,
    specs_from_json,
    specs_to_json,
)
from rollart.weights.timing import PUBLISH, PULL

log = logging.getLogger("rollart.weights")

POLL_S = 0.5  # how often a waiting receiver looks at the store (for the next version, or a fallback)


class CollectiveFailed(RuntimeError):
    """The collective path cannot carry this version (a member is gone, the group never formed): use the store."""


@dataclass(frozen=True)
class WeightGroupSpec:
    """Where one run's weight group meets, and its shape. Picklable (it travels to every member)."""

    host: str
    port: int
    prefix: str  # keys of this run in the store
    senders: int  # trainer ranks
    receivers: int  # inference workers at start
    bucket_bytes: int
    timeout_s: float  # every wait: forming a group, one transfer, a store call
    interface: str = ""  # the network interface gloo binds ("lo" when every member is on one node)
    backend: str = "gloo"  # "nccl": GPU tensors (benchmarks/gpu/weights_nccl_check.py; not run here)

    def store(self, is_master: bool = False) -> dist.TCPStore:
        return dist.TCPStore(self.host, self.port, None, is_master, datetime.timedelta(seconds=self.timeout_s),
                             wait_for_workers=False)

    def group(self, store: dist.Store, sender: int, rank: int) -> dist.ProcessGroup:
        """Sender `sender`'s group (`rank` 0: the sender; 1..M: the receivers). Blocks until all M + 1 joined
        (gloo; NCCL connects at its first collective, on the current CUDA device)."""
        prefixed = dist.PrefixStore(f"{self.prefix}/s{sender}", store)
        if self.backend == "nccl":
            nccl = dist.ProcessGroupNCCL.Options()
            nccl._timeout = datetime.timedelta(seconds=self.timeout_s)
            return dist.ProcessGroupNCCL(prefixed, rank, self.receivers + 1, nccl)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = datetime.timedelta(seconds=self.timeout_s)
        device = (dist.ProcessGroupGloo.create_device(interface=self.interface) if self.interface
                  else dist.ProcessGroupGloo.create_default_device())
        options._devices = [device]
        return dist.ProcessGroupGloo(prefixed, rank, self.receivers + 1, options)


class WeightGroupServer:
    """The rendezvous store of the weight group, served by the driver for the run's lifetime."""

    def __init__(self, host: str, senders: int, receivers: int, bucket_bytes: int, timeout_s: float,
                 interface: str = "", prefix: str = "rollart/weights") -> None:
        self._store = dist.TCPStore(host, 0, None, True, datetime.timedelta(seconds=timeout_s),
                                    wait_for_workers=False)
        self.spec = WeightGroupSpec(host, self._store.port, prefix, senders, receivers, bucket_bytes, timeout_s,
                                    interface)

    def fallback_reason(self) -> str:
        """Why the run fell back to the store ('' while the collective carries the weights)."""
        key = f"{self.spec.prefix}/fallback"
        return self._store.get(key).decode() if self._store.check([key]) else ""


def _fallback(store: dist.Store, prefix: str, reason: str) -> None:
    key = f"{prefix}/fallback"
    if not store.check([key]):
        store.set(key, reason)
    log.warning("weights: the collective path stops (%s); every version from now on goes through the store", reason)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous CPU tensor (0-d included)."""
    return t.reshape(-1).view(torch.uint8)


def _send(group: dist.ProcessGroup, buffer: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([buffer], options).wait()


class CollectivePublisher:
    """The trainer ranks' end. Picklable: each rank connects on its first `publish_rows`; `store` is the object
    store publisher the ranks fall back to (and LoRA runs use: an adapter is small)."""

    shards = True  # every rank publishes its own rows (rollart/trainer/worker.py)

    def __init__(self, spec: WeightGroupSpec, store: Any) -> None:
        self.spec, self.store = spec, store
        self._group: dist.ProcessGroup | None = None
        self._kv: dist.TCPStore | None = None
        self._plan: list[list[Piece]] | None = None
        self._publishes = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "store": self.store}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], state["store"])  # type: ignore[misc]

    def fell_back(self) -> str:
        """The reason the run fell back to the store, '' if it has not (asks the store; every rank agrees
        on it through the trainer's own group before acting)."""
        kv = self._kv or self.spec.store()
        self._kv = kv
        key = f"{self.spec.prefix}/fallback"
        return kv.get(key).decode() if kv.check([key]) else ""

    def latest(self) -> int:
        """The newest version the object store holds (the versions the group carried are not in it)."""
        return self.store.latest()

    def receivers_joined(self) -> bool:
        """Whether every receiver the group is made for has counted itself in the store (or the group formed):
        only then can forming it not wait out its timeout on a worker that is still starting."""
        if self._group is not None:
            return True
        kv = self._kv or self.spec.store()
        self._kv = kv
        return kv.add(f"{self.spec.prefix}/receivers", 0) >= self.spec.receivers

    def publish_rows(self, version: int, rank: int, world: int, specs: Sequence[tuple[tuple[str, ...], str, tuple[int, ...]]],
                     chunks: Iterable[torch.Tensor]) -> dict[str, float]:
        """Send this rank's rows of every tensor (`chunks`, one per spec, in order: rank `rank`'s rows along
        dim 0 as `rollart.base.shards.row_range` says). Raises `CollectiveFailed` when the group cannot carry it."""
        start = time.perf_counter()
        spec = self.spec
        if world != spec.senders:
            raise CollectiveFailed(f"{world} trainer ranks, but the weight group was made for {spec.senders}")
        try:
            tensor_specs = [TensorSpec(tuple(n), d, tuple(s)) for n, d, s in specs]
            kv = self._connect(rank, tensor_specs)
            plan = self._plan
            assert plan is not None and self._group is not None
            self._publishes += 1
            header = {"version": version, "buckets": bucket_sizes(plan)}
            kv.set(f"{spec.prefix}/n{self._publishes}/s{rank}", json.dumps(header))
            crc, sent, packed_peak = 0, 0, 0
            numbered = enumerate(chunks)  # one chunk per spec, in order; a rank holding no rows of a tensor skips it
            for bucket in plan:
                pieces = []
                for piece in bucket:
                    index, chunk = next(numbered)
                    while index < piece.tensor:
                        index, chunk = next(numbered)
                    pieces.append(_piece_bytes(chunk, tensor_specs[piece.tensor], piece, spec.backend == "gloo"))
                buffer = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
                if len(pieces) > 1:
                    packed_peak = max(packed_peak, buffer.numel())
                if buffer.device.type == "cpu":
                    crc = zlib.crc32(buffer.numpy(), crc)
                _send(self._group, buffer)
                sent += buffer.numel()
                del buffer, pieces
            for _ in numbered:  # the rest (tensors this rank holds no rows of): taken, so a generator finishes
                pass
            kv.set(f"{spec.prefix}/n{self._publishes}/s{rank}/crc", str(crc))
        except CollectiveFailed:
            raise
        except Exception as exc:  # noqa: BLE001 — a dead receiver, a timeout: the store takes over
            reason = f"sending v{version} from trainer rank {rank}: {type(exc).__name__}: {exc}"
            if self._kv is not None:
                _fallback(self._kv, spec.prefix, reason)
            raise CollectiveFailed(reason) from exc
        return {PUBLISH: time.perf_counter() - start, "weights/publish_mb": sent / 2**20,
                "weights/wire_mb": sent * spec.receivers / 2**20, "weights/packed_peak_mb": packed_peak / 2**20,
                "weights/buckets": float(len(plan))}

    def _connect(self, rank: int, specs: list[TensorSpec]) -> dist.TCPStore:
        if self._group is not None and self._kv is not None:
            return self._kv
        spec = self.spec
        kv = self._kv or spec.store()
        self._kv = kv
        if kv.add(f"{spec.prefix}/s{rank}/joins", 1) > 1:  # a rebuilt trainer: the receivers' groups are the old one's
            _fallback(kv, spec.prefix, f"trainer rank {rank} was rebuilt and cannot rejoin the weight group")
            raise CollectiveFailed("rebuilt trainer rank")
        if rank == 0:
            kv.set(f"{spec.prefix}/plan", specs_to_json(specs))
            kv.set(f"{spec.prefix}/forming", "1")  # the receivers, counted and waiting, form their groups now
        self._plan = plan_buckets(specs, rank, spec.senders, spec.bucket_bytes)
        try:
            self._group = spec.group(kv, rank, 0)
        except Exception as exc:  # noqa: BLE001
            _fallback(kv, spec.prefix, f"trainer rank {rank} could not form its weight group: {exc}")
            raise CollectiveFailed(f"forming the weight group of trainer rank {rank}: {exc}") from exc
        return kv


def _piece_bytes(chunk: torch.Tensor, spec: TensorSpec, piece: Piece, to_cpu: bool) -> torch.Tensor:
    """The bytes of one piece: this rank's rows of the tensor, as they are held (no copy when contiguous;
    `to_cpu`: a gloo group takes host memory)."""
    if to_cpu and chunk.device.type != "cpu":
        chunk = chunk.cpu()
    rows = piece.stop - piece.start
    if spec.shape and chunk.shape[0] != rows:
        raise CollectiveFailed(f"{spec.names[0]}: this rank holds {chunk.shape[0]} rows, the plan says {rows}")
    data = _as_bytes(chunk.contiguous())
    if data.numel() != piece.nbytes:
        raise CollectiveFailed(f"{spec.names[0]}: {data.numel()} bytes held, the plan says {piece.nbytes}")
    return data


class CollectiveSubscriber:
    """An inference worker's end (`WeightSubscriber`). Picklable: a copy connects on its first call; `store` is
    the object-store subscriber it falls back to."""

    def __init__(self, spec: WeightGroupSpec, store: Any) -> None:
        self.spec, self.store = spec, store
        self._lock = threading.Lock()
        self._ready: tuple[int, dict[str, torch.Tensor]] | None = None  # the newest version received
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._fallback = ""
        self._version = -1
        self.last_metrics: dict[str, float] = {}
        self.received_versions = 0

    def __reduce__(self) -> Any:
        return (CollectiveSubscriber, (self.spec, self.store))

    @property
    def version(self) -> int:
        return self._version

    @property
    def fell_back(self) -> str:
        """Why this worker takes its weights from the store ('' while the weight group carries them)."""
        return self._fallback

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop receiving; the receiving thread ends at its next look at the store (its groups go with it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    async def latest_version(self) -> int:
        self._start()
        with self._lock:
            ready = self._ready
        if self._fallback or ready is None:  # fell back, or the group carries no version yet: the store does
            return await self.store.latest_version()
        return ready[0]

    async def pull(self, version: int) -> dict[str, Any]:
        if version < self._version:
            raise ValueError(f"pull(v{version}) would take this worker's weights backwards "
                             f"(it already pulled v{self._version})")
        self._start()
        start = time.perf_counter()
        deadline = start + self.spec.timeout_s
        next_store_look = start
        while True:
            with self._lock:
                ready = self._ready
            if not self._fallback and (ready is None or ready[0] > version) and time.perf_counter() >= next_store_look:
                # the versions before the group formed went through the store (see "Forming" above)
                next_store_look = time.perf_counter() + POLL_S
                carried_by_store = await self.store.latest_version() >= version
            else:
                carried_by_store = False
            if self._fallback or carried_by_store:
                tensors = await self.store.pull(version)
                self._version = max(self._version, version)
                self.last_metrics = dict(getattr(self.store, "last_metrics", {}))
                return tensors
            if ready is not None and ready[0] >= version:
                if ready[0] != version:
                    raise ValueError(f"v{version} was replaced by v{ready[0]} before it was taken")
                self._version = version
                self.last_metrics = {PULL: time.perf_counter() - start,
                                     "weights/pull_mb": sum(t.nbytes for t in _distinct(ready[1])) / 2**20}
                return dict(ready[1])
            if time.perf_counter() > deadline:
                raise TimeoutError(f"weights: v{version} did not arrive over the weight group within "
                                   f"{self.spec.timeout_s:.0f}s (weights.timeout_s)")
            await asyncio.sleep(0.01)

    # --- the receiving thread ------------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._receive_forever, daemon=True, name="weight-receiver")
            self._thread.start()

    def _receive_forever(self) -> None:
        spec = self.spec
        try:
            kv = spec.store()
        except Exception as exc:  # noqa: BLE001 — no rendezvous: nothing but the store can serve
            self._fallback = f"cannot reach the weight group's store: {exc}"
            return
        slot = kv.add(f"{spec.prefix}/receivers", 1) - 1
        if slot >= spec.receivers:
            self._fallback = f"receiver {slot} joined after the weight group formed (a replacement)"
            _fallback(kv, spec.prefix, self._fallback)
            return
        try:
            if not self._wait_for_forming(kv):
                return
            groups = [spec.group(kv, s, slot + 1) for s in range(spec.senders)]
            kv.wait([f"{spec.prefix}/plan"], datetime.timedelta(seconds=spec.timeout_s))
            specs = specs_from_json(kv.get(f"{spec.prefix}/plan"))
            plans = [plan_buckets(specs, s, spec.senders, spec.bucket_bytes) for s in range(spec.senders)]
            publish = 0
            while not self._stop.is_set():
                publish += 1
                headers = self._headers(kv, publish)
                if headers is None:
                    return
                version = self._receive(kv, groups, specs, plans, headers, publish)
                self.received_versions += 1
                for s in range(spec.senders):  # the announcement is read: drop the previous one's keys
                    for key in (f"{spec.prefix}/n{publish - 1}/s{s}", f"{spec.prefix}/n{publish - 1}/s{s}/crc"):
                        if slot == 0 and kv.check([key]):
                            kv.delete_key(key)
                log.debug("weights: v%d received over the weight group", version)
        except Exception as exc:  # noqa: BLE001 — any failure: the store path from now on, said once
            self._fallback = f"receiver {slot}: {type(exc).__name__}: {exc}"
            try:
                _fallback(kv, spec.prefix, self._fallback)
            except Exception:  # noqa: BLE001 — the store itself is gone; the fallback flag above is enough here
                pass

    def _wait_for_forming(self, kv: dist.TCPStore) -> bool:
        """Wait (as long as the run lasts: the trainer may take its time) until the senders form their groups;
        False once the run fell back before that, or this subscriber closed."""
        while not self._stop.is_set():
            if kv.check([f"{self.spec.prefix}/fallback"]):
                self._fallback = kv.get(f"{self.spec.prefix}/fallback").decode()
                return False
            if kv.check([f"{self.spec.prefix}/forming"]):
                return True
            time.sleep(POLL_S / 10)
        return False

    def _headers(self, kv: dist.TCPStore, publish: int) -> list[dict[str, Any]] | None:
        """Every sender's header of publish number `publish`, or None once the run fell back (or closed)."""
        keys = [f"{self.spec.prefix}/n{publish}/s{s}" for s in range(self.spec.senders)]
        while not self._stop.is_set():
            if kv.check([f"{self.spec.prefix}/fallback"]):
                self._fallback = kv.get(f"{self.spec.prefix}/fallback").decode()
                return None
            if kv.check(keys):
                return [json.loads(kv.get(k)) for k in keys]
            time.sleep(POLL_S / 10)
        return None

    def _receive(self, kv: dist.TCPStore, groups: list[dist.ProcessGroup], specs: list[TensorSpec],
                 plans: list[list[list[Piece]]], headers: list[dict[str, Any]], publish: int) -> int:
        version = announced_version(headers, plans)
        with self._lock:
            if self._ready is not None and version <= self._ready[0]:
                raise ValueError(f"v{version} announced after v{self._ready[0]}: versions only go forward")
        start = time.perf_counter()
        tensors, crcs = receive_buckets(groups, specs, plans)
        for s in range(len(groups)):
            key = f"{self.spec.prefix}/n{publish}/s{s}/crc"
            kv.wait([key], datetime.timedelta(seconds=self.spec.timeout_s))
            if int(kv.get(key)) != crcs[s]:
                raise ValueError(f"v{version}: the bytes from sender {s} do not match its checksum")
        named = {name: t for sp, t in zip(specs, tensors) for name in sp.names}
        with self._lock:
            self._ready = (version, named)
        self.last_metrics = {"time/weights.receive": time.perf_counter() - start}
        return version


def announced_version(headers: Sequence[dict[str, Any]], plans: Sequence[Sequence[Sequence[Piece]]]) -> int:
    """The version every sender's header announces, checked against the plan (the same version from all,
    and each sender's bucket sizes those of its plan)."""
    versions = {h.get("version") for h in headers}
    if len(versions) != 1 or not isinstance(next(iter(versions)), int):
        raise ValueError(f"the senders announce different versions: {sorted(map(str, versions))}")
    for s, (header, plan) in enumerate(zip(headers, plans)):
        if header.get("buckets") != bucket_sizes(plan):
            raise ValueError(f"sender {s} announces buckets {header.get('buckets')} but the plan has "
                             f"{bucket_sizes(plan)}")
    return int(next(iter(versions)))


def receive_buckets(groups: Sequence[dist.ProcessGroup], specs: Sequence[TensorSpec],
                    plans: Sequence[Sequence[Sequence[Piece]]], device: str | torch.device = "cpu",
                    checksum: bool = True) -> tuple[list[torch.Tensor], list[int]]:
    """Every sender's buckets, in order, into new full tensors on `device` (a bucket of one piece straight into
    its rows; the k-th buckets of all senders at once); with each sender's CRC-32 of what it sent (0 when
    `checksum` is off: a GPU receiver would copy every byte back to the host for it)."""
    tensors = [torch.empty(sp.shape, dtype=getattr(torch, sp.dtype), device=device) for sp in specs]
    crcs = [0] * len(groups)
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    for k in range(max((len(p) for p in plans), default=0)):
        posted = []
        for s, plan in enumerate(plans):
            if k < len(plan):
                bucket = plan[k]
                target = (_rows(tensors[bucket[0].tensor], bucket[0]) if len(bucket) == 1
                          else torch.empty(sum(p.nbytes for p in bucket), dtype=torch.uint8, device=device))
                posted.append((s, bucket, target, groups[s].broadcast([target], options)))
        for s, bucket, target, work in posted:
            work.wait()
            if checksum:
                crcs[s] = zlib.crc32(target.numpy(), crcs[s])
            if len(bucket) > 1:
                for piece in bucket:
                    _rows(tensors[piece.tensor], piece).copy_(target[piece.offset:piece.offset + piece.nbytes])
    return tensors, crcs


def _rows(tensor: torch.Tensor, piece: Piece) -> torch.Tensor:
    """The bytes of rows [piece.start, piece.stop) of a contiguous tensor, in place (0-d: the whole)."""
    flat = tensor.reshape(1) if tensor.dim() == 0 else tensor[piece.start:piece.stop]
    return _as_bytes(flat)


def _distinct(tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return list({t.data_ptr(): t for t in tensors.values()}.values())

