"""Load a local Hugging Face checkpoint (model and tokenizer), building the tiny one when none is given.

In: `ModelConfig` (path empty = built-in tiny model) and a cache directory. Out: a checkpoint path, and
models/tokenizers loaded from it with `local_files_only` (nothing is ever fetched from a hub); weights from
safetensors only (a `pytorch_model.bin` is a pickle, which can run code when loaded: refused).

Guarantee: `resolve_model_path` with an empty `model.path` always returns the same checkpoint for the same
tiny config and seed (cached by a hash of both), so every process of a run loads identical weights.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rollart.config import ModelConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

DEFAULT_CACHE = Path(os.environ.get("ROLLART_CACHE", Path.home() / ".cache" / "rollart"))


def resolve_model_path(cfg: ModelConfig, seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """The checkpoint to load: `cfg.path`, or the tiny model built once into the cache."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path={cfg.path!r} is not a Hugging Face checkpoint directory (no config.json there); "
                "give a local checkpoint, or leave model.path empty for the built-in tiny model"
            )
        return path
    from rollart.models.tiny import BUILD_VERSION, init_tiny_checkpoint

    key = hashlib.sha256(f"{BUILD_VERSION}|{cfg.tiny.model_dump_json()}|{seed}".encode()).hexdigest()[:12]
    path = Path(cache_dir or DEFAULT_CACHE) / f"tiny-{key}"
    if not (path / "model.safetensors").is_file():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        init_tiny_checkpoint(tmp, cfg.tiny, seed)
        try:
            tmp.rename(path)  # atomic: concurrent builders race harmlessly
        except OSError:
            pass
    return path


def checkpoint_problem(path: str, key: str = "model.path") -> str:
    """Why `path` is not a checkpoint `load_model` and `load_tokenizer` can load ('' if it is one): a
    directory with config.json naming a model type transformers knows, safetensors weights (a
    pytorch_model.bin is a pickle: refused) and tokenizer files. Reads the config only, no weights."""
    where = Path(path).expanduser()
    need = "a local Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files)"
    if not where.is_dir():
        return f"{key}={path!r}: no such directory; give {need}"
    if not (where / "config.json").is_file():
        return f"{key}={path!r}: no config.json there, so it is not a Hugging Face checkpoint; give {need}"
    if not any(where.glob("*.safetensors")):
        pickled = sorted(p.name for p in where.glob("*.bin"))
        why = f" ({', '.join(pickled)} is a pickle, which rollart never loads: it can run code)" if pickled else ""
        return f"{key}={path!r}: no *.safetensors weights there{why}; save the model with safe_serialization=True"
    if not any((where / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return f"{key}={path!r}: no tokenizer files there (tokenizer.json or tokenizer_config.json); save the " \
               "tokenizer beside the model (tokenizer.save_pretrained(dir))"
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(where), local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        return f"{key}={path!r}: transformers cannot read its config.json ({exc})"
    return ""


def adapter_problem(path: str, key: str = "model.adapter") -> str:
    """Why `path` is not a PEFT LoRA adapter directory ('' if it is one)."""
    where = Path(path).expanduser()
    missing = [n for n in ("adapter_config.json", "adapter_model.safetensors") if not (where / n).is_file()]
    if missing:
        return f"{key}={path!r}: not a PEFT adapter directory (no {' or '.join(missing)} there)"
    return ""


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu", adapter: str | Path = ""):
    """The causal LM at `path`; with `adapter` (a PEFT LoRA directory) its weights merged in, for serving."""
    import torch
    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # safetensors only: a pytorch_model.bin is a pickle, and unpickling a crafted one can run code
    model = AutoModelForCausalLM.from_pretrained(
        str(path), local_files_only=True, dtype=getattr(torch, dtype), use_safetensors=True
    )
    if adapter:
        from rollart.models.lora import merge_adapter_into, read_adapter

        merge_adapter_into(model, read_adapter(adapter))
    return model.to(device)
