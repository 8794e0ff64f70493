"""`rollart model init DIR`: build the tiny Qwen3-architecture model and tokenizer locally (no download).
`rollart model warm-start DIR [RUN.yaml] [k=v …]`: only the run's supervised warm start, written as a Hugging
Face checkpoint (a base for LoRA runs: `model.path=DIR train.warm_start.steps=0 train.lora.rank=8`)."""

from __future__ import annotations

import argparse

from rollart.cli.commands.common import add_run_args, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("model", help="build or inspect models")
    inner = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = inner.add_parser("init", help="write the built-in tiny model + tokenizer as a HF checkpoint")
    init.add_argument("out_dir", help="directory to write the checkpoint to")
    add_run_args(init)
    init.set_defaults(func=_init)
    warm = inner.add_parser("warm-start", help="run only the warm start of a config and write the result as a "
                            "HF checkpoint (a base for LoRA runs)")
    warm.add_argument("out_dir", help="directory to write the checkpoint to (must not hold one)")
    add_run_args(warm)
    warm.set_defaults(func=_warm_start)


def _init(args: argparse.Namespace) -> int:
    from rollart.models import init_tiny_checkpoint

    cfg = config_from_args(args)
    path = init_tiny_checkpoint(args.out_dir, cfg.model.tiny, cfg.seed)
    params = _count_params(path)
    print(f"wrote {path} ({params / 1e6:.2f} M parameters; load with AutoModelForCausalLM.from_pretrained)")
    return 0


def _warm_start(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rollart.config.loader import ConfigError
    from rollart.job.driver import warm_start_checkpoint

    cfg = config_from_args(args)
    out = Path(args.out_dir)
    if (out / "config.json").exists():
        raise ConfigError(f"{out} already holds a checkpoint; give another directory")
    if cfg.warm_start_steps() == 0:
        raise ConfigError("train.warm_start.steps=0: nothing to do; give the number of supervised steps")

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        if step % 10 == 0 or step == total - 1:
            print(f"warm start {step + 1}/{total}  loss {metrics['sft/loss']:.3f}", flush=True)

    path = warm_start_checkpoint(cfg, out, progress)
    print(f"wrote {path} (warm-started {cfg.warm_start_steps()} steps; use it as model.path)")
    return 0


def _count_params(path) -> int:
    import math

    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
