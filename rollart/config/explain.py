"""The config schema described for people: every key's type, default, allowed values and description.

In: the pydantic schema of `rollart.config` (nothing else; no config is loaded). Out:
- `schema_keys()`: a `KeyDoc` for every key, sections included, in schema order. Entries of a named
  mapping (`pools`, `roles`, `domains`) are written with a `<name>` placeholder: `domains.<name>.weight`.
- `find_key(key)`: the `KeyDoc` of a dotted key as a user writes it (`domains.math.weight` is
  `domains.<name>.weight`); `unknown_key_hint(loc)`: what to say about an unknown key (close matches, the
  valid keys beside it), the one text `rollart config explain` and the config loader's errors both use.
- `explain(key)`: the text `rollart config explain [KEY]` prints; `configuration_markdown()`: the text of
  docs/configuration.md (`make docs` writes it; a test fails when the file is stale).

- `trusted_values(cfg)`: every value of a config that imports code, runs a program, sends data elsewhere or
  weakens a safeguard (the fields marked `TRUST_*` in `rollart.config`) — what `rollart eval RUN_DIR`
  refuses to take from a run directory's config.yaml unless the user gives it again.

Guarantee: a key's description is its field's `description`, or for a section without one, the first
paragraph of its class docstring; `undescribed_keys()` lists the keys that have neither (a test keeps it
empty, so a new field cannot land without one).
"""

from __future__ import annotations

import difflib
import json
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rollart.config.base import TRUST_IMPORT, reaches_beyond
from rollart.config.run import RunConfig

ENTRY = "<name>"  # stands for the name of an entry in a named mapping (pools, roles, domains)
REGENERATE = "make docs  (or: rollart config explain --markdown > docs/configuration.md)"


@dataclass(frozen=True)
class KeyDoc:
    """One config key, described."""

    key: str  # dotted, with ENTRY for the name of a mapping entry
    type: str  # "int", "str", "list[str]", "section", "mapping of name → section" …
    allowed: str  # "≥ 0", "none | turn | batch", "true | false", "any string" …; "" for a section
    default: str | None  # as YAML (JSON flow style); None when the key is required or is a section
    description: str
    section: bool  # has keys of its own (`rollart config explain KEY` lists them)


# --- walking the schema ------------------------------------------------------------------------------


def schema_keys() -> list[KeyDoc]:
    """Every key of `RunConfig`, depth first in schema order (a section before its keys)."""
    return list(_walk(RunConfig, ()))


def _walk(model: type[BaseModel], prefix: tuple[str, ...]) -> Iterator[KeyDoc]:
    for name, field in model.model_fields.items():
        loc = prefix + (name,)
        sub, named = _section_of(field.annotation)
        yield _doc(loc, field, sub, named)
        if sub is not None:
            yield from _walk(sub, loc + ((ENTRY,) if named else ()))


