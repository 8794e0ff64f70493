"""Checkpoint files under RUN_DIR/checkpoints/step_<RL step>/ — writing, finding, pruning, refusing pickles.

In: a run directory and, from the trainer, its model, tokenizer, optimizer/scheduler state, RNG states and
the control plane's opaque `extra_state`. Out, one directory per checkpoint — data only, no pickles:

    config.json, model.safetensors, generation_config.json, tokenizer files
                         — a Hugging Face checkpoint: `AutoModelForCausalLM.from_pretrained(dir)` loads it;
                           a LoRA run writes instead PEFT's adapter_config.json + adapter_model.safetensors
                           (`PeftModel.from_pretrained(base, dir)` loads it on the run's `model.path`)
    trainer_state.json   — version, world size, strategy, LR scheduler, each optimizer's param groups (by
                           parameter name)
    optimizer/rank<r>.safetensors + .json, sft_optimizer/… — the optimizers' tensors (moments, step counts)
                           by parameter name: each rank writes the rows it holds (fsdp2: its shard; ddp:
                           rank 0 writes them whole), the JSON says each tensor's full shape and which rows;
                           any number of ranks reads them back (`OptimizerShards`): a run saved with N ranks
                           resumes with M, bit for bit
    rng/rank<r>.json (+ .safetensors) — Python, numpy and torch (CPU and CUDA) RNG states of every rank
    extra_state.json     — what the driver handed in, returned on load: its `RunState` — {"step", "eval_first",
                           "run_id", "attempt", "ledger_bytes", "scheduler": {"next_seq", "rng", "replay": [[domain,
                           seq, seed], …] (groups still running, admitted again), "ordinals" (each dataset
                           domain's next row), "ready": [groups scored but not
                           trained: {"group_id", "seq", "domain", "ready_at", "trajectories": [Trajectory as
                           `rollart.base.codec.to_json` writes it: task, turns with token ids, logprobs and versions,
                           status, reward …]}]}}
    reference.safetensors — the KL reference's weights (the weights RL started from; a LoRA run: its adapter),
                            when the loss has a KL term
    critic.safetensors, critic_optimizer/… — an algorithm with a critic (ppo): the value model's weights (the
                            causal LM's decoder names, `value_head.*`) and its AdamW state, like the optimizer's
                            (trainer/critic.py); its param groups are `critic_optimizer` in trainer_state.json

The weights (model.safetensors, the adapter, the reference) are written by rank 0 one tensor at a time, each
gathered from the shards just before (tensor_files.write_safetensors): no rank ever holds the whole model.
Nothing here is torch.distributed.checkpoint's format, whose metadata file is a pickle.

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

import json
import logging
import os
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from rollart.base.run_dir import RunPaths
from rollart.trainer.state_files import StateFileError, has_state, inspect_state, load_state, save_state
from rollart.trainer.tensor_files import Piece, TensorReader, TensorSpec, write_safetensors

STATE = "trainer_state"
EXTRA = "extra_state"
OPTIMIZER = "optimizer"
SFT_OPTIMIZER = "sft_optimizer"
CRITIC_OPTIMIZER = "critic_optimizer"
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
    for field in (OPTIMIZER, SFT_OPTIMIZER, CRITIC_OPTIMIZER):
        value = state.get(field)
        if field != OPTIMIZER and value is None:
            continue
        need(isinstance(value, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                             and all(isinstance(n, str) for n in g["params"]) for g in value),
             field, "the optimizer's param groups (each naming its 'params')", value)
        _check_shard_index(ckpt / field)
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


def _check_shard_index(directory: Path) -> None:
    """Each rank's optimizer index of `directory` parses and describes tensors its safetensors file holds."""
    from safetensors import safe_open

    for index in sorted(directory.glob("rank*.json")) if directory.is_dir() else []:
        try:
            tensors = json.loads(index.read_text(encoding="utf-8"))["tensors"]
            metas = [(k, list(m["shape"]), m["rows"]) for k, m in tensors.items()]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise StateFileError(f"{index}: not an optimizer shard index ({type(exc).__name__}: {exc}; a file cut "
                                 "short by a crash or a full disk?)") from None
        try:
            with safe_open(str(index.with_suffix(".safetensors")), framework="pt") as f:
                held = set(f.keys())
        except Exception as exc:  # noqa: BLE001 — safetensors raises its own error types for a bad header
            raise StateFileError(f"{index.with_suffix('.safetensors')}: not a readable safetensors file "
                                 f"({exc})") from None
        missing = sorted(k for k, _, _ in metas if k not in held)
        if missing:
            raise StateFileError(f"{index}: names tensors its safetensors file lacks, e.g. {missing[:3]}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_trainer_state(ckpt: Path, device: str | torch.device) -> dict[str, Any]:
    if not has_state(ckpt / STATE):
        raise FileNotFoundError(f"{ckpt} is not a complete rollart checkpoint (no {STATE}.json)")
    return load_state(ckpt / STATE, device)


def save_optimizer_shard(directory: Path, rank: int, named_params: Sequence[tuple[str, torch.Tensor]],
                         optimizer: torch.optim.Optimizer, strategy: Any) -> None:
    """This rank's rows of every optimizer state tensor, as `<directory>/rank<r>.safetensors` + `.json`."""
    specs: list[TensorSpec] = []
    values: list[torch.Tensor] = []
    index: dict[str, dict[str, Any]] = {}
    for name, param in named_params:
        rows = strategy.rows(param)
        for key, value in sorted(optimizer.state.get(param, {}).items()):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {name}/{key} is a {type(value).__name__}, not a tensor")
            whole = value.ndim == 0 or rows is None
            if whole and rank != 0:
                continue  # the same on every rank: rank 0 writes it
            local = value if whole else strategy.local(value)
            span = None if value.ndim == 0 else [0, value.shape[0]] if rows is None else list(rows)
            specs.append(TensorSpec(f"{name}/{key}", local.dtype, tuple(local.shape)))
            values.append(local)
            index[f"{name}/{key}"] = {"shape": list(value.shape), "rows": span}
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(directory / f"rank{rank}.safetensors", specs, iter(values))
    (directory / f"rank{rank}.json").write_text(json.dumps({"tensors": index}))


def load_optimizer_shards(directory: Path, named_params: Sequence[tuple[str, torch.Tensor]],
                          optimizer: torch.optim.Optimizer, strategy: Any) -> None:
    """Set every parameter's optimizer state from the shards of any number of ranks (this rank's rows)."""
    shapes: dict[str, tuple[int, ...]] = {}
    pieces: dict[str, list[Piece]] = {}
    for index_file in sorted(directory.glob("rank*.json")):
        tensors = json.loads(index_file.read_text())["tensors"]
        for key, meta in tensors.items():
            shapes[key] = tuple(meta["shape"])
            start, stop = meta["rows"] if meta["rows"] is not None else (0, 0)
            pieces.setdefault(key, []).append(Piece(index_file.with_suffix(".safetensors"), key, start, stop))
    reader = TensorReader(shapes, pieces, str(directory))
    by_param: dict[str, list[str]] = {}
    for key in shapes:
        by_param.setdefault(key.rsplit("/", 1)[0], []).append(key.rsplit("/", 1)[1])
    names = {name for name, _ in named_params}
    unknown = sorted(set(by_param) - names)
    if unknown:
        raise ValueError(f"{directory}: optimizer state for parameters this model does not have: {unknown[:3]}")
    for name, param in named_params:
        state = {}
        for key in sorted(by_param.get(name, [])):
            shape = shapes[f"{name}/{key}"]
            if not shape:
                state[key] = reader.read(f"{name}/{key}", shape)
            else:
                rows = reader.read(f"{name}/{key}", tuple(param.shape), strategy.rows(param))
                state[key] = strategy.like(param, rows)
        if state:
            optimizer.state[param] = state


def param_groups(optimizer: torch.optim.Optimizer, named_params: Sequence[tuple[str, torch.Tensor]]
                 ) -> list[dict[str, Any]]:
    """The optimizer's param groups (hyper-parameters), each naming its parameters instead of numbering them."""
    names = {id(p): n for n, p in named_params}
    return [{k: v for k, v in g.items() if k != "params"} | {"params": [names[id(p)] for p in g["params"]]}
            for g in optimizer.param_groups]


def load_optimizer(directory: Path, groups: Sequence[dict[str, Any]], named_params: Sequence[tuple[str, torch.Tensor]],
                   optimizer: torch.optim.Optimizer, strategy: Any) -> None:
    """Restore an optimizer saved by `param_groups` + `save_optimizer_shard` (any number of ranks)."""
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"{directory}: {len(groups)} optimizer param groups saved, this trainer has "
                         f"{len(optimizer.param_groups)} (another train.lora?)")
    names = {id(p): n for n, p in named_params}
    for saved, group in zip(groups, optimizer.param_groups):
        mine = [names[id(p)] for p in group["params"]]
        if list(saved["params"]) != mine:
            missing = sorted(set(mine) - set(saved["params"]))[:3]
            raise ValueError(f"{directory}: the optimizer was saved for other parameters (e.g. missing "
                             f"{missing}); was the checkpoint written for another model or train.lora?")
        group.update({k: v for k, v in saved.items() if k != "params"})
    load_optimizer_shards(directory, named_params, optimizer, strategy)
