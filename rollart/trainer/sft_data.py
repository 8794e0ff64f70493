"""Chat conversations → `TrainSample`s for supervised fine-tuning (the warm start on demonstrations).

In: a tokenizer with a chat template, and a conversation: a list of `{"role", "content"}` messages.
Out: a `TrainSample` whose `token_ids` are the template's tokens for the whole conversation and whose
`loss_mask` is 1 exactly on the tokens of assistant messages (their content up to and including the
end-of-message token — not the `<|im_start|>assistant` header before it nor the newline after it) — what the policy generates
at rollout time, so SFT and RL train the same tokens.

Guarantee: relies on the template's prefix property (ChatML templates such as the tiny model's have it): the tokens of messages[:k] plus the
generation prompt are a prefix of the tokens of messages[:k+1]; a template without it is an error.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rollart.types import TrainSample


def _ids(tokenizer: Any, messages: Sequence[Mapping[str, str]], generation_prompt: bool) -> list[int]:
    if not messages:
        return []
    return list(tokenizer.apply_chat_template(
        list(messages), tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
    ))


def conversation_sample(tokenizer: Any, messages: Sequence[Mapping[str, str]], sample_id: str = "sft") -> TrainSample:
    """Token ids of the conversation and a loss mask on its assistant messages."""
    if not any(m.get("role") == "assistant" for m in messages):
        raise ValueError(f"conversation {sample_id}: no assistant message to train on (roles: "
                         f"{[m.get('role') for m in messages]})")
    ids: list[int] = []
    mask: list[int] = []
    for k, message in enumerate(messages):
        assistant = message.get("role") == "assistant"
        before = _ids(tokenizer, messages[:k], generation_prompt=assistant)
        upto = _ids(tokenizer, messages[: k + 1], generation_prompt=False)
        if upto[: len(before)] != before or before[: len(ids)] != ids:
            raise ValueError(
                f"conversation {sample_id}: the chat template lacks the prefix property at message {k}; "
                "SFT needs the tokens of messages[:k] to be a prefix of those of messages[:k+1]"
            )
        mask.extend([0] * (len(before) - len(ids)))
        segment = upto[len(before):]
        trained = len(segment) if assistant else 0
        if assistant and tokenizer.eos_token_id in segment:  # not what the template adds after the stop token
            trained = len(segment) - segment[::-1].index(tokenizer.eos_token_id)
        mask.extend([1] * trained + [0] * (len(segment) - trained))
        ids = upto
    n = len(ids)
    return TrainSample(
        trajectory_id=sample_id, group_id=sample_id, domain="sft", token_ids=tuple(ids), loss_mask=tuple(mask),
        behaviour_logprobs=(0.0,) * n, token_versions=(-1,) * n, advantage=0.0, reward=0.0,
    )