def _section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the section model a field holds, whether it is a mapping of named entries of it)."""
    annotation = _unwrap_optional(annotation)
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        return (value, True) if _is_model(value) else (None, False)
    return (annotation, False) if _is_model(annotation) else (None, False)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _unwrap_optional(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _optional(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    )


def _doc(loc: tuple[str, ...], field: FieldInfo, sub: type[BaseModel] | None, named: bool) -> KeyDoc:
    key = ".".join(loc)
    description = " ".join((field.description or "").split())
    if sub is not None:
        if not description:
            description = " ".join((sub.__doc__ or "").strip().split("\n\n")[0].split())
        kind = f"mapping of {ENTRY} → section" if named else "section"
        return KeyDoc(key, kind + (" or null" if _optional(field.annotation) else ""), "", None, description, True)
    default = None if field.is_required() else _yaml(field.get_default(call_default_factory=True))
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "trust" in extra:
        does = "a module.path:attr value imports code" if extra == TRUST_IMPORT else extra["trust"]
        description += (f" ({does}: `rollart eval` does not take it from a run directory's config unless given "
                        "again or with --trust-run-config)")
    return KeyDoc(key, _type_name(field.annotation), _allowed(field), default, description, False)


def _type_name(annotation: Any) -> str:
    inner = _unwrap_optional(annotation)
    suffix = " or null" if _optional(annotation) else ""
    if typing.get_origin(inner) is Literal:
        kinds = sorted({type(v).__name__ for v in typing.get_args(inner)})
        return " or ".join(kinds) + suffix
    if typing.get_origin(inner) in (list, dict):
        return _plain(inner) + suffix
    return getattr(inner, "__name__", str(inner)) + suffix


def _plain(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is None:
        return "any" if annotation is Any else getattr(annotation, "__name__", str(annotation))
    return f"{origin.__name__}[{', '.join(_plain(a) for a in typing.get_args(annotation))}]"


_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", "≥"), (annotated_types.Lt, "lt", "<"),
           (annotated_types.Le, "le", "≤"))


def _allowed(field: FieldInfo) -> str:
    inner = _unwrap_optional(field.annotation)
    null = " | null" if _optional(field.annotation) else ""
    if typing.get_origin(inner) is Literal:
        return " | ".join(str(v) for v in typing.get_args(inner)) + null
    if inner is bool:
        return "true | false" + null
    bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata for kind, attr, symbol in _BOUNDS
              if isinstance(m, kind)]
    if bounds:
        return ", ".join(bounds) + null
    pattern = next((getattr(m, "pattern") for m in field.metadata if getattr(m, "pattern", None)), None)
    if pattern:
        return f"a string matching {pattern}" + null
    if inner is str:
        return "any string" + null
    if inner in (int, float):
        return f"any {inner.__name__}" + null
    return f"a {_plain(inner)}" + null


def _yaml(value: Any) -> str:
    """A default as YAML (JSON's flow style is valid YAML)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, dict):
        value = {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in value.items()}
    return json.dumps(value, ensure_ascii=False)


# --- values a run directory may not decide -----------------------------------------------------------


@dataclass(frozen=True)
class TrustedValue:
    """A value of a config that reaches beyond the run: the dotted key, the value, what it does."""

    key: str
    value: Any
    does: str  # "imports code", "runs this program", "sends data or a secret there", "weakens a safeguard"


def trusted_values(cfg: BaseModel, prefix: str = "") -> list[TrustedValue]:
    """The values of `cfg` in fields marked `TRUST_*` (rollart.config) that do something: an import field
    holding `module.path:attr` (or a `remote:` env), any other marked field holding other than its default."""
    out: list[TrustedValue] = []
    for name, field in type(cfg).model_fields.items():
        key, value = f"{prefix}{name}", getattr(cfg, name)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "trust" in extra:
            if extra == TRUST_IMPORT:  # only some values of these reach beyond the run
                does = reaches_beyond(value)
            else:
                does = str(extra["trust"]) if value != field.get_default(call_default_factory=True) else ""
            if does:
                out.append(TrustedValue(key, value, does))
        elif isinstance(value, BaseModel):
            out += trusted_values(value, f"{key}.")
        elif isinstance(value, dict):
            for entry, item in value.items():
                if isinstance(item, BaseModel):
                    out += trusted_values(item, f"{key}.{entry}.")
    return out


# --- finding keys --------------------------------------------------------------------------------------


def find_key(key: str) -> KeyDoc | None:
    """The description of `key` as a user writes it (entry names of pools/roles/domains are any names)."""
    pattern = _pattern(tuple(key.split(".")))
    return next((doc for doc in schema_keys() if doc.key == pattern), None) if pattern else None


def _pattern(loc: tuple[str, ...]) -> str | None:
    """`loc` with each entry name replaced by ENTRY, or None if it leaves the schema."""
    model: Any = RunConfig
    out: list[str] = []
    i = 0
    while i < len(loc):
        if model is None or loc[i] not in model.model_fields:
            return None
        out.append(loc[i])
        model, named = _section_of(model.model_fields[loc[i]].annotation)
        i += 1
        if named and i < len(loc):
            out.append(ENTRY)
            i += 1
    return ".".join(out)


def keys_at(loc: tuple[str, ...]) -> list[str]:
    """The key names allowed under `loc` (entry names skipped); [] if `loc` is not a section."""
    pattern = _pattern(loc) if loc else ""
    if pattern is None:
        return []
    model: Any = RunConfig
    for part in pattern.split(".") if pattern else []:
        if part != ENTRY:
            model, _ = _section_of(model.model_fields[part].annotation)
        if model is None:
            return []
    return list(model.model_fields)


def _suggest(loc: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """For an unknown key `loc`: (close matches among the keys valid beside it, those valid keys). The close
    matches are names at that level; with no valid level, whole dotted keys close to `loc`."""
    valid = keys_at(loc[:-1])
    if valid:
        return difflib.get_close_matches(loc[-1], valid, n=3, cutoff=0.5), valid
    wanted = ".".join(loc)
    everything = [doc.key for doc in schema_keys()]
    same_leaf = [k for k in everything if k.rsplit(".", 1)[-1] == loc[-1]]
    return (same_leaf or difflib.get_close_matches(wanted, everything, n=3, cutoff=0.6))[:3], []


def unknown_key_hint(loc: tuple[str, ...]) -> str:
    """'did you mean alpha? valid keys here: alpha, barrier, …' for the unknown key `loc`."""
    close, valid = _suggest(loc)
    parts = [f"did you mean {' or '.join(close)}?"] if close else []
    if valid:
        parts.append(f"valid keys here: {', '.join(sorted(valid))}")
    return " ".join(parts) or "no key of the schema is close to it (rollart config explain lists them)"


def undescribed_keys() -> list[str]:
    """Keys with no description (neither the field's nor, for a section, its class docstring's)."""
    return [doc.key for doc in schema_keys() if not doc.description]


# --- rollart config explain -------------------------------------------------------------------------------


def explain(key: str | None = None) -> str:
    """The text of `rollart config explain [KEY]`. ValueError (with close matches) for an unknown key."""
    if not key:
        return _listing("", "rollart's configuration. Sections and top-level keys:") + (
            "\n\n`rollart config explain KEY` describes a key or lists a section's keys (entries of pools, "
            "roles and domains by any name: domains.math.weight); `rollart config explain --markdown` prints "
            "the whole reference, docs/configuration.md."
        )
    loc = tuple(key.split("."))
    pattern = _pattern(loc)
    if pattern is not None and pattern.endswith(f".{ENTRY}"):  # an entry: domains.math
        mapping = find_key(loc[0]) if len(loc) == 2 else find_key(".".join(loc[:-1]))
        assert mapping is not None
        return _listing(mapping.key, f"{key}: an entry of {mapping.key}. {mapping.description}",
                        entry=f"  its keys:")
    doc = find_key(key)
    if doc is None:
        raise ValueError(f"unknown config key '{key}'; {unknown_key_hint(loc)}")
    if doc.section:
        return _listing(doc.key, f"{key} ({doc.type}): {doc.description}", entry=_entries(key, doc))
    lines = [key, f"  type:        {doc.type}", f"  default:     {_default_text(key, doc)}",
             f"  allowed:     {doc.allowed}"]
    lines += textwrap.wrap(doc.description, width=100, initial_indent="  description: ",
                           subsequent_indent=" " * 15)
    return "\n".join(lines)


def _listing(prefix: str, title: str, entry: str = "") -> str:
    depth = prefix.count(".") + 1 if prefix else 0
    children = [d for d in schema_keys() if d.key.startswith(f"{prefix}." if prefix else "")
                and d.key.count(".") == depth + (1 if d.key.startswith(f"{prefix}.{ENTRY}") else 0)]
    width = max((len(d.key) for d in children), default=0) + 2
    rows = [f"  {d.key + ('.*' if d.section else ''):<{width + 2}}{d.description}" for d in children]
    return "\n".join([title, *([entry] if entry else []), *rows])


def _entries(key: str, doc: KeyDoc) -> str:
    """For a named mapping (pools, roles, domains): the entries the defaults declare."""
    if not doc.type.startswith("mapping"):
        return ""
    value = _default_value(tuple(key.split(".")))
    names = ", ".join(value) if isinstance(value, dict) and value else "none"
    return f"  entries in the defaults: {names}; their keys:"


def _default_text(key: str, doc: KeyDoc) -> str:
    """The key's schema default, plus the default entry's own value when it differs (domains.math.weight)."""
    base = "none: required" if doc.default is None else doc.default
    if ENTRY in doc.key:
        value = _default_value(tuple(key.split(".")))
        if value is not _MISSING and _yaml(value) != doc.default:
            return f"{base} (in the default entry {'.'.join(key.split('.')[:2])}: {_yaml(value)})"
    return base


_MISSING = object()


def _default_value(loc: tuple[str, ...]) -> Any:
    node: Any = RunConfig().model_dump(mode="json")
    for part in loc:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


# --- docs/configuration.md --------------------------------------------------------------------------------


def configuration_markdown() -> str:
    """The configuration reference, generated from the schema: a table of keys per section."""
    keys = schema_keys()
    sections = [("", "Top level", RunConfig.__doc__ or "")] + [
        (d.key, f"`{d.key}`", d.description) for d in keys if d.section
    ]
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from rollart/config/; do not edit. Regenerate with: " + REGENERATE + " -->",
        "",
        "One typed schema (`rollart/config/`). A run file lists only what differs from the defaults, and",
        "`key.path=value` overrides follow it on the command line: `rollart train my_run.yaml rollout.alpha=2`.",
        "`rollart config show [RUN.yaml] [k=v …]` prints the resolved config; `rollart config explain KEY`",
        "prints one key's entry below. Entries of `pools`, `roles` and `domains` have names of your choice",
        f"(written `{ENTRY}` here): a name the defaults use merges into that entry, a new name adds one, and",
        "`null` removes one (`domains.math=null`).",
    ]
    for prefix, title, description in sections:
        rows = [d for d in keys if not d.section and _parent(d.key) == prefix]
        if not rows:
            continue
        out += ["", f"## {title}", "", " ".join(description.split()), ""]
        if prefix.count(".") == 0 and prefix and _section_type(keys, prefix).startswith("mapping"):
            value = _default_value((prefix,))
            out += [f"Entries in the defaults: {', '.join(f'`{n}`' for n in value) or 'none'}.", ""]
        out += ["| key | type | allowed | default | description |", "|---|---|---|---|---|"]
        out += [f"| `{d.key}` | {_cell(d.type)} | {_cell(d.allowed)} | "
                f"{'required' if d.default is None else _code(d.default)} | {_cell(d.description)} |" for d in rows]
    return "\n".join(out) + "\n"


def _parent(key: str) -> str:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    return parent[: -len(f".{ENTRY}")] if parent.endswith(f".{ENTRY}") else parent


def _section_type(keys: list[KeyDoc], key: str) -> str:
    return next(d.type for d in keys if d.key == key)


def _cell(text: str) -> str:
    """Table-cell text: `|` would end the cell and `<tag>` would vanish as HTML when rendered."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "\\<") for i, p in enumerate(parts))  # not in `code`


def _code(text: str) -> str:
    return f"`{text}`".replace("|", "\\|")
