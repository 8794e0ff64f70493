"""Check what a config names outside itself, before anything starts: `check_config(cfg)`.

In: a validated `RunConfig` (the schema, types and cross-references are config_loader's job). Out: nothing,
or one `ConfigError` (CLI exit 2) listing every problem, each naming its key and what would be valid:
- `domains.<d>.env` — a built-in, a `module.path:Class` that imports, or an id GEM/gymnasium has registered
  (envs.check_env_spec; nothing is constructed); for an agent domain instead, `domains.<d>.agent` (and
  `demonstrations`) — a `module.path:function` that imports and takes the right arguments (nothing runs);
- `domains.<d>.reward.fn` — a built-in, or a `module.path:callable` that imports where it will run (not
  for the `http` backend, whose service has its own);
- `domains.<d>.data` — for a dataset domain, that its train and validation rows can be read: the files exist
  in a known format (or the hub id is cached or reachable), the mapped columns are there with a type a row can
  carry, no split is empty, and `data.episode` names an episode (`sources=False` skips it: `rollart sim`
  needs no rows);
- `run_dir` — not an existing file, and creatable: its nearest existing parent is a writable directory.
Run by every command that takes a run config (`rollart.commands.common.config_from_args`) and by the
Python API (`rollart.driver.train` / `evaluate`), so a typo fails in a second instead of after every worker
started.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollart.config import DomainConfig, RunConfig
from rollart.config_loader import ConfigError
from rollart.envs import EnvSpecError, check_env_spec
from rollart.envs.agents.demonstrations import resolve_demonstrations
from rollart.envs.agents.function import AgentSpecError, resolve_agent
from rollart.reward.registry import check_spec


def run_dir_problem(run_dir: str) -> str:
    path = Path(run_dir).expanduser()
    if path.exists() and not path.is_dir():
        return f"run_dir: {run_dir} exists and is not a directory; give a directory (it is created if missing)"
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"run_dir: {run_dir} cannot be created: {parent} is not a writable directory"
    return ""


def data_problems(name: str, dom: DomainConfig) -> list[str]:
    """What stops a dataset domain's rows from being read (see the module docstring)."""
    from rollart.envs.dataset import DataError, load_table
    from rollart.envs.dataset.env import episode_constructor

    data = dom.data
    assert data is not None
    problems: list[str] = []
    sources = [("train", data.train, data.train_split)] + (
        [("validation", data.validation, data.validation_split)] if data.validation else [])
    for key, location, split in sources:
        try:
            load_table(location, data.format, data.columns, split=split, subset=data.subset)
        except DataError as exc:
            problems.append(f"domains.{name}.data.{key}: {exc}")
    try:
        episode_constructor(data.episode)
    except DataError as exc:
        problems.append(f"domains.{name}.data.episode: {exc}")
    return problems


def check_config(cfg: RunConfig, *, sources: bool = True) -> None:
    problems: list[str] = []
    for name, dom in cfg.domains.items():
        if dom.data is not None and sources:
            problems += data_problems(name, dom)
        try:
            if dom.agent:
                resolve_agent(dom.agent)
            else:
                check_env_spec(dom.env)
        except (EnvSpecError, AgentSpecError) as exc:
            problems.append(f"domains.{name}.{'agent' if dom.agent else 'env'}: {exc}")
        if dom.demonstrations:
            try:
                resolve_demonstrations(dom.demonstrations)
            except AgentSpecError as exc:
                problems.append(f"domains.{name}.demonstrations: {exc}")
        try:
            check_spec(dom.reward.fn, f"domains.{name}.reward.fn", here=cfg.domain_reward_backend(name) != "http")
        except ValueError as exc:
            problems.append(str(exc))
    if problem := run_dir_problem(cfg.run_dir):
        problems.append(problem)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
