"""Checkpoint files under RUN_DIR/checkpoints/step_<RL step>/ — writing, finding, pruning, refusing pickles.

In: a run directory and, from the trainer, its model, tokenizer, optimizer/scheduler state, RNG states and
the control plane's opaque `extra_state`. Out, one directory per checkpoint — data only, no pickles:

    config.json, model.safetensors, generation_config.json, tokenizer files
                         — a Hugging Face checkpoint: `AutoModelForCausalLM.from_pretrained(dir)` loads it;
                           a LoRA run writes instead PEFT's adapter_config.json + adapter_model.safetensors
                           (`PeftModel.from_pretrained(base, dir)` loads it on the run's `model.path`)
    trainer_state.json   — version, world size, LR scheduler, optimizer param groups;
    trainer_state.safetensors — the optimizers' tensors (moments, step counts), referenced from the JSON
    rng/rank<r>.json (+ .safetensors) — Python, numpy and torch (CPU and CUDA) RNG states of every rank
    extra_state.json     — what the driver handed in, returned on load: its `RunState` — {"step", "eval_first",
                           "run_id", "attempt", "ledger_bytes", "scheduler": {"next_seq", "rng", "replay": [[domain,
                           seq, seed], …] (groups still running, admitted again), "ordinals" (each dataset
                           domain's next row), "ready": [groups scored but not
                           trained: {"group_id", "seq", "domain", "ready_at", "trajectories": [Trajectory as
                           `rollart.codec.to_json` writes it: task, turns with token ids, logprobs and versions,
                           status, reward …]}]}}
    reference.safetensors — the KL reference's weights (the weights RL started from; a LoRA run: its adapter),
                            when the loss has a KL term

Each `<name>.json` (+ `<name>.safetensors`) pair is written and read by `state_files.save_state` /
`load_state`: plain JSON with tensors by name (the encoding is in state_files.py). To add state, put plain
data (or tensors) into `extra_state` or the trainer state dict; nothing else is needed.

Guarantees: a checkpoint appears under its final name only once complete and on disk — written to a
hidden temporary directory, every file and directory in it fsynced, renamed, the parent directory fsynced —
so `latest_checkpoint` never returns a partial one, even after a power cut or a SIGKILL mid-save. A save
that fails removes its temporary directory (`discard`); one cut short by a kill leaves it, and the next
start of the run's trainer removes it (`remove_partial`). `finalize` keeps the newest
`train.keep_checkpoints`. Nothing here unpickles or follows a link: `check_checkpoint_files` refuses a run
whose checkpoints hold a pickle file (a `torch.save` file, or anything named .pt/.pth/.pkl/.pickle/.bin/.ckpt
— including checkpoints of an older rollart) or a symbolic link, naming it, before anything is loaded; and
`check_state_files` reads a checkpoint's state files as the trainer will, so a corrupt or truncated one is
named (file and field) before anything starts.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollart.run_dir import RunPaths
from rollart.trainer.state_files import StateFileError, has_state, inspect_state, load_state, save_state

STATE = "trainer_state"
EXTRA = "extra_state"
REFERENCE_FILE = "reference.safetensors"
_STEP = re.compile(r"^step_(\d+)$")
_PARTIAL = re.compile(r"^\.step_\d+\.tmp-[0-9a-f]+$")

log = logging.getLogger("rollart.trainer")
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt")
DATA_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".jinja", ".md")  # parsed as data, never unpickled


class UnsafeCheckpointError(ValueError):
    """A checkpoint directory holds a file rollart would have to unpickle (which can run code)."""


def checkpoints_root(run_dir: str | Path) -> Path:
    return RunPaths.of(run_dir).checkpoints


def step_path(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint a run continues from at RL step `step` lives (warm-start steps not counted)."""
    return checkpoints_root(run_dir) / f"step_{step:08d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    # a symbolic link is never a checkpoint (the pre-check refuses a run directory that holds one)
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP.match(p.name)) and not p.is_symlink() and has_state(p / STATE)]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (what `resume=true` continues from), or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def temporary_path(final: Path) -> Path:
    """A fresh hidden sibling to write into (unique, so a save that crashed half-way never mixes in)."""
    return final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")


