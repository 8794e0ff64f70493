"""LoRA adapters in PEFT's format: attach them for training, read and write them, merge them for serving.

In: a Hugging Face causal LM and `train.lora` (trainer side); a `rollart.types.LoraAdapter` — PEFT's
adapter config and state dict, names as in `adapter_model.safetensors`, e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` — and the base weights of the modules it
targets (serving side). Out: a PEFT model whose adapters train (`attach_lora`), its adapter as a
`LoraAdapter` (`adapter_of`), and merged weights keyed by the base model's own parameter names:

    W = W_base + s · (B @ A),   s = lora_alpha / r   (lora_alpha / √r with use_rslora)

computed in float32 and cast to W_base's dtype, in the order PEFT's own merge uses (B @ A, then × s,
then + W), so for float32 weights the result equals PEFT's `merge_and_unload()` bit for bit (tested).

Why PEFT: it is the format users' tools read and write (checkpoints are PEFT adapter directories) and it
injects the adapter layers into any transformers model. The merge for serving is a few lines here, not
PEFT's, because an engine keeps its own copy of the base and re-merges every version from it (PEFT's
merge/unmerge would accumulate float error version after version).

Refused with a message: DoRA, per-module rank/alpha patterns, fan_in_fan_out layers and trained biases —
the adapters `train.lora` creates never have them, and an engine must not silently serve something else.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import torch

from rollart.config import LoraConfig
from rollart.types import LoraAdapter

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."


def attach_lora(model: Any, cfg: LoraConfig) -> Any:
    """Wrap `model` in a PEFT model with fresh adapters (A random, B zero: the model is unchanged)."""
    import peft

    config = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, config)
    except ValueError as exc:  # e.g. no module matched target_modules
        raise ValueError(f"train.lora.target_modules={cfg.target_modules}: {exc}") from exc


def adapter_of(peft_model: Any) -> LoraAdapter:
    """The model's current adapter (detached tensors, PEFT state-dict names, JSON-safe PEFT config)."""
    from peft import get_peft_model_state_dict

    tensors = {k: v.detach() for k, v in get_peft_model_state_dict(peft_model).items()}
    return LoraAdapter(config=peft_config_json(peft_model), tensors=tensors)


def peft_config_json(peft_model: Any) -> dict[str, Any]:
    """The PEFT model's adapter config as plain JSON data (what adapter_config.json holds)."""
    return json.loads(json.dumps(peft_model.peft_config["default"].to_dict(), default=_json_default))


def set_adapter_state(peft_model: Any, tensors: Mapping[str, torch.Tensor], source: str = "adapter") -> None:
    """Put adapter tensors (PEFT state-dict names) into `peft_model`, every one of its adapters accounted for."""
    from peft import set_peft_model_state_dict

    missing = sorted(set(adapter_of(peft_model).tensors) - set(tensors))
    result = set_peft_model_state_dict(peft_model, dict(tensors))
    unexpected = list(getattr(result, "unexpected_keys", []))
    if unexpected or missing:
        raise ValueError(f"{source}: adapter does not match the model (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}); was it written with another train.lora?")


def read_adapter(directory: str | Path) -> LoraAdapter:
    """A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) as a `LoraAdapter`."""
    from safetensors.torch import load_file

    path = Path(directory)
    if not (path / ADAPTER_CONFIG).is_file() or not (path / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"{path} is not a PEFT adapter directory (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    return LoraAdapter(config=json.loads((path / ADAPTER_CONFIG).read_text()), tensors=load_file(str(path / ADAPTER_WEIGHTS)))


def adapted_parameters(adapter: LoraAdapter) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{base parameter name: (A [r, in], B [out, r])} for every module the adapter targets."""
    _check_supported(adapter.config)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in adapter.tensors.items():
        module, sep, part = name.removeprefix(_PREFIX).rpartition(".lora_")
        if not sep or part not in ("A.weight", "B.weight"):
            raise ValueError(f"adapter tensor {name!r} is not a LoRA A/B weight (PEFT names end .lora_A.weight)")
        pairs.setdefault(f"{module}.weight", {})[part[0]] = torch.as_tensor(t)
    broken = sorted(n for n, ab in pairs.items() if ab.keys() != {"A", "B"})
    if broken:
        raise ValueError(f"adapter modules without both lora_A and lora_B: {broken[:3]}")
    return {n: (ab["A"], ab["B"]) for n, ab in pairs.items()}


def scaling(config: Mapping[str, Any]) -> float:
    r, alpha = float(config["r"]), float(config["lora_alpha"])
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def merged_weights(base: Mapping[str, torch.Tensor], adapter: LoraAdapter) -> dict[str, torch.Tensor]:
    """{parameter name: W_base + s·(B @ A)} for the adapted parameters (module docstring); fresh tensors.

    `base` must hold every adapted parameter (the engine's pristine copy of the base weights)."""
    s = scaling(adapter.config)
    out: dict[str, torch.Tensor] = {}
    for name, (a, b) in adapted_parameters(adapter).items():
        if name not in base:
            raise ValueError(f"adapter targets {name!r}, which the model does not have")
        w = base[name]
        if tuple(w.shape) != (b.shape[0], a.shape[1]) or a.shape[0] != b.shape[1]:
            raise ValueError(f"adapter for {name!r}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit "
                             f"the weight {tuple(w.shape)}")
        delta = (b.to(w.device, torch.float32) @ a.to(w.device, torch.float32)) * s
        out[name] = (w.to(torch.float32) + delta).to(w.dtype) if w.dtype != torch.float32 else w + delta
    return out


def merge_adapter_into(model: torch.nn.Module, adapter: LoraAdapter) -> None:
    """Merge `adapter` into `model`'s weights in place (a model loaded for serving, not for training)."""
    params = dict(model.named_parameters())
    merged = merged_weights({n: p.detach() for n, p in params.items()}, adapter)
    with torch.no_grad():
        for name, value in merged.items():
            params[name].copy_(value)


def _check_supported(config: Mapping[str, Any]) -> None:
    problems = [
        what for what, bad in (
            ("DoRA (use_dora)", config.get("use_dora")),
            ("per-module ranks (rank_pattern)", config.get("rank_pattern")),
            ("per-module alphas (alpha_pattern)", config.get("alpha_pattern")),
            ("fan_in_fan_out layers", config.get("fan_in_fan_out")),
            (f"trained biases (bias={config.get('bias')!r})", config.get("bias", "none") != "none"),
        ) if bad
    ]
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type {config.get('peft_type')!r}")
    if problems:
        raise ValueError("this adapter cannot be merged for serving: it uses " + ", ".join(problems)
                         + " (rollart serves plain LoRA: what train.lora trains)")


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)
