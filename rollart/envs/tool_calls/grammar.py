"""Pieces of the grammars that force a family's tool calls (llguidance's Lark dialect; see
rollart/envs/agents/constraints.py for how a request's grammar is put together).

JSON is written compactly — `", "` and `": "` separators and no other whitespace, what `json.dumps` and the
templates' `tojson` write — so a constrained output re-renders to the same text.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_rule(schema: Mapping[str, Any]) -> str:
    """JSON valid under `schema`, compactly written."""
    return "%json" + json.dumps({**schema, "x-guidance": COMPACT}, ensure_ascii=False)


def quoted(text: str) -> str:
    """A Lark string literal for `text`."""
    return json.dumps(text, ensure_ascii=False)


def xml_value(schema: Any) -> str:
    """An argument's value in an XML-style format: a string as plain text on one line (no '<'), anything else
    as compact JSON under its schema."""
    if isinstance(schema, Mapping) and schema.get("type") == "string" and not ({"enum", "const"} & set(schema)):
        return r"/[^<\n]*/"
    return json_rule(schema if isinstance(schema, Mapping) else {})


def properties(parameters: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name, schema) of each property a forced call writes: the required ones, in the schema's order (all of
    them when none is marked required)."""
    props = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(props, Mapping):
        return []
    required = parameters.get("required")
    names = [n for n in props if n in required] if isinstance(required, list) and required else list(props)
    return [(n, props[n]) for n in names]
