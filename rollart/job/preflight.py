"""Check what a config names outside itself, before anything starts: `check_config(cfg)`.

In: a validated `RunConfig` (the schema, types and cross-references are the config loader's job). Out: nothing,
or one `ConfigError` (CLI exit 2) listing every problem, each naming its key and what would be valid:
- `domains.<d>.env` — a built-in, a `module.path:Class` that imports, or an id GEM/gymnasium has registered
  (envs.check_env_spec; nothing is constructed); for an agent domain instead, `domains.<d>.agent` (and
  `demonstrations`) — a `module.path:function` that imports and takes the right arguments (nothing runs);
- `domains.<d>.reward.fn` — a built-in, or a `module.path:callable` that imports where it will run (not
  for the `http` backend, whose service has its own);
- `domains.<d>.data` — for a dataset domain, that its train and validation rows can be read: the files exist
  in a known format (or the hub id is cached or reachable), the mapped columns are there with a type a row can
  carry, no split is empty, and `data.episode` names an episode; then (everything else being right), under
  the model's chat template, that the domain's `thinking` switch exists and rows are left after the filters;
- the env class of every domain the warm start demonstrates — complete: `reset` and `step`, and under a
  warm start (`train.warm_start.steps` > 0 on a run that has no checkpoint yet) `expert_action`, plus
  `random_action` when `expert_prob` < 1; a missing method is named with both ways out (add it, or
  `train.warm_start.steps=0`);
- `model.path`, `model.adapter`, `reward.judge_model` — checkpoints that load (config, safetensors weights,
  tokenizer, no code of their own unless `model.trust_remote_code`; `models.loading.model_problem`), read
  without loading weights; a hub id must be cached or downloadable (offline, an uncached id is named with the
  cache directory and HF_HUB_OFFLINE);
- the optional integrations the config turns on are installed: wandb (`observability.wandb_project`),
  mlflow (`observability.mlflow_uri`), vllm (`inference.engine=vllm`);
- `run_dir` — not an existing file, and creatable: its nearest existing parent is a writable directory.
`local=False` skips what only the machines that run it need — dataset rows, checkpoints, optional packages:
`rollart sim` judges a run meant for another cluster.
Run by every command that takes a run config (`rollart.cli.commands.common.config_from_args`) and by the
Python API (`rollart.job.driver.train` / `evaluate`), so a typo fails in a second instead of after every worker
started.

`check_run_dir(cfg)` checks the run directory a training job writes (and, with `resume=true`, reads)
before anything starts — it is data that may come from anyone: no training over an existing run unless it
is resumed; no symbolic link (or hard link) where rollart writes (`RunPaths.unsafe_paths`); checkpoints
walked without following links, refusing a link or a pickle (`check_checkpoint_files`); the newest
checkpoint's state files read as the trainer and the scheduler will read them, so a corrupt or truncated
one is named (file and field) here, not after Ray started; and its step no further than `train.steps`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from rollart.config import DomainConfig, RunConfig
from rollart.config.loader import ConfigError
from rollart.control.scheduler import decode_state
from rollart.envs.agents.demonstrations import resolve_demonstrations
from rollart.envs.agents.function import AgentSpecError, resolve_agent
from rollart.envs.spec import ENV_METHODS, EnvSpecError, check_env_spec, missing_env_methods
from rollart.models.loading import adapter_problem, model_problem
from rollart.reward.registry import check_spec
from rollart.base.run_dir import RunPaths
from rollart.trainer.checkpoint import (
    UnsafeCheckpointError,
    check_checkpoint_files,
    check_state_files,
    latest_checkpoint,
)
from rollart.trainer.state_files import StateFileError
from rollart.types import RunState

# what a config turns on → (the package it needs, the extra that installs it)
INTEGRATIONS = {
    "observability.wandb_project": ("wandb", "pip install 'rollart[wandb]'"),
    "observability.mlflow_uri": ("mlflow", "pip install 'rollart[mlflow]'"),
    "inference.engine=vllm": ("vllm", "make install-vllm (CPU) or pip install 'rollart[vllm]' (CUDA)"),
}


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


def filter_problems(cfg: RunConfig) -> list[str]:
    """What the model's chat template says of each dataset domain (read without problems so far): its thinking
    switch exists, and rows are left after the filters (a prompt over the budget, an empty column)."""
    from rollart.envs.chat import ChatTokens
    from rollart.envs.dataset import DataError, open_dataset_domain
    from rollart.models import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(cfg.model, cfg.seed), cfg.model.trust_remote_code)
    problems: list[str] = []
    for name, dom in cfg.domains.items():
        if dom.data is None:
            continue
        try:
            open_dataset_domain(name, dom, ChatTokens(tokenizer, dom.system_prompt, dom.thinking), cfg.seed)
        except DataError as exc:
            problems.append(f"domains.{name}.data: {exc}")
        except ValueError as exc:  # a thinking switch the template does not have
            problems.append(f"domains.{name}.thinking: {exc}")
    return problems


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken package
        return False


def integration_problems(cfg: RunConfig) -> list[str]:
    obs = cfg.observability
    wanted = {"observability.wandb_project": bool(obs.wandb_project), "observability.mlflow_uri": bool(obs.mlflow_uri),
              "inference.engine=vllm": cfg.inference.engine == "vllm"}
    return [f"{key}: needs the {module} package, which is not installed here: {how} (or turn it off)"
            for key, (module, how) in INTEGRATIONS.items() if wanted[key] and not installed(module)]


def warm_start_runs(cfg: RunConfig) -> bool:
    """Whether this run starts with the warm start: steps set, and no checkpoint to resume from."""
    checkpoints = RunPaths.of(cfg.run_dir).checkpoints
    resuming = cfg.resume and checkpoints.is_dir() and any(p.name.startswith("step_") for p in checkpoints.iterdir())
    return cfg.train.warm_start.steps > 0 and not resuming


def env_class_problem(name: str, dom: DomainConfig, cfg: RunConfig, demonstrated: bool) -> str:
    """What the class of an env domain lacks: reset/step always, the warm start's methods under one."""
    ws = cfg.train.warm_start
    needs: tuple[str, ...] = ()
    if demonstrated and dom.weight > 0:  # weight 0: evaluated only, never demonstrated
        needs = ("expert_action", "random_action") if ws.expert_prob < 1 else ("expert_action",)
    missing = missing_env_methods(dom.env, needs)
    if {"reset", "step"} & set(missing):
        return (f"domains.{name}.env: {dom.env} has no {' or '.join(m + '()' for m in missing if m in ('reset', 'step'))} "
                f"method; an env needs {ENV_METHODS}")
    if missing:
        methods = " and ".join(f"{m}()" for m in missing)
        wrap = ", in a class of your own that wraps it," if dom.env.startswith(("gem:", "gym:")) else ""
        what = {"expert_action": "the best action for the current state",
                "random_action": f"any valid action (train.warm_start.expert_prob={ws.expert_prob} mixes them in)"}
        return (f"domains.{name}.env: {dom.env} has no {methods} method, which the warm start "
                f"(train.warm_start.steps={ws.steps}) needs to demonstrate this domain's action format. Either add{wrap} "
                f"{' and '.join(f'{m}() -> str, returning {what[m]}' for m in missing)}, written as the model "
                "should write it (e.g. \\boxed{Right}); or set train.warm_start.steps=0 to start RL from the model "
                "as it is")
    return ""


def check_config(cfg: RunConfig, *, local: bool = True) -> None:
    problems: list[str] = []
    demonstrated = warm_start_runs(cfg)
    for name, dom in cfg.domains.items():
        if dom.data is not None and local:
            problems += data_problems(name, dom)
        try:
            if dom.agent:
                resolve_agent(dom.agent)
            else:
                check_env_spec(dom.env)
                if not dom.runs_agent and (problem := env_class_problem(name, dom, cfg, demonstrated)):
                    problems.append(problem)
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
    if local and cfg.model.path and (problem := model_problem(cfg.model)):
        problems.append(problem)
    if cfg.model.adapter and (problem := adapter_problem(cfg.model.adapter)):
        problems.append(problem)
    judge = cfg.model.model_copy(update={"path": cfg.reward.judge_model, "revision": "", "adapter": ""})
    if local and cfg.reward.judge_model and (problem := model_problem(judge, "reward.judge_model")):
        problems.append(problem)
    if local:
        problems += integration_problems(cfg)
    if local and not problems and any(d.data is not None for d in cfg.domains.values()):
        problems += filter_problems(cfg)  # needs the model's tokenizer, so only once everything else holds
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
