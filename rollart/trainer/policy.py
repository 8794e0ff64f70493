"""The trainer's model: a Hugging Face causal LM (a PEFT model under LoRA) behind one root module that turns a
micro-batch into the log-probabilities of its model tokens — and how that module is built, named and loaded.

In: a `MicroBatch`'s model input (padded or packed, trainer/packing.py) and its K selected positions.
Out from `PolicyModule`: log π(target) [K] (float32, with grad) and the entropy [K] (no grad): the decoder's
final hidden states at those positions against the LM head, `train.logprob_chunk_tokens` at a time
(trainer/logprobs.py) — never logits for a whole micro-batch. Everything runs inside this root module's
forward, so a sharding strategy that gathers the root's parameters (the embedding, tied to the head) for
its forward holds them for the chunked head too. In the backward the root's parameters are read by the head
and the final norm only — the embedding lookup's gradient needs the token ids, not the weights — so once the
gradient reaches the final norm's input, `build_policy` has the strategy release them (`strategy.release`:
under fsdp2 the gathered copy is freed while the decoder layers run their backward, instead of at the end).
It does so only when every parameter outside the decoder layers belongs to a plain embedding, the head or
the final norm; a model with any other (an embedding layer norm, a LoRA-adapted embedding) keeps them.

`build_policy` makes the module without ever holding a full copy of the weights that the strategy would
not keep: the model is created on the meta device, sharded (or not) by the strategy, materialised empty,
then `load_weights` fills each parameter — or only this rank's rows of it — straight from safetensors
files. The buffers transformers computes rather than loads (rotary frequencies) are computed again.

Names: `entries(policy)` lists every parameter (tied ones once, with all their names) and persistent buffer
under its checkpoint name — the Hugging Face name of the base model (what model.safetensors holds) or, for
a LoRA adapter, PEFT's saved name (what adapter_model.safetensors holds). Weights published, exported and
checkpointed all use these names, whatever the strategy.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from rollart.config import RunConfig
from rollart.models.lora import attach_lora
from rollart.trainer.attention import packing_problem
from rollart.trainer.attention import register as register_attention
from rollart.trainer.logprobs import token_logprobs
from rollart.trainer.tensor_files import TensorReader

_LM = "lm."
_PEFT = "base_model.model."


def decoder_hidden(decoder: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None,
                   cu_seqlens: Tensor | None, branches: Tensor | None = None) -> Tensor:
    """A decoder's final hidden states over a micro-batch's model input, padded or packed (trainer/packing.py):
    the part the policy and the critic (critic.py) share."""
    kwargs: dict[str, Any] = {}
    if cu_seqlens is not None:  # one packed row: no mask at all, the boundaries go to the attention
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        kwargs = {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens,
                  "max_length_q": longest, "max_length_k": longest}
        if branches is not None:  # units sharing a prompt: which member each token is (trainer/attention.py)
            kwargs["branch_ids"] = branches
        attention_mask = None  # (trainer/attention.py: its mask builder keeps a packed row maskless)
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                  **kwargs)
    return out.last_hidden_state


class PolicyModule(nn.Module):
    """Root module: decoder → hidden states at the selected positions → chunked log-probs (module docstring)."""

    def __init__(self, lm: nn.Module, chunk_tokens: int) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        self.releases = False  # whether the root's parameters are released in the backward (build_policy)
        self.head = output_head(lm)  # a plain function (not a module: the head's weights stay `lm.`'s alone)

    def forward(self, input_ids: Tensor, select: Tensor, select_targets: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cu_seqlens: Tensor | None = None,
                with_entropy: bool = True, branches: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        hidden = decoder_hidden(self.lm.get_decoder(), input_ids, attention_mask, position_ids, cu_seqlens, branches)
        selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, select)
        return token_logprobs(selected, self.head, select_targets, self.chunk_tokens, with_entropy)


def output_head(lm: nn.Module) -> Any:
    """The LM head with what the model's own forward does to its logits after it — Gemma 2/3's final logit
    soft-capping, Cohere's `logit_scale`, Granite's `logits_scaling` — so log π here is the model's. A function,
    never the head module itself: kept on the root module, a module would be registered twice (as `head.` too)."""
    head = lm.get_output_embeddings()
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm  # (under LoRA, PEFT's wrapper)
    cap = getattr(base.config, "final_logit_softcapping", None)
    scale = getattr(base, "logit_scale", None)  # the causal LM's own attribute (Cohere), not a config's
    scale = scale if isinstance(scale, (int, float)) else None
    divide = getattr(base.config, "logits_scaling", None)
    if not cap and scale in (None, 1.0) and divide in (None, 1.0):
        return lambda hidden: head(hidden)

    def transformed(hidden: Tensor) -> Tensor:
        logits = head(hidden)
        if scale not in (None, 1.0):
            logits = logits * scale
        if divide not in (None, 1.0):
            logits = logits / divide
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transformed


@dataclass(frozen=True)
class Entry:
    """One tensor of the policy: its checkpoint names (tied parameters have several), and which file kind
    holds it: "base" (model.safetensors of the model or of a full checkpoint) or "adapter" (LoRA)."""

    names: tuple[str, ...]
    tensor: Tensor
    kind: str

    @property
    def name(self) -> str:
        return self.names[0]


def checkpoint_name(fqn: str, lora: bool) -> tuple[str, str]:
    """(kind, name in its file) of a policy parameter/buffer name."""
    name = fqn.removeprefix(_LM)
    if not lora:
        return "base", name
    if ".lora_" in name:  # PEFT saves adapters without the adapter's name ("default")
        return "adapter", name.replace(".default.", ".")
    return "base", name.removeprefix(_PEFT).replace(".base_layer.", ".")


def entries(policy: nn.Module, lora: bool) -> list[Entry]:
    """Every parameter once (tied names together, in state-dict order) and every persistent buffer."""
    by_id: dict[int, list[str]] = {}
    tensors: dict[int, Tensor] = {}
    for fqn, p in policy.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(fqn)
        tensors[id(p)] = p
    for module_name, module in policy.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is not None and name not in module._non_persistent_buffers_set:
                fqn = f"{module_name}.{name}" if module_name else name
                by_id.setdefault(id(b), []).append(fqn)
                tensors[id(b)] = b
    out = []
    for key, fqns in by_id.items():
        kinds_names = [checkpoint_name(f, lora) for f in fqns]
        out.append(Entry(tuple(n for _, n in kinds_names), tensors[key], kinds_names[0][0]))
    return out


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (transformers' `_no_split_modules` classes): the units a strategy shards."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    kinds = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in lm.modules() if type(m).__name__ in kinds]
    if not layers:
        raise ValueError(f"{type(base).__name__} names no decoder-layer classes (_no_split_modules): the trainer "
                         "cannot find its blocks to shard and checkpoint")
    return layers


def build_policy(cfg: RunConfig, model_path: str | Path, strategy: Any, *, trainable: bool = True) -> PolicyModule:
    """An empty (unloaded) policy, sharded by `strategy`, on its device (module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    remote = cfg.model.trust_remote_code  # refused before this unless set (models/loading.py)
    config = AutoConfig.from_pretrained(str(model_path), local_files_only=True, trust_remote_code=remote)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, cfg.model.dtype),
                                              attn_implementation=register_attention(), trust_remote_code=remote)
        if cfg.train.packing and (problem := packing_problem(lm.config, type(lm))):
            raise ValueError(f"train.packing: {problem}")
        if cfg.train.lora is not None:
            lm = attach_lora(lm, cfg.train.lora)
    if trainable and cfg.train.activation_checkpointing:
        lm.activation_checkpointing_enable(every_n_layers=1)
    policy = PolicyModule(lm, cfg.train.logprob_chunk_tokens)
    if not trainable:
        policy.requires_grad_(False).eval()
    layers = decoder_layers(lm)
    norm = _release_point(lm, layers) if trainable else None
    strategy.shard(policy, layers)
    if norm is not None:
        _release_after(norm, policy, strategy)
    policy.to_empty(device=strategy.param_device)
    _retie(lm)
    recompute_buffers(policy, strategy.param_device)
    return policy


