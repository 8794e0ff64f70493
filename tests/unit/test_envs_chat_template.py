"""The model's own chat template, token-in/token-out across turns, with Qwen3's real Jinja template (kept as
text in tests/fixtures, with a tokenizer trained here on Qwen3's special tokens): each next prompt is the
previous ids, the model's ids exactly, and the template's tokens for the new message — on conversations where
re-tokenising the conversation would change the ids (Qwen3 drops earlier turns' reasoning; a model may emit a
non-canonical split of its text). System prompt and the thinking switch come from the template."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollart.config import DomainConfig, EnvsConfig
from rollart.envs.chat import ChatTokens, has_thinking_switch
from rollart.envs.manager import EnvManager
from rollart.models import build_tokenizer
from rollart.types import GenerationRequest, GenerationResult, SamplingParams, Status, Task

QWEN3_TEMPLATE = (Path(__file__).parents[1] / "fixtures" / "qwen3_chat_template.jinja").read_text()
CORPUS = ["How many apples are there? Count them and answer.", "Let me count the apples: one, two, three.",
          "The answer is \\boxed{3}.", "Now add one more apple. How many now?", "apples app les"] * 50


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    """A byte-level BPE trained here, with Qwen3's special tokens and its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])  # not special in Qwen3 either
    fast.chat_template = QWEN3_TEMPLATE
    return fast


def model_ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def test_qwen3s_template_is_accepted_and_the_new_message_is_its_own_tokens(qwen3_tokenizer) -> None:
    chat = ChatTokens(qwen3_tokenizer)
    tok = qwen3_tokenizer
    assert has_thinking_switch(QWEN3_TEMPLATE) and chat.message_close == "<|im_end|>\n"
    first = chat.initial("How many apples?")
    assert tok.decode(first) == "<|im_start|>user\nHow many apples?<|im_end|>\n<|im_start|>assistant\n"
    response = model_ids(tok, "<think>\nLet me count the apples.\n</think>\n\nThe answer is \\boxed{3}.")
    follow = chat.follow_up("Now add one more apple.", response)
    assert tok.decode(follow) == "\n<|im_start|>user\nNow add one more apple.<|im_end|>\n<|im_start|>assistant\n"
    # re-rendering the conversation gives other ids: Qwen3 drops the reasoning of an earlier assistant turn
    context = first + response + follow
    rerendered = tok.apply_chat_template(
        [{"role": "user", "content": "How many apples?"},
         {"role": "assistant", "content": tok.decode(response, skip_special_tokens=True)},
         {"role": "user", "content": "Now add one more apple."}], add_generation_prompt=True, tokenize=True,
        return_dict=False)
    assert rerendered != context and "Let me count" in tok.decode(context) and "Let me count" not in tok.decode(rerendered)


def test_a_first_prompt_is_remembered_per_observation_and_each_caller_gets_its_own_list(qwen3_tokenizer,
                                                                                      monkeypatch) -> None:
    import rollart.envs.chat as chat_module

    monkeypatch.setattr(chat_module, "INITIAL_CACHE", 2)
    chat = ChatTokens(qwen3_tokenizer, system_prompt="Be brief.")
    rendered: list[str] = []
    render = chat.render
    monkeypatch.setattr(chat, "render", lambda *a, **k: rendered.append(a[0][-1]["content"]) or render(*a, **k))
    first = chat.initial("How many apples?")
    first.append(-1)  # a caller's list is its own: the next caller is not handed this change
    again = chat.initial("How many apples?")
    assert again == first[:-1] and rendered == ["How many apples?"]  # a group's second member: no rendering
    assert again == qwen3_tokenizer.encode(chat.render([{"role": "user", "content": "How many apples?"}], True),
                                           add_special_tokens=False)
    chat.initial("A?"), chat.initial("B?")  # the cache holds two: the oldest goes
    chat.initial("How many apples?")
    assert rendered.count("How many apples?") == 3  # 2 by the initial() calls + 1 by the check above


