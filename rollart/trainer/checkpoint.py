"""Checkpoint files under RUN_DIR/checkpoints/step_<version>/ — writing, finding, pruning.

In: a run directory and, from the trainer, its model, tokenizer, optimizer/scheduler state, RNG states and
the control plane's opaque `extra_state`. Out, one directory per checkpoint:

    config.json, model.safetensors, generation_config.json, tokenizer files
                         — a Hugging Face checkpoint: `AutoModelForCausalLM.from_pretrained(dir)` loads it;
                           a LoRA run writes instead PEFT's adapter_config.json + adapter_model.safetensors
                           (`PeftModel.from_pretrained(base, dir)` loads it on the run's `model.path`)
    trainer_state.pt     — version, optimizer(s), LR scheduler (torch.save)
    rng/rank<r>.pt       — torch (CPU and CUDA), Python and numpy RNG states of every rank
    extra_state.pt       — what the control plane handed in (sampler, buffer …), returned on load
    reference.safetensors — the KL reference's weights (the weights RL started from; a LoRA run: its adapter),
                            when the loss has a KL term

Guarantees: a checkpoint appears under its final name only once complete (written to a hidden temporary
directory, then renamed), so `latest_checkpoint` never returns a partial one; `finalize` keeps the newest
`train.keep_checkpoints`.
"""

from __future__ import annotations

import random
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollart.run_dir import RunPaths

STATE_FILE = "trainer_state.pt"
EXTRA_FILE = "extra_state.pt"
REFERENCE_FILE = "reference.safetensors"
_STEP = re.compile(r"^step_(\d+)$")


def checkpoints_root(run_dir: str | Path) -> Path:
    return RunPaths.of(run_dir).checkpoints


def step_path(run_dir: str | Path, version: int) -> Path:
    return checkpoints_root(run_dir) / f"step_{version:08d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (what `resume=true` continues from), or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def temporary_path(final: Path) -> Path:
    """A fresh hidden sibling to write into (unique, so a save that crashed half-way never mixes in)."""
    return final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")


def finalize(tmp: Path, final: Path, keep: int) -> Path:
    """Publish a fully written checkpoint under its name, then drop all but the newest `keep`."""
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(final.parent.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_path(ckpt: Path, rank: int) -> Path:
    return ckpt / "rng" / f"rank{rank}.pt"


def save_rng(ckpt: Path, rank: int) -> None:
    path = rng_path(ckpt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), path)


def load_rng(ckpt: Path, rank: int) -> bool:
    """Restore this rank's RNG; False when the checkpoint has none for it (written with fewer ranks)."""
    path = rng_path(ckpt, rank)
    if not path.is_file():
        return False
    set_rng_state(torch.load(path, weights_only=False))
    return True


def save_extra(ckpt: Path, extra_state: dict[str, Any]) -> None:
    torch.save(dict(extra_state), ckpt / EXTRA_FILE)


def load_extra(ckpt: Path) -> dict[str, Any]:
    path = ckpt / EXTRA_FILE
    return torch.load(path, weights_only=False) if path.is_file() else {}
