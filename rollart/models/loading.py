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