def test_thinking_off_and_the_system_prompt_come_from_the_template(qwen3_tokenizer) -> None:
    tok = qwen3_tokenizer
    chat = ChatTokens(tok, system_prompt="Answer in \\boxed{}.", thinking=False)
    assert tok.decode(chat.initial("How many apples?")) == (
        "<|im_start|>system\nAnswer in \\boxed{}.<|im_end|>\n<|im_start|>user\nHow many apples?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(chat.follow_up("More?", model_ids(tok, "3"))).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(ChatTokens(tok, thinking=True).initial("Hi")).endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="thinking=False: this model's chat template has no thinking switch"):
        ChatTokens(build_tokenizer(), thinking=False)  # the tiny model's ChatML has none


class TwoQuestions:
    """Asks, then asks a follow-up; ends after the second answer."""

    def reset(self, seed=None):
        self.turn = 0
        return "How many apples are there?", {}

    def step(self, action):
        self.turn += 1
        return "Now add one more apple. How many now?", 0.0, self.turn >= 2, False, {}


class ScriptedLLM:
    """Returns fixed ids per turn — a non-canonical split of 'apples' on the first (app + les), reasoning on
    both — and records each request's context."""

    def __init__(self, tok) -> None:
        pieces = [tok.encode("<think>\nLet me count the ", add_special_tokens=False),
                  tok.encode("app", add_special_tokens=False), tok.encode("les", add_special_tokens=False),
                  tok.encode(".\n</think>\n\nThe answer is \\boxed{3}.", add_special_tokens=False)]
        self.responses = [[i for p in pieces for i in p] + [tok.convert_tokens_to_ids("<|im_end|>")],
                          model_ids(tok, "<think>\nOne more.\n</think>\n\n\\boxed{4}")]
        self.contexts: list[tuple[int, ...]] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        ids = self.responses[len(self.contexts)]
        self.contexts.append(request.prompt_token_ids)
        return GenerationResult(request.request_id, request.trajectory_id, tuple(ids), (-0.5,) * len(ids),
                                (1,) * len(ids), "stop", len(request.prompt_token_ids))

    async def abort(self, trajectory_id: str) -> None:
        pass


def test_across_turns_the_ids_trained_on_are_the_ids_generated(qwen3_tokenizer) -> None:
    tok = qwen3_tokenizer
    chat = ChatTokens(tok)
    llm = ScriptedLLM(tok)
    first_text = tok.decode(llm.responses[0], skip_special_tokens=True)
    assert tok.encode(first_text, add_special_tokens=False) != llm.responses[0][:-1]  # not the canonical split
    manager = EnvManager(Task("t", "apples", "x", 0, "g"), 0, make_env=TwoQuestions, domain_cfg=DomainConfig(
        env="x", max_turns=4, max_new_tokens=64), envs=EnvsConfig(), llm=llm, chat=chat,
        sampling=SamplingParams(max_new_tokens=64, stop_token_ids=chat.stop_token_ids))
    traj = asyncio.run(manager.run())
    assert traj.status is Status.COMPLETED and len(traj.turns) == 2
    t0, t1 = traj.turns
    assert [list(t.response_token_ids) for t in traj.turns] == llm.responses  # trained on = generated
    assert list(llm.contexts[0]) == list(t0.prompt_token_ids) == chat.initial("How many apples are there?")
    # the second prompt: the first context, the model's ids exactly, the template's tokens for the new message
    assert list(llm.contexts[1]) == list(t0.prompt_token_ids) + llm.responses[0] + list(t1.prompt_token_ids)
    assert tok.decode(list(t1.prompt_token_ids)) == (
        "\n<|im_start|>user\nNow add one more apple. How many now?<|im_end|>\n<|im_start|>assistant\n")
    assert traj.token_ids() == list(llm.contexts[1]) + llm.responses[1]
    assert traj.loss_mask() == [0] * len(t0.prompt_token_ids) + [1] * len(llm.responses[0]) + \
        [0] * len(t1.prompt_token_ids) + [1] * len(llm.responses[1])
    # re-tokenising the conversation would have changed them: reasoning dropped, 'apples' merged
    rerendered = tok.apply_chat_template(
        [{"role": "user", "content": "How many apples are there?"}, {"role": "assistant", "content": first_text},
         {"role": "user", "content": "Now add one more apple. How many now?"}], add_generation_prompt=True,
        tokenize=True, return_dict=False)
    assert rerendered != list(llm.contexts[1])


def test_a_warm_start_conversation_is_laid_out_as_a_rollout_under_qwen3(qwen3_tokenizer) -> None:
    tok = qwen3_tokenizer
    chat = ChatTokens(tok, system_prompt="Be brief.")
    messages = [{"role": "user", "content": "How many apples?"}, {"role": "assistant", "content": "\\boxed{3}"},
                {"role": "user", "content": "One more?"}, {"role": "assistant", "content": "\\boxed{4}"}]
    ids, mask = chat.conversation(messages)
    a0, a1 = chat.assistant_ids("\\boxed{3}"), chat.assistant_ids("\\boxed{4}")
    p0 = chat.initial("How many apples?")
    p1 = chat.follow_up("One more?", a0)
    assert ids == p0 + a0 + p1 + a1 and mask == [0] * len(p0) + [1] * len(a0) + [0] * len(p1) + [1] * len(a1)
