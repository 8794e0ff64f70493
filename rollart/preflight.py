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

`check_run_dir(cfg)` checks the run directory a training job writes (and, with `resume=true`, reads)
before anything starts — it is data that may come from anyone: no training over an existing run unless it
is resumed; no symbolic link (or hard link) where rollart writes (`RunPaths.unsafe_paths`); checkpoints
walked without following links, refusing a link or a pickle (`check_checkpoint_files`); the newest
checkpoint's state files read as the trainer and the scheduler will read them, so a corrupt or truncated
one is named (file and field) here, not after Ray started; and its step no further than `train.steps`.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollart.config import RunConfig
from rollart.config_loader import ConfigError
from rollart.envs import EnvSpecError, check_env_spec
from rollart.envs.agents.demonstrations import resolve_demonstrations
from rollart.envs.agents.function import AgentSpecError, resolve_agent
from rollart.control.scheduler import decode_state
from rollart.reward.registry import check_spec
from rollart.run_dir import RunPaths
from rollart.trainer.checkpoint import UnsafeCheckpointError, check_checkpoint_files, check_state_files, latest_checkpoint
from rollart.trainer.state_files import StateFileError
from rollart.types import RunState


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
    """Never train over a finished or interrupted run: continue it (resume=true) or pick another run_dir;
    never write through a link in it, nor resume from checkpoints that hold a pickle or a link (loading one
    can run code or read files from elsewhere) or whose state does not read back. ConfigError (CLI exit 2)
    naming the file, before anything starts."""
    paths = RunPaths.of(cfg.run_dir)
    problems = paths.unsafe_paths()
    if problems:
        raise ConfigError(f"run_dir={cfg.run_dir} cannot be used: rollart writes there and never through a link "
                          "(remove these, or give another run_dir):\n  - " + "\n  - ".join(problems))
    used = [p.name for p in (paths.metrics, paths.checkpoints) if os.path.lexists(p)]
    if used and not cfg.resume:
        raise ConfigError(
            f"run_dir={cfg.run_dir} already holds a run ({', '.join(used)}); add resume=true to continue "
            "it, or give another run_dir"
        )
    if not cfg.resume:
        return
    try:
        check_checkpoint_files(paths.checkpoints)
    except UnsafeCheckpointError as exc:
        raise ConfigError(f"run_dir={cfg.run_dir}: {exc}") from None
    latest = latest_checkpoint(cfg.run_dir)
    if latest is None:
        return
    extra = latest / "extra_state.json"
    try:
        state = RunState.from_checkpoint(check_state_files(latest))
        if state.scheduler is not None:
            decode_state(state.scheduler)
    except StateFileError as exc:
        raise ConfigError(f"resume=true: {exc}. The checkpoint cannot be resumed: remove {latest} to resume "
                          "from the one before it, or start a fresh run_dir") from None
    except ValueError as exc:
        raise ConfigError(f"resume=true: {extra}: {exc}. The checkpoint cannot be resumed: remove {latest} to "
                          "resume from the one before it, or start a fresh run_dir") from None
    if state.step > cfg.train.steps:
        raise ConfigError(f"resume=true: {latest} is RL step {state.step} ({extra}), past train.steps="
                          f"{cfg.train.steps}; give train.steps ≥ {state.step} to continue this run")