def finalize(tmp: Path, final: Path, keep: int) -> Path:
    """Publish a fully written checkpoint under its name (durably), then drop all but the newest `keep`."""
    _fsync_tree(tmp)
    if final.is_symlink():
        final.unlink()  # replaced, never followed
    elif final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync(final.parent)
    for old in list_checkpoints(final.parent.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def discard(tmp: Path) -> None:
    """Remove what a failed save wrote (its temporary directory); never raises."""
    shutil.rmtree(tmp, ignore_errors=True)


def remove_partial(run_dir: str | Path) -> list[Path]:
    """Remove temporary directories that saves cut short by a kill left behind; returns what was removed."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    partial = [p for p in root.iterdir() if _PARTIAL.match(p.name)]
    for path in partial:
        log.warning("removing %s: a checkpoint save that was cut short", path)
        discard(path)
    return partial


def _fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync(Path(directory) / name)
        _fsync(Path(directory))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _is_pickle(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        return True
    if suffix in DATA_SUFFIXES:
        return False
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError:
        return False
    # a raw pickle (protocol 2+), or torch.save's zip archive (its data.pkl is a pickle)
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head == b"PK\x03\x04"


def check_checkpoint_files(root: str | Path) -> None:
    """Raise `UnsafeCheckpointError` naming the first file under `root` (a checkpoint, or a run's
    checkpoints directory) that rollart will not load: a pickle, or a symbolic link (rollart writes none;
    one can make a checkpoint that passed this check load files from anywhere). The walk never follows a
    link, so what lies behind one is never read; nothing is loaded."""
    root = Path(root)
    if not os.path.lexists(root):
        return
    for path in _walk_no_links(root):
        if path.is_symlink():
            target = os.readlink(path)
            outside = not _inside(path.parent / target, root)
            raise UnsafeCheckpointError(
                f"{path} is a symbolic link (to {target}{', outside ' + str(root) if outside else ''}): rollart "
                "checkpoints hold none and it will not load files through one. Refusing this run directory: "
                "remove the link if it is not yours, or start a fresh run_dir"
            )
        if path.is_file() and _is_pickle(path):
            raise UnsafeCheckpointError(
                f"{path} is a pickle file (or named like one): loading it could run arbitrary code, and rollart "
                "checkpoints hold none (JSON + safetensors). Refusing to resume from this run directory: remove "
                "the file if it is not yours, or start a fresh run_dir (checkpoints written by an older rollart "
                "with .pt files cannot be resumed safely)"
            )


def _walk_no_links(root: Path) -> list[Path]:
    """`root` and everything below it, sorted, without descending into a symbolic link."""
    found = [root]
    if root.is_symlink() or not root.is_dir():
        return found
    for directory, dirs, files in os.walk(root, followlinks=False):
        found += [Path(directory) / name for name in dirs + files]
    return sorted(found)


def _inside(path: Path, root: Path) -> bool:
    resolved, base = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return resolved == base or base in resolved.parents


def rng_stem(ckpt: Path, rank: int) -> Path:
    return ckpt / "rng" / f"rank{rank}"


def save_rng(ckpt: Path, rank: int) -> None:
    save_state(rng_stem(ckpt, rank), rng_state())


def load_rng(ckpt: Path, rank: int) -> bool:
    """Restore this rank's RNG; False when the checkpoint has none for it (written with fewer ranks)."""
    stem = rng_stem(ckpt, rank)
    if not has_state(stem):
        return False
    set_rng_state(load_state(stem))
    return True


def save_extra(ckpt: Path, extra_state: dict[str, Any]) -> None:
    save_state(ckpt / EXTRA, dict(extra_state))


def load_extra(ckpt: Path) -> dict[str, Any]:
    return load_state(ckpt / EXTRA) if has_state(ckpt / EXTRA) else {}


def save_trainer_state(ckpt: Path, state: dict[str, Any]) -> None:
    save_state(ckpt / STATE, state)


def check_state_files(ckpt: Path) -> dict[str, Any]:
    """Read a checkpoint's state files as `Trainer.load` will, loading no tensor: `StateFileError` naming the
    file and the field for a corrupt, truncated or incomplete one. Returns its `extra_state` (the driver's
    `RunState`, checked by the driver)."""
    state = inspect_state(ckpt / STATE)
    where = ckpt / f"{STATE}.json"

    def need(ok: bool, field: str, what: str, value: Any) -> None:
        if not ok:
            raise StateFileError(f"{where}: field {field!r} must be {what}, got {value!r:.80}")

    need(isinstance(state, dict), "(top level)", "an object", type(state).__name__)
    version, world = state.get("version"), state.get("world_size")
    need(_is_int(version) and version >= 0, "version", "an integer ≥ 0", version)
    need(_is_int(world) and world >= 1, "world_size", "an integer ≥ 1", world)
    for field in ("optimizer", "sft_optimizer"):
        value = state.get(field)
        if field == "sft_optimizer" and value is None:
            continue
        need(isinstance(value, dict) and isinstance(value.get("state"), dict)
             and isinstance(value.get("param_groups"), list), field,
             "an optimizer state (with 'state' and 'param_groups')", value)
    need(isinstance(state.get("scheduler"), dict), "scheduler", "a learning-rate scheduler state",
         state.get("scheduler"))
    rngs = sorted((ckpt / "rng").glob("rank*.json")) if (ckpt / "rng").is_dir() else []
    for rng in rngs:
        got = inspect_state(rng.with_suffix(""))
        if not (isinstance(got, dict) and {"torch", "python", "numpy"} <= set(got)):
            raise StateFileError(f"{rng}: must hold the 'torch', 'python' and 'numpy' RNG states")
    extra = inspect_state(ckpt / EXTRA) if has_state(ckpt / EXTRA) else {}
    if not isinstance(extra, dict):
        raise StateFileError(f"{ckpt / EXTRA}.json: must be an object, got {type(extra).__name__}")
    return extra


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_trainer_state(ckpt: Path, device: str | torch.device) -> dict[str, Any]:
    if not has_state(ckpt / STATE):
        raise FileNotFoundError(f"{ckpt} is not a complete rollart checkpoint (no {STATE}.json)")
    return load_state(ckpt / STATE, device)
