"""Check what a config names outside itself, before anything starts: `check_config(cfg)`.

In: a validated `RunConfig` (the schema, types and cross-references are the config loader's job). Out: nothing,
or one `ConfigError` (CLI exit 2) listing every problem, each naming its key and what would be valid:
- `domains.<d>.env` — a built-in, a `module.path:Class` that imports, or an id GEM/gymnasium has registered
  (envs.check_env_spec; nothing is constructed); for an agent domain instead, `domains.<d>.agent` (and
  `demonstrations`) — a `module.path:function` that imports and takes the right arguments (nothing runs);
- `domains.<d>.reward.fn` — a built-in, or a `module.path:callable` that imports where it will run (not
  for the `http` backend, whose service has its own) and has a shape rollart calls (rollart's two, TRL's,
  verl's: `rollart.reward.shapes`), whose row needs the domain can meet;
- `domains.<d>.data` — for a dataset domain (preflight_data.py), that every split's rows can be read (the
  files, the mapped columns and paths, the episode), carry the columns the reward function asks for, and have
  an expert under a warm start (a single_turn row needs `data.columns.answer`); then (everything else being
  right), under the model's chat template, that the domain's `thinking` switch exists and rows are left after
  the filters;
- the env class of every domain the warm start demonstrates — complete: `reset` and `step`, and under a
  warm start (`train.warm_start.steps` > 0 on a run that has no checkpoint yet) `expert_action`, plus
  `random_action` when `expert_prob` < 1; a missing method is named with both ways out (add it, or
  `train.warm_start.steps=0`);
- `model.path`, `model.adapter`, `reward.judge_model` — checkpoints that load (config, safetensors weights,
  tokenizer, no code of their own unless `model.trust_remote_code`; `models.loading.model_problem`), read
  without loading weights; under `train.packing`, an architecture that can train on packed rows
  (`trainer.attention.packing_problem`); a hub id must be cached or downloadable (offline, an uncached id is named with the
  cache directory and HF_HUB_OFFLINE);
- the algorithm's own needs (`train.algorithm`, `rollart.algo.registry`): a critic (ppo) with `train.lora` is
  refused (not supported yet), and `train.critic.path` must be a local checkpoint directory;
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

from rollart.algo import algorithm_of
from rollart.config import DomainConfig, RunConfig
from rollart.config.loader import ConfigError
from rollart.control.scheduler_state import decode_state
from rollart.envs.agents.demonstrations import resolve_demonstrations
from rollart.envs.agents.function import AgentSpecError, resolve_agent
from rollart.envs.spec import ENV_METHODS, EnvSpecError, check_env_spec, missing_env_methods
from rollart.models.loading import adapter_problem, model_problem
from rollart.job.preflight_data import data_problems, filter_problems
from rollart.reward.registry import check_spec
from rollart.reward.shapes import Shape
from rollart.trainer.attention import packing_problem
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
    return cfg.warm_start_steps() > 0 and not resuming


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
                f"(train.warm_start.steps={cfg.warm_start_steps()}) needs to demonstrate this domain's action format. Either add{wrap} "
                f"{' and '.join(f'{m}() -> str, returning {what[m]}' for m in missing)}, written as the model "
                "should write it (e.g. \\boxed{Right}); or set train.warm_start.steps=0 to start RL from the model "
                "as it is")
    return ""


def algorithm_problems(cfg: RunConfig) -> list[str]:
    """Settings the chosen algorithm cannot work with (`rollart.algo.registry`)."""
    train, problems = cfg.train, []
    algorithm = algorithm_of(train)
    if algorithm.critic and train.lora is not None:
        problems.append(f"train.lora with train.algorithm={train.algorithm}: its critic is a full copy of the decoder, "
                        "which LoRA does not cover yet; use train.lora=null or a critic-free algorithm")
    path = Path(train.critic.path)
    if algorithm.critic and train.critic.path and not ((path / "config.json").is_file() and (
            (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file())):
        problems.append(f"train.critic.path: {train.critic.path} is not a local Hugging Face checkpoint directory "
                        "(config.json and model.safetensors, the policy's vocabulary)")
    return problems


def check_config(cfg: RunConfig, *, local: bool = True) -> None:
    problems: list[str] = algorithm_problems(cfg) if local else []
    demonstrated = warm_start_runs(cfg)
    for name, dom in cfg.domains.items():
        shape = None
        try:
            shape = check_spec(dom.reward.fn, f"domains.{name}.reward.fn", here=cfg.domain_reward_backend(name) != "http")
        except ValueError as exc:
            problems.append(str(exc))
        if shape is not None and dom.data is None and (problem := rowless_reward_problem(name, dom, shape)):
            problems.append(problem)
        if dom.data is not None and local:
            problems += data_problems(name, dom, shape, demonstrated, cfg.train.warm_start.expert_prob,
                                      cfg.warm_start_steps())
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
    if local and cfg.model.path:
        problem = model_problem(cfg.model)
        if problem or (cfg.train.packing and (problem := model_packing_problem(cfg))):
            problems.append(problem)
    if cfg.model.adapter and (problem := adapter_problem(cfg.model.adapter)):
        problems.append(problem)
    judge = cfg.model.model_copy(update={"path": cfg.reward.judge_model, "revision": "", "adapter": ""})
    if local and cfg.reward.judge_model and (problem := model_problem(judge, "reward.judge_model")):
        problems.append(problem)
    if local:
        problems += integration_problems(cfg)
    if local and cfg.train.elastic_generation and cfg.inference.engine != "builtin":
        problems.append(f"train.elastic_generation: the trainer's devices generate with the built-in engine, and "
                        f"inference.engine={cfg.inference.engine!r} would make one run sample with two engines — use "
                        "inference.engine=builtin with it, or set it to false")
    if local and not problems and any(d.data is not None for d in cfg.domains.values()):
        problems += filter_problems(cfg)  # needs the model's tokenizer, so only once everything else holds
    if problem := run_dir_problem(cfg.run_dir):
        problems.append(problem)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def model_packing_problem(cfg: RunConfig) -> str:
    """Why `model.path`'s architecture cannot train on packed rows ('' when it can; trainer/attention.py)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from rollart.models import resolve_model_path

    path = resolve_model_path(cfg.model, cfg.seed)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=cfg.model.trust_remote_code)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)  # (None: the checkpoint's own code)
    problem = packing_problem(config, model_class)
    return f"train.packing: {problem}" if problem else ""


def rowless_reward_problem(name: str, dom: DomainConfig, shape: Shape) -> str:
    """A reward function that needs a dataset row, on a domain whose episodes have none ('' otherwise)."""
    if shape.kind == "row" or shape.required_columns:
        needs = "a dataset row (row=)" if shape.kind == "row" else f"the dataset columns {list(shape.required_columns)}"
        return (f"domains.{name}.reward.fn: {dom.reward.fn} takes {needs}, but domain {name} is not a dataset domain "
                f"(env: {dom.env or dom.agent}): its episodes carry no row")
    return ""


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
