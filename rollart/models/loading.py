"""Find and load the policy's checkpoint (model and tokenizer): a local directory, a Hugging Face hub id
through the hub's cache, or the built-in tiny model built locally.

In: `ModelConfig` (`path`: a local directory, a hub id such as `Qwen/Qwen3-8B` with `revision`, or empty =
the built-in tiny model; `trust_remote_code`) and a cache directory for the tiny model. Out: a local
checkpoint path (`resolve_model_path`), why a config's checkpoint cannot be loaded (`model_problem`, for
preflight), and models/tokenizers loaded from a local path with `local_files_only`.

Guarantees:
- A hub id resolves through `huggingface_hub`'s cache (`HF_HUB_CACHE`): a cached snapshot is used as it is;
  otherwise it is downloaded — its configs, tokenizer files and safetensors weights only — unless
  `HF_HUB_OFFLINE` is set: then it fails with a `ModelNotFound` naming the id, the cache directory and
  `HF_HUB_OFFLINE`. Every process resolves for itself, so on a cluster each node reads its own cache. This
  module never changes the environment of whoever imports it (offline mode is the caller's choice: the
  tests and the Makefile set `HF_HUB_OFFLINE=1`).
- Weights come from safetensors only: a checkpoint with only `pytorch_model.bin` (a pickle, which can run
  code when loaded) is refused.
- A checkpoint whose config or tokenizer names its own code (`auto_map`) is refused unless
  `model.trust_remote_code` is true, and the message says so; loaders run such code only when told to.
- `resolve_model_path` with an empty `model.path` always returns the same checkpoint for the same tiny config
  and seed (cached by a hash of both), so every process of a run loads identical weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from rollart.config import ModelConfig

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

DEFAULT_CACHE = Path(os.environ.get("ROLLART_CACHE", Path.home() / ".cache" / "rollart"))
# what a checkpoint needs of a hub repository: configs, tokenizer files, the chat template, safetensors weights
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_TRUE = {"1", "ON", "YES", "TRUE"}


class CheckpointError(ValueError):
    """A `model.path` (or `reward.judge_model`) rollart cannot or will not load; the message says why."""


class ModelNotFound(CheckpointError, FileNotFoundError):
    """Not a local checkpoint, and a hub id not cached (offline) or not downloadable."""


def is_hub_id(path: str) -> bool:
    """`org/name` that is not an existing local path."""
    return bool(_HUB_ID.match(path)) and not Path(path).expanduser().exists()


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_snapshot(repo_id: str, revision: str = "", hub_cache: str | Path | None = None,
                 key: str = "model.path") -> Path:
    """The local snapshot of a hub model (see the module docstring)."""
    from huggingface_hub import constants, snapshot_download

    cache = Path(hub_cache or os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    where = f"{key}={repo_id!r}{f' (revision {revision!r})' if revision else ''}"
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=cache, allow_patterns=HUB_FILES,
                                      local_files_only=True))
    except Exception as exc:  # noqa: BLE001 — not cached (LocalEntryNotFoundError and kin): download, or say so
        cached_error = exc
    if hub_offline():
        raise ModelNotFound(
            f"{where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set, so it cannot be "
            "downloaded; download it once with network access (unset HF_HUB_OFFLINE), or point HF_HUB_CACHE at a "
            f"cache that holds it ({type(cached_error).__name__})")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=cache, allow_patterns=HUB_FILES))
    except Exception as exc:  # noqa: BLE001 — no network, a gated or unknown repo: said with where it looked
        raise ModelNotFound(f"{where} is not in the Hugging Face cache ({cache}) and downloading it failed: "
                            f"{type(exc).__name__}: {exc} (HF_HUB_OFFLINE is not set; without network access, fill "
                            "the cache elsewhere)") from exc


def resolve_model_path(cfg: ModelConfig, seed: int = 0, cache_dir: str | Path | None = None,
                       hub_cache: str | Path | None = None, key: str = "model.path") -> Path:
    """The checkpoint to load: `cfg.path` (a local directory, or a hub id through the cache `hub_cache`, by
    default the hub's), checked (see the module docstring); or the tiny model built once into `cache_dir`."""
    if cfg.path:
        local = Path(cfg.path).expanduser()
        if is_hub_id(cfg.path):
            local = hub_snapshot(cfg.path, cfg.revision, hub_cache, key)
        problem = checkpoint_problem(str(local), key, cfg.trust_remote_code, read_config=False, name=cfg.path)
        if problem:
            raise (ModelNotFound if not local.is_dir() else CheckpointError)(problem)
        return local
    from rollart.models.tiny import BUILD_VERSION, init_tiny_checkpoint

    digest = hashlib.sha256(f"{BUILD_VERSION}|{cfg.tiny.model_dump_json()}|{seed}".encode()).hexdigest()[:12]
    path = Path(cache_dir or DEFAULT_CACHE) / f"tiny-{digest}"
    if not (path / "model.safetensors").is_file():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        init_tiny_checkpoint(tmp, cfg.tiny, seed)
        try:
            tmp.rename(path)  # atomic: concurrent builders race harmlessly
        except OSError:
            pass
    return path


def model_problem(cfg: ModelConfig, key: str = "model.path") -> str:
    """Why the checkpoint `cfg.path` names cannot be loaded ('' if it can): resolved (a hub id through the
    cache, downloaded when online) and checked, its config read by transformers. For preflight."""
    try:
        path = resolve_model_path(cfg, key=key)
    except CheckpointError as exc:
        return str(exc)
    return checkpoint_problem(str(path), key, cfg.trust_remote_code, name=cfg.path)


def checkpoint_problem(path: str, key: str = "model.path", trust_remote_code: bool = False, *,
                       read_config: bool = True, name: str = "") -> str:
    """Why the directory `path` is not a checkpoint `load_model` and `load_tokenizer` may load ('' if it is
    one): config.json (with `read_config`: naming a model type transformers knows), safetensors weights (a
    pytorch_model.bin is a pickle: refused), tokenizer files, and no code of its own unless
    `trust_remote_code`. Reads the config only, no weights; `name` is what the config wrote (a hub id)."""
    where = Path(path).expanduser()
    shown = f"{key}={name or path!r}" + (f" ({where})" if name and name != path else "")
    need = "a local Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files), or a hub id"
    if not where.is_dir():
        return f"{shown}: no such directory, and not a hub id (org/name); give {need}"
    if not (where / "config.json").is_file():
        return f"{shown}: no config.json there, so it is not a Hugging Face checkpoint; give {need}"
    if not any(where.glob("*.safetensors")):
        pickled = sorted(p.name for p in where.glob("*.bin"))
        why = f" ({', '.join(pickled)} is a pickle, which rollart never loads: it can run code)" if pickled else ""
        return f"{shown}: no *.safetensors weights there{why}; save the model with safe_serialization=True"
    if not any((where / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return f"{shown}: no tokenizer files there (tokenizer.json or tokenizer_config.json); save the " \
               "tokenizer beside the model (tokenizer.save_pretrained(dir))"
    if not trust_remote_code:
        for file in ("config.json", "tokenizer_config.json"):
            if code := _auto_map(where / file):
                return (f"{shown} needs code that comes with the checkpoint ({file} auto_map: {code}); rollart "
                        "does not run it unless you set model.trust_remote_code=true (only for a checkpoint whose "
                        "code you trust)")
    if read_config:
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(str(where), local_files_only=True, trust_remote_code=trust_remote_code)
        except (ValueError, OSError, KeyError, ImportError) as exc:
            return f"{shown}: transformers cannot read its config.json ({exc})"
    return ""


def _auto_map(file: Path) -> str:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return ""
    auto_map = data.get("auto_map") if isinstance(data, dict) else None
    return ", ".join(f"{k}: {v}" for k, v in auto_map.items()) if isinstance(auto_map, dict) and auto_map else ""


def adapter_problem(path: str, key: str = "model.adapter") -> str:
    """Why `path` is not a PEFT LoRA adapter directory ('' if it is one)."""
    where = Path(path).expanduser()
    missing = [n for n in ("adapter_config.json", "adapter_model.safetensors") if not (where / n).is_file()]
    if missing:
        return f"{key}={path!r}: not a PEFT adapter directory (no {' or '.join(missing)} there)"
    return ""


# Model types whose checkpoints, when their tokenizer_config.json names the generic `TokenizersBackend` class,
# AutoTokenizer loads with that class itself (tests/unit/test_models_tokenizer.py checks it against AutoTokenizer):
# the built-in tiny model's. For other types AutoTokenizer may pick a model-specific class (qwen2: Qwen2Tokenizer).
GENERIC_TOKENIZER_MODEL_TYPES = frozenset({"qwen3"})


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """The tokenizer at `path`, as `AutoTokenizer.from_pretrained` loads it (local files only).

    A checkpoint whose tokenizer_config.json names `TokenizersBackend`, with a model type of
    `GENERIC_TOKENIZER_MODEL_TYPES` and no code of its own (the tiny model's), is loaded with that class
    directly: the same class and files AutoTokenizer would use, without importing AutoTokenizer's module, which
    imports torch (~5 s of a `rollart data preview` otherwise)."""
    if _generic_tokenizer(Path(path)):
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)


def _generic_tokenizer(path: Path) -> bool:
    try:
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(tokenizer_config, dict) and isinstance(config, dict)
            and tokenizer_config.get("tokenizer_class") == "TokenizersBackend"
            and config.get("model_type") in GENERIC_TOKENIZER_MODEL_TYPES
            and (path / "tokenizer.json").is_file()
            and not _auto_map(path / "config.json") and not _auto_map(path / "tokenizer_config.json"))


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu", adapter: str | Path = "",
               trust_remote_code: bool = False):
    """The causal LM at `path`; with `adapter` (a PEFT LoRA directory) its weights merged in, for serving."""
    import torch
    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # safetensors only: a pytorch_model.bin is a pickle, and unpickling a crafted one can run code
    model = AutoModelForCausalLM.from_pretrained(
        str(path), local_files_only=True, dtype=getattr(torch, dtype), use_safetensors=True,
        trust_remote_code=trust_remote_code,
    )
    if adapter:
        from rollart.models.lora import merge_adapter_into, read_adapter

        merge_adapter_into(model, read_adapter(adapter))
    return model.to(device)