def _release_point(lm: nn.Module, layers: Sequence[nn.Module]) -> nn.Module | None:
    """The decoder's final norm, if the root's parameters are read by nothing after it in the backward: every
    parameter outside `layers` belongs to a plain `nn.Embedding` (its backward reads only the token ids), the
    head or this norm (module docstring). None otherwise."""
    norm = getattr(lm.get_decoder(), "norm", None)
    head = lm.get_output_embeddings()
    if not isinstance(norm, nn.Module) or head is None:
        return None
    layered = {id(p) for layer in layers for p in layer.parameters()}
    allowed = {id(p) for p in [*head.parameters(), *norm.parameters()]}
    allowed |= {id(m.weight) for m in lm.modules() if type(m) is nn.Embedding}
    if all(id(p) in layered or id(p) in allowed for p in lm.parameters()):
        return norm
    return None


def _release_after(norm: nn.Module, policy: PolicyModule, strategy: Any) -> None:
    """Have `strategy` release the root's parameters once a backward has passed the final norm."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        hidden = args[0] if args else None
        if torch.is_grad_enabled() and isinstance(hidden, Tensor) and hidden.requires_grad:
            hidden.register_hook(lambda grad: strategy.release(policy))

    norm.register_forward_hook(hook)
    policy.releases = True


def _retie(lm: nn.Module) -> None:
    """`to_empty` on a plain (unsharded) module makes tied parameters separate again: tie them back."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    head, embed = base.get_output_embeddings(), base.get_input_embeddings()
    if getattr(base.config, "tie_word_embeddings", False) and head is not None and head.weight is not embed.weight:
        base.tie_weights()
        if head.weight is not embed.weight:
            raise RuntimeError(f"{type(base).__name__}: the LM head could not be tied to the embedding again")


