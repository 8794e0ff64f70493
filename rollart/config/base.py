"""What every config section is built on: the `Section` base model and the trust markers.

In: nothing of rollart. Out: `Section`, the base of every section; the `TRUST_*` markers a field carries in its
`json_schema_extra` (what `config explain` and `rollart eval` read); `is_loopback_host`, `is_import_path` and
`reaches_beyond`, which say how far a value reaches.

Guarantees: a `Section` forbids unknown keys, validates every assignment, refuses inf and NaN and never takes a
boolean for a number (`alpha: true` is an error, not 1).
"""

from __future__ import annotations

import ipaddress
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback IP (127.0.0.0/8, ::1, ::ffff:127.x); any other name counts as remote (no DNS)."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


# What a value of a key can do beyond the run itself (`explain.trusted_values`): a run directory's config.yaml
# is data from anyone, so `rollart eval RUN_DIR` uses such a value only when the user gives the key again or
# passes --trust-run-config. IMPORT counts only a `module.path:attr` value.
TRUST_IMPORT = {"trust": "imports code"}
TRUST_CODE = {"trust": "runs this program"}
TRUST_NETWORK = {"trust": "sends data or a secret there"}
TRUST_GUARD = {"trust": "weakens a safeguard"}


def is_import_path(value: str) -> bool:
    """`module.path:attr` (what imports code), not a built-in name nor a `gem:`/`gym:`/`remote:` id."""
    module, sep, attr = value.strip().partition(":")
    return bool(sep and attr) and module not in ("gem", "gym", "remote") and all(
        p.isidentifier() for p in module.split("."))


def reaches_beyond(value: str) -> str:
    """What a value of an import field (an env, agent, demonstrations or reward spec) does beyond the run:
    imports code (`module.path:attr`), sends data there (`remote:<url>`, an env server), or '' (a built-in)."""
    if is_import_path(value):
        return TRUST_IMPORT["trust"]
    return TRUST_NETWORK["trust"] if value.strip().startswith("remote:") else ""


def _numeric(annotation: Any) -> bool:
    """int or float (optionally `| None`), where a YAML `true` must not pass for 1."""
    args = typing.get_args(annotation) or (annotation,)
    return bool(args) and all(a in (int, float, type(None)) for a in args) and any(a in (int, float) for a in args)


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated, numbers are finite
    and a boolean is never taken for a number (`alpha: true` is an error, not 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
        return value
