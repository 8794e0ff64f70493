"""Text from outside — what a policy writes, what a file or a peer holds — read and shown safely.

In: a string that anyone may have written. Out:
- `loads_json(text)`: its JSON value, or `ValueError` — never `RecursionError`. `json.loads` recurses once
  per nesting level and raises `RecursionError` for ~1,000 nested brackets (a collapsing policy that repeats
  `[` writes that); a value nested deeper than `max_depth` (default `MAX_JSON_DEPTH`) is refused too, so a
  deep value that did parse never reaches code that recurses over it later (`json.dumps`, `==`, pickling).
- `printable(text)`: the text with control and format characters (terminal escapes: OSC 52 clipboard
  writes, window titles, colours, cursor moves) shown as Python escapes, newlines and tabs kept — what may
  reach a terminal or a log.
- `markdown_text(text)`: the text as literal Markdown (HTML and Markdown syntax escaped) — for the parts
  of TensorBoard's text tab that are not code blocks.
- `matching_braces(text)`: {position of each `{` → position of the `}` that closes it}, for `\\boxed{...}`
  parsers (scanning forward from every opening instead is quadratic in a text of many unclosed ones).

Guarantees: each function is linear in the length of its input and raises nothing but the documented
`ValueError` (`loads_json`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

MAX_JSON_DEPTH = 64  # nesting levels of a JSON value from outside (tool-call arguments are a few deep)


def loads_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(text)`, except that too deep a value is a `ValueError` saying so (see the module docstring)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    if isinstance(value, (list, dict)) and _depth_over(value, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels")
    return value


def _depth_over(value: Any, max_depth: int) -> bool:
    """Whether `value` nests lists and objects deeper than `max_depth` (an explicit stack: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return False


def printable(text: str) -> str:
    """`text` with control and format characters shown as escapes (`\\x1b`, `\\u202e`); newlines and tabs kept."""
    return "".join(c if c in "\n\t" or unicodedata.category(c)[0] != "C" else repr(c)[1:-1] for c in text)


_BRACE = re.compile(r"[{}]")


def matching_braces(text: str) -> dict[int, int]:
    """Each `{` of `text` that is closed → the index of its `}` (nested braces balanced; one pass)."""
    opened: list[int] = []
    closes: dict[int, int] = {}
    for match in _BRACE.finditer(text):
        if match.group() == "{":
            opened.append(match.start())
        elif opened:
            closes[opened.pop()] = match.start()
    return closes


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!])")  # what Markdown's backslash escapes cover


def markdown_text(text: str) -> str:
    """`text` as literal Markdown on one line: HTML special characters as entities, Markdown syntax escaped,
    control characters shown as escapes, newlines as spaces."""
    flat = printable(text).replace("\n", " ").replace("\t", " ")
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN.sub(r"\\\1", flat)