def recompute_buffers(policy: nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (rotary frequencies) are computed at construction, not loaded: after a meta
    init they hold garbage. Build each owner module again on `device` and take its buffers."""
    for name, module in policy.named_modules():
        missing = [b for b in module._non_persistent_buffers_set if module._buffers.get(b) is not None]
        if not missing:
            continue
        if not hasattr(module, "config"):
            _init_buffers(policy, name, module, missing)
            continue
        with torch.device(device):
            fresh = type(module)(config=module.config)
        for b in missing:
            module._buffers[b] = fresh._buffers[b].to(device)


def _init_buffers(policy: nn.Module, name: str, module: nn.Module, missing: list[str]) -> None:
    """A module without a config of its own (Gemma's scaled embedding: `embed_scale`): its buffers as the model's
    own `_init_weights` sets them — transformers' way to initialise after a meta init — with its parameters held
    as they are (transformers' init functions leave a tensor marked `_is_hf_initialized` alone)."""
    lm = getattr(policy, "lm", None)
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    init = getattr(base, "_init_weights", None)
    if init is None:
        raise ValueError(f"{name} ({type(module).__name__}) has computed buffers {missing} that the trainer cannot "
                         "rebuild after a meta-device init")
    params = list(module.parameters(recurse=False))
    for p in params:
        p._is_hf_initialized = True  # type: ignore[attr-defined]
    try:
        with torch.no_grad():
            init(module)
    finally:
        for p in params:
            del p._is_hf_initialized  # type: ignore[attr-defined]


class InitialAdapter:
    """The starting values of LoRA adapters: A ~ U(±1/√fan_in) (PEFT's default, kaiming-uniform with a=√5),
    B = 0, each tensor from its own generator seeded by the run seed and its name — the same on every rank
    and whatever the strategy or world size."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def read(self, name: str, shape: tuple[int, ...], rows: tuple[int, int] | None = None) -> Tensor:
        full = torch.zeros(shape)
        if ".lora_A." in name:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
            nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=g)
        return full if rows is None else full[rows[0]:rows[1]]


def load_weights(policy: nn.Module, strategy: Any, sources: dict[str, Any], lora: bool,
                 kinds: Sequence[str] = ("base", "adapter")) -> None:
    """Fill the policy's tensors of `kinds` from `sources` ({kind: reader}): each rank reads only its rows."""
    with torch.no_grad():
        for entry in entries(policy, lora):
            if entry.kind not in kinds:
                continue
            reader = sources[entry.kind]
            name = next((n for n in entry.names if not isinstance(reader, TensorReader) or n in reader.shapes),
                        entry.name)
            rows = strategy.rows(entry.tensor)
            value = reader.read(name, tuple(entry.tensor.shape), rows)
            local = strategy.local(entry.tensor)
            local.copy_(value.to(local.dtype))
