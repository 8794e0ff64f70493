"""Token-in/token-out prompts under the model's own chat template: each turn adds only new tokens.

In: a Hugging Face tokenizer with a chat template, the domain's system prompt and thinking switch, observations
(text) and the ids the model produced. Out: the ids to append before each generation — turn 0: the whole
templated first prompt (system prompt, the first user message or a row's whole chat, the generation prompt);
turn k+1: the end of the assistant message the model just wrote (whatever of the template's closing text the
model did not emit itself, e.g. the newline after `<|im_end|>`), the template's tokens for the new user
message, and the generation prompt. The model's ids are never decoded and re-encoded, and earlier turns are
never rendered again: the ids trained on are the ids generated.

How the new message's tokens are found: the template renders [user, assistant, new user] with sentinel texts
for the first two, and everything after the assistant's sentinel is what a new user message adds. That holds
for templates that render an earlier turn differently once a later one follows — Qwen3's strips the
reasoning (`<think>…</think>`) of earlier assistant messages, so re-rendering a conversation changes the ids
the model actually saw, the field's most reported multi-turn bug; here the context keeps them.

Guarantee (tested): for a template with the prefix property (messages[:k] render to a prefix of
messages[:k+1], e.g. ChatML) and a model whose ids are the canonical encoding of its text, the concatenation
of every turn's prompt and response ids equals a fresh tokenisation of the whole conversation. For any
template, turn k+1's context is turn k's context, then the model's ids, then the new message's tokens.

`thinking` (None = the template's default) passes `enable_thinking` to templates that have that switch
(Qwen3's: false adds an empty `<think></think>` to the generation prompt); asking for it with a template
that has no such switch is an error.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Mapping, Sequence

INITIAL_CACHE = 256  # first-turn prompts remembered per ChatTokens (a few groups' worth)
_USER = "rollart-user-sentinel"
_ASSISTANT = "rollart-assistant-sentinel"

Message = Mapping[str, Any]


def has_thinking_switch(template: str | None) -> bool:
    """Whether a chat template reads `enable_thinking` (thinking on/off, as Qwen3's does)."""
    return bool(template) and "enable_thinking" in str(template)


class ChatTokens:
    """Prompt pieces for one tokenizer, system prompt and thinking switch; stateless, share it freely."""

    def __init__(self, tokenizer: Any, system_prompt: str = "", thinking: bool | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; token-in/token-out prompts need one")
        if thinking is not None and not has_thinking_switch(tokenizer.chat_template):
            raise ValueError(f"thinking={thinking}: this model's chat template has no thinking switch "
                             "(enable_thinking); leave the domain's `thinking` unset")
        self.tokenizer = tokenizer
        self._initial: dict[str, tuple[int, ...]] = {}  # observation → its first turn's ids (`initial`)
        self.system: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.template_kwargs: dict[str, Any] = {"enable_thinking": thinking} if thinking is not None else {}
        closed = self.render([{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}],
                             generation_prompt=False)
        if _ASSISTANT not in closed:
            raise ValueError("the chat template does not render an assistant message's content; token-in/token-out "
                             "multi-turn needs it")
        self.message_close = closed[closed.rindex(_ASSISTANT) + len(_ASSISTANT) :]  # e.g. "<|im_end|>\n"
        if not self._new_message_text("x").startswith(self.message_close):
            raise ValueError("the chat template closes an assistant message differently when another message "
                             "follows; token-in/token-out multi-turn cannot tell which tokens end the model's turn")
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
        self, messages: Sequence[Message], generation_prompt: bool, tools: Sequence[Mapping[str, Any]] | None = None,
        thinking: bool | None = None,
    ) -> str:
        """The template's text for `messages` (and `tools`, rendered where the template puts them), after the
        system prompt unless the messages begin with their own. `thinking` overrides the thinking switch for
        this rendering (an agent's per-request reasoning effort; ignored by a template without the switch)."""
        own_system = bool(messages) and messages[0].get("role") == "system"
        kwargs = self.template_kwargs
        if thinking is not None and self.has_thinking_switch:
            kwargs = {**kwargs, "enable_thinking": thinking}
        return self.tokenizer.apply_chat_template(
            ([] if own_system else self.system) + [dict(m) for m in messages], tools=list(tools) if tools else None,
            tokenize=False, add_generation_prompt=generation_prompt, **kwargs,
        )

    @functools.cached_property
    def has_thinking_switch(self) -> bool:
        return has_thinking_switch(self.tokenizer.chat_template)

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
        """Ids of the first turn: (system prompt,) the first user message and the generation prompt. Remembered
        for the last `INITIAL_CACHE` observations: a group's members start from one observation, and rendering
        the template and tokenising it was most of an env worker's own work on a single-turn trajectory."""
        ids = self._initial.get(observation)
        if ids is None:
            ids = tuple(self.encode(self.render([{"role": "user", "content": observation}], generation_prompt=True)))
            if len(self._initial) >= INITIAL_CACHE:
                self._initial.pop(next(iter(self._initial), None), None)  # the oldest (insertion order)
            self._initial[observation] = ids
        return list(ids)

    def initial_messages(self, messages: Sequence[Message]) -> list[int]:
        """Ids of a first turn that starts from a whole chat (a dataset row's messages): the chat as the
        template renders it (the system prompt first unless the chat has its own) and the generation prompt."""
        return self.encode(self.render(messages, generation_prompt=True))

    def _new_message_text(self, observation: str) -> str:
        """The template's text after an assistant message's content when a user message follows: the rest of
        the assistant message, the user message and the generation prompt."""
        full = self.render(
            [
                {"role": "user", "content": _USER},
                {"role": "assistant", "content": _ASSISTANT},
                {"role": "user", "content": observation},
            ],
            generation_prompt=True,
        )
        return full[full.index(_ASSISTANT) + len(_ASSISTANT) :]

    def follow_up(self, observation: str, last_response_ids: Sequence[int]) -> list[int]:
        """Ids to append after the model's last response: close its message, add the next user message."""
        after = self._new_message_text(observation)[len(self.message_close) :]
        return self.encode(self.closing_after(last_response_ids) + after)

    # --- lengths, for dataset filters (rollart.envs.dataset.rows.PromptMeter) -------------------------------
    def overhead(self, messages: int) -> int:
        """Tokens of the template around `messages` (≥ 1) empty user messages, system and generation prompt
        included."""
        return len(self.encode(self.render([{"role": "user", "content": ""}] * max(1, messages), True)))

    def count(self, prompts: Sequence[str | Sequence[Message]]) -> list[int]:
        """First-prompt tokens of each user message (text) or chat (a list of messages)."""
        texts = [self.render([{"role": "user", "content": p}] if isinstance(p, str) else list(p), True) for p in prompts]
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return [len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)]
        return [len(self.encode(t)) for t in texts]

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
        """(ids, loss mask) of a conversation laid out exactly as a rollout: the messages before the first
        assistant message are the first prompt (one user message, or a chat with its own system message as a
        dataset row starts), then assistant and user messages alternate; prompt ids masked 0, assistant ids
        (text + stop token) masked 1. For supervised warm starts."""
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        head = messages[:first]
        if len(head) == 1 and head[0]["role"] == "user":
            ids = self.initial(head[0]["content"])
        elif head:
            ids = self.initial_messages(head)
        else:
            raise ValueError("conversation: it starts with an assistant message; a prompt must come first")
        mask = [0] * len(ids)
        last: list[int] = []
        for i, message in enumerate(messages[first:], start=first):
            role = message["role"]
            if role == "user":
                piece = self.follow_up(message["content"], last)
                ids += piece
                mask += [0] * len(piece)
            elif role == "assistant":
                last = self.assistant_ids(message["content"])
                ids += last
                mask += [1] * len(last)
            else:
                raise ValueError(f"conversation: message {i} has role {role!r}; expected user or assistant")
        return ids, mask
