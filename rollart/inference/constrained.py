"""Constrained decoding for the built-in engine: a request's grammar as a mask on its next-token logits.

In: a request's `SamplingParams.grammar` — a grammar in llguidance's Lark dialect (`start: ...`; a JSON schema
is embedded as `%json{...}`; a single token by id as `<[123]>`) — the engine's tokenizer and vocabulary size.
Out: per request, a `GrammarMask` that, before each token, sets to -inf the logits of every token the
grammar does not allow next (and of the request's stop tokens until the grammar accepts), and is advanced
with each sampled token.

Guarantees: a request's output under a grammar is a sentence of it, or a prefix of one when it ends on
`max_new_tokens` (finish reason `length`) — the stop tokens are allowed exactly where the grammar accepts, and
once it can go no further they are the only tokens allowed. The tokens trained on are the ones sampled under
the mask, and their behaviour logprobs are those of the masked, renormalised distribution (the distribution
sampled from, as `rollart.inference.sampling` defines it; vLLM's processed logprobs under structured outputs
are the same). A grammar that does not compile is a ValueError from the engine's `add` naming
`sampling.grammar`; nothing here raises on model output.

Why llguidance (Microsoft's grammar engine, also vLLM's `guidance` structured-output backend, so both engines
read one grammar language): a 3 MB wheel with no dependencies that computes a token bitmask on the CPU in
microseconds into a buffer we own. xgrammar, the other well-kept choice, requires `triton` on Linux x86-64
(about 1 GB installed) for kernels a CPU engine never runs. llguidance's own torch helper compiles its
mask kernel with `torch.compile`; the mask is applied here with numpy's `unpackbits` and one `masked_fill`.
"""

from __future__ import annotations

from typing import Any, Collection

import numpy as np
import torch

LOG_LEVEL = 0  # llguidance's own warnings (grammar lints) would go to stderr per request


class GrammarCompiler:
    """One engine's llguidance tokenizer (built once: ~1 s at a 150 k vocabulary) and its matchers."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        self.vocab_size = vocab_size
        eos = tokenizer.eos_token_id
        self.eos = int(eos if eos is not None else 0)
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=self.eos)

    def check(self, grammar: str) -> None:
        """ValueError naming `sampling.grammar` when the grammar does not compile."""
        error, messages = self._llg.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if error:
            raise ValueError(f"sampling.grammar is invalid: {'; '.join(messages)[:500]}")

    def mask(self, grammar: str, stop_ids: Collection[int]) -> GrammarMask:
        matcher = self._llg.LLMatcher(self.tokenizer, grammar, log_level=LOG_LEVEL)
        if matcher.is_error():
            raise ValueError(f"sampling.grammar is invalid: {matcher.get_error()[:500]}")
        return GrammarMask(matcher, self.vocab_size, self.eos, stop_ids)


class GrammarMask:
    """A request's matcher: `apply` masks its logits row before a token, `advance` takes the token sampled."""

    def __init__(self, matcher: Any, vocab_size: int, eos: int, stop_ids: Collection[int]) -> None:
        self.matcher, self.vocab_size, self.eos = matcher, vocab_size, eos
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def allowed(self) -> torch.Tensor:
        """(vocab,) bool: the tokens the grammar allows next; the stop tokens where it accepts."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab_size]
        allowed = torch.from_numpy(bits.astype(bool))
        accepting = bool(allowed[self.eos]) or self.matcher.is_accepting()
        allowed[self.eos] = False  # llguidance's end-of-sequence: the request's own stop tokens stand for it
        if accepting or not bool(allowed.any()):  # (nothing allowed: the matcher failed — end the output)
            allowed[self.stop_ids] = True
        return allowed

    def apply(self, logits: torch.Tensor) -> None:
        """Set the logits (one row, in place) of every token not allowed next to -inf."""
        allowed = self.allowed().to(logits.device)
        logits[: self.vocab_size].masked_fill_(~allowed, float("-inf"))
        logits[self.vocab_size :] = float("-inf")

    def advance(self, token: int) -> None:
        if int(token) not in self.stop_ids.tolist():
            self.matcher.consume_token(int(token))
