"""Plain data over a pipe, between the code reward's judge and the candidate (copied into both sandboxes as
wire.py; standard library only, never imported by rollart itself).

One message is one JSON line. A value is encoded as JSON where JSON can say it exactly — None, bools,
ints, floats (NaN and infinities included), strings, lists — and every other kind as a one-key object:
`{"tuple": [...]}`, `{"set": [...]}`, `{"frozenset": [...]}`, `{"dict": [[key, value], ...]}`,
`{"bytes": "<hex>"}`, `{"complex": [re, im]}`. Anything else is not plain data and is refused.

`decode` is what the judge trusts: it builds fresh built-in objects from parsed JSON only, so whatever the
candidate's process did to its own `json`, its classes or its `__eq__`, the judge compares values it made
itself. Malformed input raises `WireError`.
"""

import json

# bound at import, before the solution runs: a solution that patches json.dumps only breaks its own answers
_dumps, _loads = json.dumps, json.loads
TAGS = ("tuple", "set", "frozenset", "dict", "bytes", "complex")


class WireError(ValueError):
    """A message or value that is not plain data in this format."""


def encode(value, depth=0):
    if depth > 100:
        raise WireError("value nested more than 100 levels deep")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise WireError(f"{kind.__name__} is not plain data (None, bool, int, float, str, bytes, complex, "
                    "list, tuple, set, frozenset, dict)")


def decode(data, depth=0):
    if depth > 100:
        raise WireError("value nested more than 100 levels deep")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise WireError(f"not an encoded value: {kind.__name__}")
    tag, body = next(iter(data.items()))
    try:
        if tag in ("tuple", "set", "frozenset") and type(body) is list:
            items = [decode(v, depth + 1) for v in body]
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise WireError("dict items must be [key, value] pairs")
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            return out
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "complex" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
            return complex(body[0], body[1])
    except TypeError as exc:  # an unhashable set member or dict key
        raise WireError(str(exc)) from None
    raise WireError(f"unknown or malformed tag {tag!r}")


def dump_line(message) -> bytes:
    return (_dumps(message, separators=(",", ":")) + "\n").encode()


def parse_line(line: bytes):
    """One received message (a JSON object); WireError for anything else."""
    try:
        message = _loads(line)
    except (ValueError, RecursionError) as exc:  # ValueError covers bad UTF-8 and ints over 4300 digits
        raise WireError(f"malformed message: {str(exc)[:200]}") from None
    if type(message) is not dict:
        raise WireError("a message must be a JSON object")
    return message
