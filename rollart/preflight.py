"""Check what a config names outside itself, before anything starts: `check_config(cfg)`.

In: a validated `RunConfig` (the schema, types and cross-references are config_loader's job). Out: nothing,
or one `ConfigError` (CLI exit 2) listing every problem, each naming its key and what would be valid:
- `domains.<d>.env` — a built-in, a `module.path:Class` that imports, or an id GEM/gymnasium has registered
  (envs.check_env_spec; nothing is constructed); for an agent domain instead, `domains.<d>.agent` (and
  `demonstrations`) — a `module.path:function` that imports and takes the right arguments (nothing runs);
- `domains.<d>.reward.fn` — a built-in, or a `module.path:callable` that imports where it will run (not
  for the `http` backend, whose service has its own);
- `run_dir` — not an existing file, and creatable: its nearest existing parent is a writable directory.
Run by every command that takes a run config (`rollart.commands.common.config_from_args`) and by the
Python API (`rollart.driver.train` / `evaluate`), so a typo fails in a second instead of after every worker
started.

`check_run_dir(cfg)`, for a training job (`rollart.driver.train`): never train over a finished or
interrupted run — continue it (`resume=true`) or pick another `run_dir` — and never resume from
checkpoints that hold a pickle (loading one can run code).
"""

from __future__ import annotations

import os
from pathlib import Path

from rollart.config import RunConfig
from rollart.config_loader import ConfigError
from rollart.envs import EnvSpecError, check_env_spec
from rollart.envs.agents.demonstrations import resolve_demonstrations
from rollart.envs.agents.function import AgentSpecError, resolve_agent
from rollart.reward.registry import check_spec
from rollart.run_dir import RunPaths
from rollart.trainer.checkpoint import UnsafeCheckpointError, check_no_pickles


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


def check_config(cfg: RunConfig) -> None:
    problems: list[str] = []
    for name, dom in cfg.domains.items():
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


def check_run_dir(cfg: RunConfig) -> None:
    """A training job's run directory: a run there is continued only with resume=true, and a resume never
    loads a checkpoint that holds a pickle (ConfigError naming the run directory)."""
    paths = RunPaths.of(cfg.run_dir)
    used = [p.name for p in (paths.metrics, paths.checkpoints) if p.exists()]
    if used and not cfg.resume:
        raise ConfigError(
            f"run_dir={cfg.run_dir} already holds a run ({', '.join(used)}); add resume=true to continue "
            "it, or give another run_dir"
        )
    if cfg.resume:
        try:
            check_no_pickles(paths.checkpoints)
        except UnsafeCheckpointError as exc:
            raise ConfigError(f"run_dir={cfg.run_dir}: {exc}") from None
