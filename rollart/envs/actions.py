"""Action text helpers shared by the built-in domains and the adapters: `\\boxed{...}` and code blocks.

In: a model's response text. Out: the content of its last `\\boxed{...}` (braces balanced, so
`\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`), or of its last fenced code block; None when there is none.
Written here rather than imported from GEM because importing `gem` configures the root logger.
"""

from __future__ import annotations

import re

from rollart.base.untrusted import matching_braces

_BOXED = "\\boxed{"
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*\n(.*?)```", re.DOTALL)


def boxed(content: str) -> str:
    """Format an action the way the built-in domains (and GEM) expect it: `\\boxed{content}`."""
    return _BOXED + content + "}"


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` (stripped), or None if there is no closed one (an unclosed
    last one leaves an earlier, closed one to count). Linear in the text: braces are matched in one pass."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    closes = matching_braces(text)
    while start >= 0:
        brace = start + len(_BOXED) - 1
        if brace in closes:
            return text[brace + 1 : closes[brace]].strip()
        start = text.rfind(_BOXED, 0, start)
    return None


def extract_code(text: str) -> str | None:
    """The last fenced code block (```python ... ```), else the last `\\boxed{...}`, else None."""
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1].strip("\n")
    return extract_boxed(text)
