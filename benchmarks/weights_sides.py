"""The two sides of `rollart bench weights`, shared by its full-model rows (weights.py) and its sharded rows
(weights_shards.py): the models it builds, a digest of a model's weights, and the inference actor that generates
without pause while it pulls versions in the background and swaps them at a suspend."""

from __future__ import annotations

import asyncio
import threading
import time

import ray
import torch

from rollart.config import ModelConfig
from rollart.models import load_model, resolve_model_path
from rollart.models.lora import merged_weights
from rollart.types import LoraAdapter

BATCH, PROMPT, NEW_TOKENS = 16, 16, 32
HUNDRED_M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4, head_dim=64)
TIMEOUT_S = 300.0


def build_model(spec: str, seed: int = 0) -> torch.nn.Module:
    """`tiny`: the built-in default model; `100m`: a Qwen3 of ~100 M parameters from a config (random init)."""
    if spec == "tiny":
        return load_model(resolve_model_path(ModelConfig(), seed))
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**HUNDRED_M, tie_word_embeddings=True, max_position_embeddings=512))


def digest(model: torch.nn.Module) -> bytes:
    """Bytes of every weight, hashed: equal digests mean bit-identical weights."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


@ray.remote(num_cpus=0)
class InferenceSide:
    """Generates in a background thread; pulls in another; suspends at decode-step boundaries."""

    def __init__(self, spec: str, subscriber: Any, copy_swap: bool) -> None:
        torch.set_num_threads(1)
        self.model = build_model(spec).eval()
        self.base = {n: p.detach().clone() for n, p in self.model.named_parameters()}  # what adapters merge into
        self.sub, self.copy_swap = subscriber, copy_swap
        self.vocab = self.model.config.vocab_size
        self.cond = threading.Condition()
        self.paused = self.stopped = False
        self.batches = 0
        self.staged: tuple[int, tuple[dict[str, torch.Tensor], bool]] | None = None  # a pulled, prepared version
        self.background_pull = False
        self.pull_s: list[float] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._generate, daemon=True),
                        threading.Thread(target=self._poll, daemon=True)]
        for thread in self.threads:
            thread.start()

    # --- background work -------------------------------------------------------------------------
    def _boundary(self) -> None:
        with self.cond:
            while self.paused and not self.stop.is_set():
                self.stopped = True
                self.cond.notify_all()
                self.cond.wait(timeout=1.0)
            self.stopped = False

    def _generate(self) -> None:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            while not self.stop.is_set():
                self._boundary()
                out = self.model(input_ids=torch.randint(3, self.vocab, (BATCH, PROMPT), generator=g), use_cache=True)
                for _ in range(NEW_TOKENS):
                    self._boundary()
                    tok = out.logits[:, -1:].argmax(-1)
                    out = self.model(input_ids=tok, cache=out.cache, use_cache=True)
                with self.cond:
                    self.batches += 1
                    self.cond.notify_all()

    def _poll(self) -> None:
        while not self.stop.is_set():
            if self.background_pull:
                v = asyncio.run(self.sub.latest_version())  # the subscriber's calls are coroutines
                if v > self.sub.version:
                    tensors = asyncio.run(self.sub.pull(v))
                    self.pull_s.append(self.sub.last_metrics["time/weights.pull"])
                    tensors = self._prepare(tensors)  # off the stop, as the worker's prefetch does
                    with self.cond:
                        self.staged = (v, tensors)
                        self.cond.notify_all()
            time.sleep(0.02)

    # --- driver calls ----------------------------------------------------------------------------
    def set_background_pull(self, on: bool) -> None:
        self.background_pull = on

    def suspend(self) -> None:
        with self.cond:
            self.paused = True
            if not self.cond.wait_for(lambda: self.stopped, timeout=TIMEOUT_S):
                raise TimeoutError("generation did not reach a decode-step boundary")

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def wait_batches(self, n: int) -> float:
        """Block until `n` more generation batches are done (the rollout of the next batch); seconds."""
        start = time.perf_counter()
        with self.cond:
            target = self.batches + n
            if not self.cond.wait_for(lambda: self.batches >= target, timeout=TIMEOUT_S):
                raise TimeoutError("rollout did not finish")
        return time.perf_counter() - start

    def _prepare(self, tensors: dict[str, torch.Tensor] | LoraAdapter) -> tuple[dict[str, torch.Tensor], bool]:
        """The weights to load, and whether they are only some of them (an adapter merged from the kept base,
        like the engine's `prepare_weights`)."""
        if isinstance(tensors, LoraAdapter):
            return merged_weights(self.base, tensors), True
        return tensors, False

    def _swap(self, tensors: dict[str, torch.Tensor] | LoraAdapter | tuple[dict[str, torch.Tensor], bool]) -> float:
        start = time.perf_counter()
        weights, partial = tensors if isinstance(tensors, tuple) else self._prepare(tensors)  # naive: merge now
        self.model.load_state_dict(weights, strict=not partial, assign=not self.copy_swap)
        return time.perf_counter() - start

    def pull_and_swap(self, version: int) -> dict[str, float]:
        """The naive path's second half (generation is stopped by the driver)."""
        tensors = asyncio.run(self.sub.pull(version))
        return {"pull": self.sub.last_metrics["time/weights.pull"], "swap": self._swap(tensors)}

    def suspend_swap_resume(self, version: int) -> dict[str, float]:
        """The overlapped path's stop: wait for the background pull if needed, swap, resume."""
        self.suspend()
        start = time.perf_counter()
        with self.cond:
            if not self.cond.wait_for(lambda: self.staged is not None and self.staged[0] >= version,
                                      timeout=TIMEOUT_S):
                raise TimeoutError(f"the background pull of v{version} did not finish")
            _, tensors = self.staged
            self.staged = None
        waited = time.perf_counter() - start
        swap = self._swap(tensors)
        exposed = time.perf_counter() - start
        self.resume()
        return {"exposed": exposed, "waited": waited, "swap": swap, "pull": self.pull_s[-1]}

    def digest(self) -> bytes:
        return digest(self.model)

    def latest(self) -> int:
        """The subscriber's newest version (its first call starts a collective subscriber's receiving)."""
        return asyncio.run(self.sub.latest_version())

    def weights_mb(self) -> float:
        return sum({t.data_ptr(): t.nbytes for t in self.model.state_dict().values()}.values()) / 2**20

    def row_hashes(self, names: list[str], rank: int, world: int) -> dict[str, str]:
        """Per tensor, a hash of the rows sender `rank` of `world` holds (weights_shards.py checks them)."""
        import hashlib

        from rollart.base.shards import row_range

        state, out = self.model.state_dict(), {}
        for name in names:
            t = state[name].detach()
            start, stop = row_range(t.shape[0] if t.dim() else 1, rank, world)
            rows = t[start:stop] if t.dim() else t.reshape(1)[start:stop]
            out[name] = hashlib.sha256(rows.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        return out

    def close(self) -> None:
        """Stop both threads and wait for them (a thread still in a forward pass when the actor is killed
        aborts the process)."""
        self.stop.set()
        self.resume()
        for thread in self.threads:
            thread.join(timeout=TIMEOUT_S)
            if thread.is_alive():
                raise TimeoutError(f"bench weights: the inference side's {thread.name} thread did not stop in "
                                   f"{TIMEOUT_S:.0f} s (a pull or a forward pass hung); killing the actor may abort it")

