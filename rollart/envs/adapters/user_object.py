"""The callable a user's `module.path:attr` spec names: one importer for env classes (spec.py), agent
functions (agents/function.py) and dataset episodes (dataset/env.py).

In: the spec, what it configures (for the message), the forms that would be valid, and the error type to
raise. Out: the callable, imported (the current directory is importable, so `my_envs:MyEnv` finds
`./my_envs.py`); a module that does not import, a missing attribute or a non-callable raises `error` naming
`what`, the spec and the accepted forms. Its own module so that the modules it serves import it without
importing each other.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def import_user_object(spec: str, what: str, accepted: str, error: type[ValueError]) -> Any:
    """The callable `module.path:attr` names (the current directory is importable); `error` names `what`."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"{what} {spec!r}: cannot import module {module_name!r} ({exc}). Accepted: {accepted}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise error(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise error(f"{what} {spec!r}: {attr!r} is not callable")
    return target
