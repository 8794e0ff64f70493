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

Why not `torch.save`: it pickles, and unpickling a crafted file runs code (`resume=true` on a run dir from
elsewhere). JSON and safetensors are data only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

TAGS = ("__tensor__", "__tuple__", "__dict__", "__ndarray__")


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
    import json

    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(state, tensors, stem.name)
    stem.parent.mkdir(parents=True, exist_ok=True)
    if tensors:
        save_file(tensors, str(_file(stem, ".safetensors")))
    _file(stem, ".json").write_text(json.dumps(encoded))


def load_state(stem: Path, device: str | torch.device = "cpu") -> Any:
    """Read what `save_state(stem, ...)` wrote; tensors on `device`."""
    import json

    encoded = json.loads(_file(stem, ".json").read_text())
    weights = _file(stem, ".safetensors")
    tensors = load_file(str(weights), device=str(device)) if weights.is_file() else {}
    return _decode(encoded, tensors)


def has_state(stem: Path) -> bool:
    return _file(stem, ".json").is_file()
