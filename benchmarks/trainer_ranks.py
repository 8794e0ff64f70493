"""What one trainer rank of `rollart bench trainer` runs, in a fresh process (torch.multiprocessing spawn).

In: the world size, a model checkpoint, a `train.*` setting, the sequence lengths of the batch (or the
samples), the number of steps, optionally the lengths of a short warm-up batch trained first, and whether bf16
matrix products run through float32 kernels (cpu_bf16.py). Out: one JSON file per rank — the process's RSS after imports, after the build and before the last
step, the peak RSS during the last step (sampled every millisecond by a thread), the last step's wall time,
each step's loss, the bytes of this rank's parameters + gradients + optimizer state (counted from the
tensors it holds), the model's parameter count and the batch's real tokens.

Memory is read with glibc's mmap threshold at 64 KiB (set by the caller before the spawn): every large
tensor is its own mapping, returned to the system when freed, so RSS follows what is alive instead of
keeping freed heap pages.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import psutil
import torch
import torch.distributed as dist

from benchmarks.cpu_bf16 import Bf16ViaFloat32

MODEL_TOKEN_FRACTION = 0.75  # the part of each sequence the model wrote (an RL response); the rest a prompt


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


class PeakRss:
    """The highest RSS seen between start() and stop(), sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss / 2**20)
            time.sleep(0.001)

    def __enter__(self) -> PeakRss:
        self.peak = rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak = max(self.peak, rss_mb())


def batch(lengths: Sequence[int], version: int, seed: int, vocab: int):
    """Synthetic samples of the given lengths: a prompt, then model tokens with behaviour logprobs."""
    from rollart.types import TrainBatch, TrainSample

    rng = random.Random(seed)
    samples = []
    for i, n in enumerate(lengths):
        prompt = max(1, n - int(n * MODEL_TOKEN_FRACTION))
        ids = tuple(rng.randrange(3, vocab) for _ in range(n))
        mask = (0,) * prompt + (1,) * (n - prompt)
        samples.append(TrainSample(f"b{seed}-{i}", f"g{i // 4}", "bench", ids, mask,
                                   tuple(-rng.uniform(8.0, 11.0) * m for m in mask),
                                   tuple(version if m else -1 for m in mask), rng.uniform(-1.5, 1.5), 0.0))
    return TrainBatch(version=version, samples=tuple(samples))


def state_bytes(trainer: Any) -> int:
    """This rank's parameters + gradients (one per trainable parameter) + optimizer state, in bytes."""
    local = trainer.strategy.local
    params = sum(local(p).numel() * local(p).element_size() for p in trainer.policy.parameters())
    grads = sum(local(p).numel() * local(p).element_size() for p in trainer.trainable())
    optim = sum(local(v).numel() * local(v).element_size() for state in trainer.optimizer.state.values()
                for v in state.values() if isinstance(v, torch.Tensor))
    return params + grads + optim


def measure(rank: int, world: int, model_path: str, train: dict[str, Any], lengths: Sequence[int], steps: int,
            out: Path, samples: Sequence[Any] | None = None, warmup: Sequence[int] = (),
            bf16_via_float32: bool = False) -> dict[str, Any]:
    """Train a warm-up step on a batch of `warmup` lengths (if any), then `steps` steps on a batch of `lengths`
    (or the given samples); measure the last one.

    The warm-up is short on purpose: what it is for — AdamW's state allocated, every first call made — does
    not depend on its length (gradients are freed after each step), so the measured step starts in the
    steady state a long warm-up would leave, at a fraction of its time."""
    from contextlib import nullcontext

    from rollart.algo import PolicyObjective
    from rollart.config import PoolConfig, RunConfig, default_pools
    from rollart.trainer import Trainer
    from rollart.types import TrainBatch

    imported = rss_mb()
    pools = {**default_pools(), "train": PoolConfig(kind="cpu", capacity=world)}
    cfg = RunConfig(model={"path": model_path}, pools=pools, train={"workers": world, "lr": 1e-5, **train})
    trainer = Trainer(cfg, PolicyObjective.of(cfg), rank=rank, world_size=world)
    built = rss_mb()
    vocab = int(trainer.model.config.vocab_size)
    losses: list[float] = []
    kernels = Bf16ViaFloat32 if bf16_via_float32 else nullcontext
    if warmup:
        with kernels():
            trainer.train_step(batch(warmup, trainer.version, 1000, vocab))
    for step in range(steps):
        data = (TrainBatch(trainer.version, tuple(samples)) if samples is not None
                else batch(lengths, trainer.version, step, vocab))
        last = step == steps - 1
        before = rss_mb()
        dist.barrier() if dist.is_initialized() else None
        start = time.perf_counter()
        with PeakRss() as peak, kernels():
            metrics = trainer.train_step(data)
        seconds = time.perf_counter() - start
        losses.append(metrics["train/loss"])
        if last:
            result = {
                "rank": rank, "rss_imported_mb": imported, "rss_built_mb": built, "rss_before_mb": before,
                "rss_peak_mb": peak.peak, "step_s": seconds, "losses": losses,
                "state_mb": state_bytes(trainer) / 2**20,
                "params": sum(p.numel() for p in trainer.policy.parameters()),
                "tokens": sum(len(s.token_ids) for s in data.samples), "padding": metrics["train/padding"],
            }
    return result


def _rank(rank: int, world: int, store: str, job: dict[str, Any]) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        # one trainer after another in this process (the equality runs, which read losses, not memory)
        for i, strategy in enumerate(job.get("strategies") or [None]):
            train = job["train"] if strategy is None else {**job["train"], "strategy": strategy}
            result = measure(rank, world, job["model_path"], train, job["lengths"], job["steps"], Path(job["out"]),
                             job.get("samples"), job.get("warmup", ()), job.get("bf16_via_float32", False))
            (Path(job["out"]) / f"rank{rank}{'' if strategy is None else '-' + strategy}.json").write_text(
                json.dumps(result))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def logprob_peak(hidden_size: int, vocab: int, tokens: int, chunk: int, out: Path) -> None:
    """One process: the peak RSS of log-probs + entropy forward and backward from `tokens` hidden states."""
    from rollart.trainer.logprobs import token_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(tokens, hidden_size, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    before = rss_mb()
    with PeakRss() as peak:
        logp, _ = token_logprobs(hidden, head, targets, chunk)
        logp.sum().backward()
    (out / f"logprobs-{chunk}.json").write_text(json.dumps({"chunk": chunk, "peak_mb": peak.peak - before}))


def _logprob_rank(rank: int, job: dict[str, Any]) -> None:
    logprob_peak(job["hidden_size"], job["vocab"], job["tokens"], job["chunk"], Path(job["out"]))
