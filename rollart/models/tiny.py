"""Build the tiny demo/test model and its tokenizer locally (no hub download is possible here).

In: `TinyModelConfig` and a seed. Out: a byte-level BPE `PreTrainedTokenizerFast` with a ChatML chat
template, and a randomly initialised `Qwen3ForCausalLM`, saved together as a normal Hugging Face
checkpoint (safetensors) that `AutoModelForCausalLM.from_pretrained` and vLLM load unchanged.

Guarantees: the same config and seed give bit-identical weights and the same tokenizer; byte-level BPE
encodes any text (no unknown tokens); the template has the prefix property token-in/token-out relies on
(the tokens of messages[:k] are a prefix of those of messages[:k+1]).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from rollart.config import TinyModelConfig

BUILD_VERSION = 2  # part of the checkpoint cache key: bump when the tokenizer or template changes
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# ChatML; with `tools`, the Hermes/Qwen tool-call family: the tool schemas in a system message, each call
# written `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, tool results as a user message
# of `<tool_response>` blocks. A conversation without tools renders exactly as plain ChatML.
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{{ '\n\n' }}{% endif %}"
    "# Tools\n<tools>"
    "{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\n' }}</tools>\nTo call a tool, write <tool_call>\n"
    '{"name": <tool name>, "arguments": <JSON object>}'
    "{{ '\n' }}</tool_call><|im_end|>{{ '\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools and loop.first %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\n' }}<tool_response>{{ '\n' }}{{ message['content'] }}{{ '\n' }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>{{ '\n' }}{% endif %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "<|im_start|>assistant{{ '\n' }}{% if message['content'] %}{{ message['content'] }}{{ '\n' }}{% endif %}"
    "{% for call in message['tool_calls'] %}{% set fn = call['function'] if call['function'] is defined else call %}"
    "{% if not loop.first %}{{ '\n' }}{% endif %}"
    '<tool_call>{{ \'\\n\' }}{"name": "{{ fn[\'name\'] }}", "arguments": {{ fn[\'arguments\'] | tojson }}}'
    "{{ '\n' }}</tool_call>{% endfor %}<|im_end|>{{ '\n' }}"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _builtin_corpus(seed: int = 0, lines: int = 6000) -> list[str]:
    """Text shaped like what the built-in domains say: grids, arithmetic, short code, instructions."""
    rng = random.Random(seed)
    words = (
        "you are an agent on a frozen lake grid reach the goal avoid holes move one step action answer "
        "left right up down push box target wall player solve compute what is the value of write a python "
        "function that returns given list string number sum product difference each tests pass result "
        "observation reward invalid format think step final boxed the a of to in and is with for from"
    ).split()
    code = [
        "def f(x):\n    return x + 1\n",
        "def solve(nums):\n    return sum(n for n in nums if n % 2 == 0)\n",
        "def rev(s):\n    return s[::-1]\n",
        "for i in range(10):\n    if i > 3:\n        print(i)\n",
        "assert solve([1, 2, 3, 4]) == 6\n",
        "class Node:\n    def __init__(self, value):\n        self.value = value\n",
    ]
    out = []
    for _ in range(lines):
        kind = rng.randrange(4)
        if kind == 0:
            n = rng.randint(3, 6)
            row = lambda: "".join(rng.choice("SFFFHG") for _ in range(n))  # noqa: E731
            out.append("\n".join(row() for _ in range(n)) + f"\nAction: \\boxed{{{rng.choice(['Left','Right','Up','Down'])}}}")
        elif kind == 1:
            a, b = rng.randint(0, 999), rng.randint(0, 99)
            op = rng.choice("+-*")
            out.append(f"What is {a} {op} {b}? The answer is \\boxed{{{eval(f'{a}{op}{b}')}}}.")
        elif kind == 2:
            out.append(rng.choice(code))
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))).capitalize() + ".")
    return out


def _tool_corpus(seed: int = 1, lines: int = 1500) -> list[str]:
    """Tool schemas, tool-call JSON and tool results, so BPE learns merges for the tool-call format."""
    rng = random.Random(seed)
    names = ("calculator", "search", "lookup", "get_weather", "python", "read_file")
    keys = ("expression", "query", "city", "code", "path", "value")
    out = []
    for _ in range(lines):
        name, key, kind = rng.choice(names), rng.choice(keys), rng.randrange(3)
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        value = rng.choice([f"{a}{rng.choice('+-*')}{b}", " ".join(rng.choice(keys) for _ in range(2))])
        if kind == 0:
            out.append(json.dumps({"name": name, "arguments": {key: value}}))
        elif kind == 1:
            out.append(json.dumps({"type": "function", "function": {
                "name": name, "description": f"{name.replace('_', ' ').capitalize()} a {key}",
                "parameters": {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}}}))
        else:
            out.append(f"{a}\nTo call a tool, write\n{json.dumps({'name': name, 'arguments': {key: b}})}")
    return out


def build_tokenizer(vocab_size: int = 1024, extra_corpus: list[str] | None = None, tool_calls: bool = False):
    """A byte-level BPE tokenizer trained on the built-in corpus (plus `extra_corpus`), with ChatML.

    `tool_calls`: also learn merges on tool-call JSON and add `TOOL_TOKENS` as (non-special) tokens, so a
    tool call is a few dozen tokens rather than a hundred — what lets the tiny model learn tool use."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _builtin_corpus() + (_tool_corpus() if tool_calls else []) + list(extra_corpus or [])
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    if tool_calls:
        fast.add_tokens(list(TOOL_TOKENS))
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(tokenizer, cfg: TinyModelConfig, seed: int = 0):
    """A randomly initialised Qwen3ForCausalLM sized by `cfg`, matched to `tokenizer`'s vocabulary."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def init_tiny_checkpoint(out_dir: str | Path, cfg: TinyModelConfig | None = None, seed: int = 0) -> Path:
    """Build the tiny tokenizer and model and save them as a Hugging Face checkpoint in `out_dir`."""
    cfg = cfg or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(cfg.vocab_size, tool_calls=cfg.tool_calls)
    model = build_tiny_model(tokenizer, cfg, seed)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
