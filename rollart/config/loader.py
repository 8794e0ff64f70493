"""Load a `RunConfig` from a sparse YAML run file plus `key.path=value` overrides.

In: an optional YAML path and a list of `a.b.c=value` strings (values parsed as YAML scalars/lists).
Out: a validated `RunConfig`, or a `ConfigError` whose message names every bad key or value, where it came
from (file and line, or the command line) and what would be valid — a key written twice in the file, a
boolean for a number and a non-finite number included. Nothing is started before this succeeds. What the
config names outside itself (env classes, reward functions, run_dir) is checked by `rollart.job.preflight`.

Merge rules: the file and then the overrides are merged over the defaults key by key; named entries
(`pools.<name>`, `domains.<name>`, `roles.<name>`) merge into the default entry of the same name, a new
name adds an entry, and `null` removes one (`domains.math=null`). An empty `domains: {}` or `pools: {}`
would merge as nothing and keep the defaults unsaid: it is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rollart.config.algorithm import apply_preset
from rollart.config.run import RunConfig
from rollart.config.explain import unknown_key_hint
from rollart.base.run_dir import RunPaths

Location = tuple[str, ...]
_NAMED_SECTIONS = ("pools", "domains", "roles")  # name → entry mappings (merged entry by entry)


class ConfigError(ValueError):
    """A config that cannot be used; the message is meant for the user as-is. CLI exit code 2."""


@dataclass
class _Provenance:
    """Where each key path came from, to say it in errors."""

    sources: dict[Location, str] = field(default_factory=dict)

    def of(self, loc: Location) -> str:
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.sources:
                return self.sources[loc[:n]]
        # an error on a parent of what was set (e.g. unknown key 'trian' from the override trian.steps=3)
        for key, source in self.sources.items():
            if key[: len(loc)] == loc:
                return source
        return "the defaults"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                resolved: bool = False) -> RunConfig:
    """`resolved=True`: the file is a run's resolved config (RUN_DIR/config.yaml), whose named-entry
    sections are complete — a default entry it lacks was removed by that run and stays removed."""
    data: dict[str, Any] = RunConfig().model_dump(mode="python")
    prov = _Provenance()
    if path is not None:
        file_data = _read_yaml(Path(path), prov)
        if not resolved:
            _refuse_empty_sections(file_data, prov)
        if resolved:
            for section in _NAMED_SECTIONS:
                if isinstance(file_data.get(section), dict):
                    data[section] = {k: v for k, v in data[section].items() if k in file_data[section]}
        _merge(data, file_data)
    for item in overrides or []:
        key, value = _parse_override(item)
        loc = tuple(key.split("."))
        _record_override(loc, value, f"the command line ({item})", prov)
        nested = _nest(loc, value)
        _refuse_empty_sections(nested, prov)
        _merge(data, nested)
    try:
        _apply_algorithm(data, prov)
    except ValueError as exc:
        raise ConfigError(f"{exc} (from {prov.of(('train', 'algorithm'))})") from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, prov)) from None


def _apply_algorithm(data: dict[str, Any], prov: _Provenance) -> None:
    """`train.algorithm`'s preset under the `train.*` keys the file and the command line gave (the merged data
    holds every default, which would otherwise hide the preset); deprecated keys mapped (`apply_preset`)."""
    train = data.get("train")
    if not isinstance(train, dict):
        return
    given = {loc[1] for loc in prov.sources if len(loc) >= 2 and loc[0] == "train"}
    defaults = RunConfig().train.model_dump(mode="python")
    data["train"] = {**defaults, **apply_preset({k: train[k] for k in given if k in train})}


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def write_resolved(cfg: RunConfig, run_dir: str | Path) -> Path:
    """Write the resolved config to RUN_DIR/config.yaml (so a run says exactly what it ran with)."""
    paths = RunPaths.of(run_dir)
    return paths.write(paths.config, dump_config(cfg))  # atomically, never through a link


# --- reading -----------------------------------------------------------------------------------------


def _read_yaml(path: Path, prov: _Provenance) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (give a YAML run file, e.g. configs/demo.yaml)")
    text = path.read_text()
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a run file must be a mapping of keys to values, not {type(data).__name__}")
    _record_lines(node, (), path, prov)
    return data


def _record_lines(node: yaml.Node | None, loc: Location, path: Path, prov: _Provenance) -> None:
    """Where each key was written; a key written twice in one mapping is an error (YAML keeps the last)."""
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key in first_line:
                raise ConfigError(f"{path} line {line}: duplicate key '{'.'.join(loc + (key,))}' (first at line "
                                  f"{first_line[key]}); a key may appear once — which one did you mean?")
            first_line[key] = line
            sub = loc + (key,)
            prov.sources[sub] = f"{path} line {line}"
            _record_lines(value_node, sub, path, prov)


def _record_override(loc: Location, value: Any, source: str, prov: _Provenance) -> None:
    """Where an override's key (and, for a mapping value, each key inside it) came from."""
    prov.sources[loc] = source
    if isinstance(value, dict):
        for key, sub in value.items():
            _record_override(loc + (str(key),), sub, source, prov)


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"override '{item}' is not of the form key.path=value (e.g. rollout.alpha=2 or train.steps=10)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _refuse_empty_sections(update: dict[str, Any], prov: _Provenance) -> None:
    """`domains: {}` (or `pools: {}`) merges as nothing, so the defaults would silently stay: an error."""
    for section in ("domains", "pools"):
        if update.get(section) == {}:
            defaults = ", ".join(f"{name}: null" for name in getattr(RunConfig(), section))
            raise ConfigError(
                f"'{section}' = {{}} (from {prov.of((section,))}) adds and removes nothing, so the default {section} "
                f"would stay: name the {section} you want (a run needs at least one), and remove a default one "
                f"with null ({section}: {{{defaults}}})"
            )


def _nest(loc: Location, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(loc):
        out = {part: out}
    return out


def _merge(base: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if value is None and key in base and isinstance(base[key], dict) and _is_named_entry(base, key):
            del base[key]
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _is_named_entry(parent: dict[str, Any], key: str) -> bool:
    # a removable entry is a mapping inside a name → entry dict (pools, domains, roles)
    return isinstance(parent.get(key), dict)


# --- explaining errors -------------------------------------------------------------------------------


def _describe(exc: ValidationError, prov: _Provenance) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        dotted = ".".join(loc) or "(config)"
        source = prov.of(loc)
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown key '{dotted}' (from {source}); {unknown_key_hint(loc)}")
        elif err["type"] == "value_error" and not loc:
            for problem in str(err["msg"]).removeprefix("Value error, ").split("\n"):
                field_loc = tuple(problem.split(":", 1)[0].split("."))
                lines.append(f"{problem} (from {prov.of(field_loc)})")
        elif err["type"] == "missing":
            lines.append(f"'{dotted}' is required but missing (from {source})")
        else:
            lines.append(f"'{dotted}' = {err.get('input')!r} (from {source}): {err['msg']}")
    return "invalid config:\n  - " + "\n  - ".join(lines)
