"""Records of `rollart.types` as plain JSON values, and back — for what a run writes to disk (no pickle).

In: a frozen dataclass of `rollart/types.py` (a `Trajectory` with its task, turns and spans, a `ReadyGroup`
of the control plane …), or JSON data and the record class to rebuild. Out: `to_json(record)` → nested
dicts, lists, strings, numbers, booleans and None; `from_json(cls, data)` → the record, equal to the one
written (`from_json(type(r), to_json(r)) == r`).

How: a dataclass becomes `{field: value}`; an enum its value; a tuple, list or other sequence a list; a mapping a dict with
string keys. Reading follows the field annotations of `cls` (dataclasses, enums, `tuple[X, ...]`,
`X | None`, `Mapping`/`dict`, `Literal`, plain types), so a record that gains a field with a default still
reads files written before it. Floats round-trip exactly (Python writes the shortest repr that reads back
to the same double), so a restored trajectory's logprobs are bit-identical. Unknown keys are an error
naming the record and the key.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import types
import typing
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def to_json(value: Any) -> Any:
    """A JSON value for `value` (a record, an enum, a tuple/list/mapping of them, or a plain value)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, collections.abc.Sequence):  # tuples, lists, the twin's run-length token ids
        return [to_json(v) for v in value]
    raise TypeError(f"cannot write a {type(value).__name__} as JSON: {value!r}")


def from_json(cls: type[T], data: Any) -> T:
    """The record of type `cls` that `to_json` wrote as `data`."""
    return _read(cls, data, cls.__name__)


def _read(tp: Any, data: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any or tp is typing.Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _read(arg, data, where)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise ValueError(f"{where}: {data!r} matches none of {tp} ({'; '.join(errors)})")
    if origin is typing.Literal:
        if data not in typing.get_args(tp):
            raise ValueError(f"{where}: {data!r} is not one of {typing.get_args(tp)}")
        return data
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_read(args[0], v, f"{where}[{i}]") for i, v in enumerate(_list(data, where)))
        return tuple(_read(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, _list(data, where))))
    if origin in (list, collections.abc.Sequence):
        (arg,) = typing.get_args(tp) or (Any,)
        return [_read(arg, v, f"{where}[{i}]") for i, v in enumerate(_list(data, where))]
    if origin in (dict, collections.abc.Mapping):
        key_t, val_t = typing.get_args(tp) or (str, Any)
        if not isinstance(data, dict):
            raise TypeError(f"{where}: expected a mapping, got {type(data).__name__}")
        return {_read(key_t, k, where): _read(val_t, v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise TypeError(f"{where}: expected a {tp.__name__} object, got {type(data).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"{where}: {tp.__name__} has no field(s) {unknown}")
        return tp(**{k: _read(hints[k], v, f"{where}.{k}") for k, v in data.items()})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if tp is float and isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if isinstance(tp, type) and isinstance(data, tp):
        return data
    raise TypeError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {type(data).__name__} {data!r}")


def _list(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise TypeError(f"{where}: expected a list, got {type(data).__name__}")
    return data

