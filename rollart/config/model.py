"""The `model` section: the policy checkpoint, or the built-in tiny model (read where models load).

In: `Section` and the trust markers (`base`), the bounds (`bounds`). Out: `ModelConfig`, `TinyModelConfig`.

Guarantee: an empty `model.path` always names a model: the built-in tiny one, whose shape `model.tiny` holds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart.config.base import TRUST_GUARD, Section
from rollart.config.bounds import MAX_TOKENS, MAX_VOCAB


class TinyModelConfig(Section):
    """The built-in tiny Qwen3-architecture model used when `model.path` is empty."""

    hidden_size: int = Field(128, gt=0, le=65_536, description="width of the residual stream")
    num_layers: int = Field(2, gt=0, le=1024, description="transformer blocks")
    num_heads: int = Field(4, gt=0, le=1024, description="attention heads (head dimension = hidden_size / num_heads)")
    num_kv_heads: int = Field(
        2, gt=0, le=1024, description="key/value heads (grouped-query attention; divides num_heads)"
    )
    intermediate_size: int = Field(384, gt=0, le=262_144, description="width of the MLP's hidden layer")
    vocab_size: int = Field(1024, ge=300, le=MAX_VOCAB, description="BPE vocabulary incl. special tokens")
    max_position_embeddings: int = Field(
        4096, gt=0, le=MAX_TOKENS, description="longest context the model accepts, in tokens"
    )
    tool_calls: bool = Field(
        False, description="train the tokenizer on tool-call JSON and add <tool_call>/<tool_response> tokens, so "
        "the tiny model can learn tool use (agent domains with tools); off keeps the default model unchanged"
    )


class ModelConfig(Section):
    """The policy model: a local Hugging Face checkpoint, or the built-in tiny one."""

    path: str = Field(
        "", description="a local Hugging Face checkpoint directory, or a hub id (org/name, e.g. Qwen/Qwen3-8B) "
        "resolved through the Hugging Face cache (downloaded unless HF_HUB_OFFLINE is set); empty = built-in "
        "tiny model. Safetensors weights only"
    )
    revision: str = Field("", description="hub ids: the branch, tag or commit to use; empty = the repo's default")
    trust_remote_code: bool = Field(
        False, description="let a checkpoint that names its own code (config.json or tokenizer_config.json "
        "auto_map) run it when it loads (the run's own checkpoints of it too); off, such a checkpoint is refused",
        json_schema_extra=TRUST_GUARD,
    )
    adapter: str = Field(
        "", description="a PEFT LoRA adapter directory merged into model.path's weights when inference loads "
        "them (`rollart eval` sets it for a LoRA checkpoint); empty = none"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype the trainer and the inference engines hold the weights in"
    )
    tiny: TinyModelConfig = TinyModelConfig()
