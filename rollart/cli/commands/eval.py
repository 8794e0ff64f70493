"""`rollart eval RUN_DIR|CHECKPOINT [overrides]`: score a checkpoint on every domain's validation split.

RUN_DIR: the run's resolved config.yaml and its newest checkpoint. CHECKPOINT: a checkpoint directory
(RUN_DIR/checkpoints/step_N, or any Hugging Face checkpoint — then the default config, or overrides,
say which domains to score). A LoRA run's checkpoint is a PEFT adapter directory: it is scored as the
run's base model (`model.path`; outside a run, the adapter's `base_model_name_or_path`) with the adapter
merged in (`model.adapter`).

A run directory is data that may come from anyone: what its config.yaml names beyond the run — code to
import (an env, agent, demonstrations or reward `module.path:attr`), a program to run, a place to send data
or a secret, a weakened safeguard (`config.explain.trusted_values`) — is refused unless the user gives that
key again on the command line or passes `--trust-run-config`; nothing of it is imported before.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from rollart.config import RunConfig
from rollart.config.loader import ConfigError, load_config
from rollart.config.explain import trusted_values
from rollart.resources.logs import configure_logging
from rollart.base.run_dir import RunPaths


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="score a run's latest checkpoint (or a checkpoint) on validation")
    parser.add_argument("target", help="a run directory or a checkpoint directory")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="e.g. eval.episodes_per_domain=64")
    parser.add_argument("--trust-run-config", action="store_true",
                        help="use what the run directory's config.yaml names beyond the run (env/agent/reward "
                        "code to import, a program, a URL, a weakened safeguard) without giving it again: only "
                        "for a run directory you trust")
    parser.set_defaults(func=_eval)


def checkpoint_config(target: Path, overrides: list[str], trust_run_config: bool = False) -> tuple[Path, RunConfig]:
    """The checkpoint a run directory or checkpoint directory names, and the run config that serves it
    (`model.path`, or the run's base and `model.adapter` for a LoRA checkpoint), refusing what a run
    directory's config names beyond the run unless `trust_run_config` (see the module docstring)."""
    from rollart.models.lora import ADAPTER_CONFIG

    run_config = RunPaths.of(target).config
    if run_config.is_file():  # a run directory
        from rollart.trainer.checkpoint import latest_checkpoint

        checkpoint = latest_checkpoint(target)
        if checkpoint is None:
            raise ConfigError(f"{target} is a run directory without checkpoints ({RunPaths.of(target).checkpoints}/step_*)")
        config_file: Path | None = run_config
    elif (target / "config.json").is_file() or (target / ADAPTER_CONFIG).is_file():  # a checkpoint
        checkpoint = target
        parent_run = RunPaths.of(target.parent.parent).config  # RUN_DIR/checkpoints/step_N
        config_file = parent_run if parent_run.is_file() else None
    else:
        raise ConfigError(f"{target} is neither a run directory ({run_config.name}) nor a checkpoint (config.json, "
                          f"or {ADAPTER_CONFIG} for a LoRA run's)")
    if config_file is not None and (problems := RunPaths.of(config_file.parent).unsafe_paths()):
        # its config.yaml and checkpoints are read only from a run directory that holds nothing to follow
        raise ConfigError(f"{config_file.parent} cannot be read safely (rollart reads no run directory through a "
                          "link or a FIFO):\n  - " + "\n  - ".join(problems))
    if (checkpoint / ADAPTER_CONFIG).is_file():  # a LoRA checkpoint: the run's base model + this adapter
        model = [f"model.adapter={checkpoint}"]
        if config_file is None:  # no run config: the base PEFT recorded when the adapter was written
            base = json.loads((checkpoint / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or ""
            model.append(f"model.path={base}")
    else:
        model = [f"model.path={checkpoint}"]
    cfg = load_config(config_file, [*model, "resume=false", *overrides], resolved=True)
    if config_file is not None:  # a run directory's checkpoint: no link, no pickle (a HF cache may hold links)
        if not trust_run_config:
            refuse_untrusted(cfg, config_file, overrides)
        from rollart.trainer.checkpoint import UnsafeCheckpointError, check_checkpoint_files

        try:
            check_checkpoint_files(checkpoint)
        except UnsafeCheckpointError as exc:
            raise ConfigError(str(exc)) from None
    return checkpoint, cfg


def _eval(args: argparse.Namespace) -> int:
    checkpoint, cfg = checkpoint_config(Path(args.target), args.overrides, args.trust_run_config)
    configure_logging(cfg.observability.log_level)
    from rollart.job.driver import evaluate

    result = evaluate(cfg)
    print(f"{'domain':<14}{'score':>8}{'scored':>8}{'failed':>8}")
    for domain in sorted(result.scored):
        score = result.scores.get(domain)
        print(f"{domain:<14}{'—' if score is None else f'{score:.3f}':>8}{result.scored[domain]:>8}"
              f"{result.failed[domain]:>8}")
    mean = result.mean
    print(f"{'mean':<14}{'—' if mean is None else f'{mean:.3f}':>8}")
    print(json.dumps({"checkpoint": str(checkpoint), "scores": dict(result.scores), "mean": mean,
                      "scored": dict(result.scored), "failed": dict(result.failed)}))
    return 0


def refuse_untrusted(cfg: RunConfig, config_file: Path, overrides: list[str]) -> None:
    """ConfigError listing what `config_file` (a run directory's) names beyond the run that the command line
    does not give again; nothing is imported."""
    given = {item.partition("=")[0].strip() for item in overrides}
    taken = [v for v in trusted_values(cfg) if not any(v.key == k or v.key.startswith(f"{k}.") for k in given)]
    if taken:
        lines = "\n  - ".join(f"{v.key}={v.value} ({v.does})" for v in taken)
        again = " ".join(shlex.quote(f"{v.key}={v.value}") for v in taken)
        raise ConfigError(
            f"{config_file} names what reaches beyond the run; a run directory is data, so rollart does not "
            f"take these from it:\n  - {lines}\nGive them again if you mean them ({again}), or pass "
            "--trust-run-config if you trust whoever wrote this run directory"
        )
