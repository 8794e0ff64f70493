"""Safetensors files written one tensor at a time, and read back a range of rows at a time.

In (writing): a file path, the names, dtypes and shapes of what goes in, then the tensors themselves in that
order, as they come (an iterator: each may be gathered from shards just before it is written). Out: a
standard `.safetensors` file — `safetensors.safe_open`, transformers and vLLM read it unchanged.
In (reading): safetensors files, whole or holding row ranges of bigger tensors (a rank's shard of an
optimizer state). Out: a `TensorReader` that answers a tensor's global shape and any range of its rows,
reading only the bytes of those rows (`safe_open(...).get_slice`).

Why not `safetensors.torch.save_file`: it builds the whole file in memory first — the whole model on one
rank, which is what a sharded trainer must never need. The format is a little-endian u64 header length, a
JSON header {name: {dtype, shape, data_offsets}} padded to 8 bytes, then the raw bytes; the writer checks
every tensor against its announced dtype and shape, and the file appears under its name only once complete.

Guarantees: what `TensorReader.read` returns equals, bit for bit, the rows of the tensor that was written,
whatever ranges the writers held and the reader asks for; a name or shape the files do not have is an error
naming the tensor and both shapes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

_CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


def write_safetensors(path: str | Path, specs: Sequence[TensorSpec], tensors: Iterable[torch.Tensor],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` (in the order of `specs`, consumed one at a time) to `path` (module docstring)."""
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for s in specs:
        if s.dtype not in _CODES:
            raise TypeError(f"{s.name}: dtype {s.dtype} cannot go into a safetensors file")
        header[s.name] = {"dtype": _CODES[s.dtype], "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    count = 0
    with tmp.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for s, t in zip(specs, tensors):
            if t.dtype != s.dtype or tuple(t.shape) != s.shape:
                raise ValueError(f"{s.name}: got {t.dtype} {tuple(t.shape)}, announced {s.dtype} {s.shape}")
            f.write(memoryview(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()))
            count += 1
    if count != len(specs):
        tmp.unlink()
        raise ValueError(f"{path}: {len(specs)} tensors announced, {count} given")
    os.replace(tmp, path)


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of a tensor, stored as `key` in `file` (a 0-d tensor: start = stop = 0)."""

    file: Path
    key: str
    start: int
    stop: int


class TensorReader:
    """Named tensors spread over safetensors files, whole or as row ranges; reads any range of rows."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], pieces: Mapping[str, Sequence[Piece]],
                 source: str) -> None:
        self.shapes, self.pieces, self.source = dict(shapes), {k: list(v) for k, v in pieces.items()}, source
        self._open: dict[Path, object] = {}

    @classmethod
    def of_files(cls, files: Iterable[str | Path], source: str | None = None) -> TensorReader:
        """Whole tensors, each in one of `files` (e.g. a Hugging Face checkpoint's shards)."""
        from safetensors import safe_open

        shapes: dict[str, tuple[int, ...]] = {}
        pieces: dict[str, list[Piece]] = {}
        files = [Path(f) for f in files]
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    shape = tuple(f.get_slice(key).get_shape())
                    shapes[key] = shape
                    pieces[key] = [Piece(file, key, 0, shape[0] if shape else 0)]
        return cls(shapes, pieces, source or ", ".join(str(f) for f in files))

    @classmethod
    def of_checkpoint(cls, directory: str | Path) -> TensorReader:
        """The weights of a Hugging Face checkpoint directory (model.safetensors, or its sharded index)."""
        path = Path(directory)
        index = path / "model.safetensors.index.json"
        if index.is_file():
            files = sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
        elif (path / "model.safetensors").is_file():
            files = [path / "model.safetensors"]
        else:
            raise FileNotFoundError(f"{path} holds no safetensors weights (model.safetensors or its index)")
        return cls.of_files(files, str(path))

    def names(self) -> list[str]:
        return list(self.shapes)

    def read(self, name: str, shape: tuple[int, ...], rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Rows [a, b) of tensor `name` (all of it when `rows` is None), whose full shape must be `shape`."""
        if name not in self.shapes:
            raise KeyError(f"{self.source}: no tensor {name!r} (it holds {len(self.shapes)}, e.g. "
                           f"{sorted(self.shapes)[:3]}); was it written for another model?")
        if self.shapes[name] != tuple(shape):
            raise ValueError(f"{self.source}: tensor {name!r} has shape {list(self.shapes[name])} there but "
                             f"{list(shape)} in this model (a checkpoint of another model shape?)")
        if not shape:
            return self._slice(self.pieces[name][0], None)
        a, b = rows if rows is not None else (0, shape[0])
        parts = [self._slice(p, (max(a, p.start) - p.start, min(b, p.stop) - p.start))
                 for p in sorted(self.pieces[name], key=lambda p: p.start) if p.start < b and p.stop > a]
        if b <= a:  # a rank past the end of a short tensor holds no rows of it
            return self._slice(self.pieces[name][0], (0, 0))
        covered = sum(part.shape[0] for part in parts)
        if covered != b - a:
            raise ValueError(f"{self.source}: rows {a}:{b} of {name!r} are not all stored (found {covered})")
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _slice(self, piece: Piece, rows: tuple[int, int] | None) -> torch.Tensor:
        from safetensors import safe_open

        if piece.file not in self._open:
            self._open[piece.file] = safe_open(str(piece.file), framework="pt")
        handle = self._open[piece.file]
        if rows is None:
            return handle.get_tensor(piece.key)  # type: ignore[attr-defined]
        return handle.get_slice(piece.key)[rows[0]:rows[1]]  # type: ignore[attr-defined]
