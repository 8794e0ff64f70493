"""Nested state (optimizer and scheduler state dicts, RNG states, the control plane's state) as two files that
load without running any code: `<stem>.json` and, when the state holds tensors, `<stem>.safetensors`.

In: a tree of dicts, lists, tuples, str, int, float (NaN/inf included), bool, None, torch tensors and numpy
arrays. Out: the same tree from `load_state` — ints stay ints, tuples stay tuples, dict keys keep their
types, tensors come back with their dtype, shape and values (on the device asked for).

Encoding (JSON): a dict whose keys are all strings is a JSON object; the other forms are one-key objects —
`{"__tensor__": name}` (the tensor `name` of the safetensors file), `{"__tuple__": [...]}`,
`{"__dict__": [[key, value], ...]}` (other keys, or a key that looks like one of these tags),
`{"__ndarray__": {"dtype", "shape", "data"}}`. Anything else raises `TypeError` naming where it is in the
tree: convert it to plain data first (e.g. `dataclasses.asdict`).

`inspect_state` reads the same files without loading a tensor (the JSON, and the safetensors header for
the tensor names): a truncated or corrupt file, an unknown tag or a tensor the safetensors file lacks is a
`StateFileError` naming the file and where in the tree — what the driver's pre-check runs before Ray starts.

Why not `torch.save`: it pickles, and unpickling a crafted file runs code (`resume=true` on a run dir from
elsewhere). JSON and safetensors are data only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

TAGS = ("__tensor__", "__tuple__", "__dict__", "__ndarray__")


class StateFileError(ValueError):
    """A state file that cannot be read back: the message names the file and the field."""


@dataclass(frozen=True)
class TensorRef:
    """A tensor of the safetensors file, by name, as `inspect_state` returns it (nothing loaded)."""

    name: str


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value.detach().to("cpu").clone().contiguous()  # safetensors refuses shared storage
        return {"__tensor__": name}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": {"dtype": str(value.dtype), "shape": list(value.shape), "data": value.ravel().tolist()}}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"__tuple__": items}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (len(value) == 1 and next(iter(value)) in TAGS):
            return {k: _encode(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
        return {"__dict__": [[_encode(k, tensors, f"{where}.key"), _encode(v, tensors, f"{where}[{k!r}]")]
                             for k, v in value.items()]}
    raise TypeError(f"{where}: a {type(value).__name__} cannot go into a checkpoint (JSON and safetensors only); "
                    "convert it to plain data")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        tag, body = next(iter(value.items()))
        if tag == "__tensor__":
            return tensors[body]
        if tag == "__tuple__":
            return tuple(_decode(v, tensors) for v in body)
        if tag == "__dict__":
            return {_freeze(_decode(k, tensors)): _decode(v, tensors) for k, v in body}
        if tag == "__ndarray__":
            return np.asarray(body["data"], dtype=body["dtype"]).reshape(body["shape"])
    return {k: _decode(v, tensors) for k, v in value.items()}


def _freeze(key: Any) -> Any:
    return tuple(_freeze(k) for k in key) if isinstance(key, (list, tuple)) else key


def _file(stem: Path, suffix: str) -> Path:
    return stem.parent / (stem.name + suffix)


def save_state(stem: Path, state: Any) -> None:
    """Write `state` to `<stem>.json` (+ `<stem>.safetensors` when it holds tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(state, tensors, stem.name)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if tensors:
        save_file(tensors, str(_file(stem, ".safetensors")))
    _file(stem, ".json").write_text(json.dumps(encoded))


def load_state(stem: Path, device: str | torch.device = "cpu") -> Any:
    """Read what `save_state(stem, ...)` wrote; tensors on `device`. `StateFileError` (naming the file and
    the field) for a file that does not parse or a tree that does not decode."""
    encoded = _read_json(stem)
    weights = _file(stem, ".safetensors")
    try:
        tensors = load_file(str(weights), device=str(device)) if weights.is_file() else {}
    except Exception as exc:  # noqa: BLE001 — safetensors raises its own error types for a bad file
        raise StateFileError(f"{weights}: not a readable safetensors file ({exc})") from None
    _check(encoded, set(tensors), _file(stem, ".json"), stem.name)
    return _decode(encoded, tensors)


def inspect_state(stem: Path) -> Any:
    """The tree `load_state(stem)` would return, with each tensor a `TensorRef` (none is loaded); every tag
    and tensor reference checked. `StateFileError` naming the file and the field otherwise."""
    encoded = _read_json(stem)
    weights = _file(stem, ".safetensors")
    names: set[str] = set()
    if weights.is_file():
        try:
            from safetensors import safe_open

            with safe_open(str(weights), framework="pt") as f:
                names = set(f.keys())
        except Exception as exc:  # noqa: BLE001 — safetensors raises its own error types for a bad header
            raise StateFileError(f"{weights}: not a readable safetensors file ({exc})") from None
    return _check(encoded, names, _file(stem, ".json"), stem.name)


def _read_json(stem: Path) -> Any:
    path = _file(stem, ".json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StateFileError(f"{path} is missing") from None
    except json.JSONDecodeError as exc:
        raise StateFileError(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}; a file "
                             "cut short by a crash or a full disk?)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StateFileError(f"{path} cannot be read ({exc})") from None


def _check(value: Any, tensors: set[str], path: Path, where: str) -> Any:
    """`_decode` without tensors: TensorRef for each, StateFileError naming `where` for a malformed node."""
    def bad(why: str) -> StateFileError:
        return StateFileError(f"{path}: field {where}: {why}")

    if isinstance(value, list):
        return [_check(v, tensors, path, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and next(iter(value)) in TAGS:
        tag, body = next(iter(value.items()))
        if tag == "__tensor__":
            if not isinstance(body, str) or body not in tensors:
                raise bad(f"tensor {body!r} is not in {_file(path.with_suffix(''), '.safetensors').name}")
            return TensorRef(body)
        if tag == "__tuple__":
            if not isinstance(body, list):
                raise bad("a __tuple__ must hold a list")
            return tuple(_check(v, tensors, path, f"{where}[{i}]") for i, v in enumerate(body))
        if tag == "__dict__":
            if not isinstance(body, list) or not all(isinstance(kv, list) and len(kv) == 2 for kv in body):
                raise bad("a __dict__ must hold [key, value] pairs")
            out = {}
            for key, item in body:
                key = _freeze(_check(key, tensors, path, f"{where}.key"))
                try:
                    out[key] = _check(item, tensors, path, f"{where}[{key!r}]")
                except TypeError:
                    raise bad(f"key {key!r} cannot be a dict key") from None
            return out
        try:  # __ndarray__
            return np.asarray(body["data"], dtype=body["dtype"]).reshape(body["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"not an array ({exc})") from None
    return {k: _check(v, tensors, path, f"{where}[{k!r}]") for k, v in value.items()}


def has_state(stem: Path) -> bool:
    return _file(stem, ".json").is_file()
