"""Token-in/token-out prompts under a chat template: each turn adds only new tokens.

In: a Hugging Face tokenizer with a chat template, observations (text) and the ids the model produced.
Out: the ids to append before each generation — turn 0: the whole templated first user message plus the
generation prompt; turn k+1: the end of the assistant message the model just wrote (whatever of the
template's closing text the model did not emit itself, e.g. the newline after `<|im_end|>`), the new
user message and the generation prompt. The model's ids are never decoded and re-encoded.

Guarantee (tested): when the model's ids are the canonical encoding of its text, the concatenation of
every turn's prompt ids and response ids equals a fresh tokenisation of the whole conversation under the
template. This relies on the template's prefix property (messages[:k] render to a prefix of
messages[:k+1]), which the constructor checks — a template that rewrites earlier turns (e.g. one that
strips reasoning from old assistant messages) is refused with a clear error.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Mapping, Sequence

_USER = "rollart-user-sentinel"
_ASSISTANT = "rollart-assistant-sentinel"

Message = Mapping[str, Any]


class ChatTokens:
    """Prompt pieces for one tokenizer and (optional) system prompt; stateless, share it freely."""

    def __init__(self, tokenizer: Any, system_prompt: str = "") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; token-in/token-out prompts need one")
        self.tokenizer = tokenizer
        self.system: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        head = self.render([{"role": "user", "content": _USER}], generation_prompt=True)
        self._base = self.render(
            [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}], generation_prompt=False
        )
        if not (self._base.startswith(head) and self._base[len(head) :].startswith(_ASSISTANT)):
            raise ValueError(
                "the chat template lacks the prefix property (a generation prompt followed by the assistant's "
                "text must render as the assistant message); token-in/token-out multi-turn needs it"
            )
        self.message_close = self._base[len(head) + len(_ASSISTANT) :]  # what ends a message: "<|im_end|>\n"
        self.end_token_id = self._end_token_id()
        eos = tokenizer.eos_token_id
        stops = [self.end_token_id] if self.end_token_id is not None else []
        self.stop_token_ids: tuple[int, ...] = tuple(stops + ([int(eos)] if eos is not None and eos not in stops else []))

    def _end_token_id(self) -> int | None:
        """The special token that ends an assistant message (<|im_end|> in ChatML), else the eos token."""
        for token in self.tokenizer.all_special_tokens:
            if token and self.message_close.startswith(token):
                return int(self.tokenizer.convert_tokens_to_ids(token))
        eos = self.tokenizer.eos_token_id
        return int(eos) if eos is not None else None

    def render(
        self, messages: Sequence[Message], generation_prompt: bool, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> str:
        """The template's text for `messages` (and `tools`, rendered where the template puts them)."""
        return self.tokenizer.apply_chat_template(
            self.system + [dict(m) for m in messages], tools=list(tools) if tools else None, tokenize=False,
            add_generation_prompt=generation_prompt,
        )

    def encode(self, text: str) -> list[int]:
        # a fast tokenizer's Rust backend gives the same ids ~4x faster than the Python wrapper; its batch
        # call lets go of the GIL while it works, so a long text tokenised on a thread stalls no other one
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @functools.cached_property
    def widest_token(self) -> tuple[int, int]:
        """(the most characters, the most UTF-8 bytes) that one token of the vocabulary decodes to, special
        tokens included: what `min_tokens` divides by. Decodes the whole vocabulary once (~0.3 s at 150 k)."""
        texts = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))], skip_special_tokens=False,
                                            clean_up_tokenization_spaces=False)
        return (max(1, max(map(len, texts), default=1)),
                max(1, max((len(t.encode("utf-8", "surrogatepass")) for t in texts), default=1)))

    def min_tokens(self, texts: Iterable[str]) -> int:
        """A lower bound on the tokens `texts` hold, without tokenising them (O(characters)): no token
        stands for more characters or bytes than `widest_token`; halved, since a normaliser may merge
        characters (NFC/NFKC compose a letter and its accent)."""
        chars = nbytes = 0
        for text in texts:
            chars += len(text)
            nbytes += len(text.encode("utf-8", "surrogatepass"))
        most_chars, most_bytes = self.widest_token
        return max(math.ceil(chars / most_chars), math.ceil(nbytes / most_bytes)) // 2

    def initial(self, observation: str) -> list[int]:
        """Ids of the first turn: (system prompt,) the first user message and the generation prompt."""
        return self.encode(self.render([{"role": "user", "content": observation}], generation_prompt=True))

    def follow_up(self, observation: str, last_response_ids: Sequence[int]) -> list[int]:
        """Ids to append after the model's last response: close its message, add the next user message."""
        full = self.render(
            [
                {"role": "user", "content": _USER},
                {"role": "assistant", "content": _ASSISTANT},
                {"role": "user", "content": observation},
            ],
            generation_prompt=True,
        )
        return self.encode(self.closing_after(last_response_ids) + full[len(self._base) :])

    def closing_after(self, response_ids: Sequence[int]) -> str:
        """The template's closing text that the model did not emit (all of it if it stopped on length)."""
        if response_ids and response_ids[-1] in self.stop_token_ids:
            emitted = self.tokenizer.convert_ids_to_tokens(int(response_ids[-1]))
            if self.message_close.startswith(emitted):
                return self.message_close[len(emitted) :]
        return self.message_close

    def response_text(self, response_ids: Sequence[int]) -> str:
        """The model's text (special tokens such as the stop token dropped): what the env receives."""
        return self.tokenizer.decode(list(response_ids), skip_special_tokens=True)

    def assistant_ids(self, text: str) -> list[int]:
        """Ids a model emits to say `text` and stop: its encoding plus the stop token (for demonstrations)."""
        return self.encode(text) + ([self.end_token_id] if self.end_token_id is not None else [])

    def conversation(self, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of an alternating user/assistant conversation laid out exactly as a rollout:
        prompt ids masked 0, assistant ids (text + stop token) masked 1. For supervised warm starts."""
        ids: list[int] = []
        mask: list[int] = []
        last: list[int] = []
        for i, message in enumerate(messages):
            role = message["role"]
            if role == "user":
                piece = self.initial(message["content"]) if i == 0 else self.follow_up(message["content"], last)
                ids += piece
                mask += [0] * len(piece)
            elif role == "assistant":
                last = self.assistant_ids(message["content"])
                ids += last
                mask += [1] * len(last)
            else:
                raise ValueError(f"conversation: message {i} has role {role!r}; expected user or assistant")
        return ids, mask
