"""`rollart model init DIR`: build the tiny Qwen3-architecture model and tokenizer locally (no download)."""

from __future__ import annotations

import argparse

from rollart.commands.common import add_run_args, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("model", help="build or inspect models")
    inner = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = inner.add_parser("init", help="write the built-in tiny model + tokenizer as a HF checkpoint")
    init.add_argument("out_dir", help="directory to write the checkpoint to")
    add_run_args(init)
    init.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from rollart.models import init_tiny_checkpoint

    cfg = config_from_args(args)
    path = init_tiny_checkpoint(args.out_dir, cfg.model.tiny, cfg.seed)
    params = _count_params(path)
    print(f"wrote {path} ({params / 1e6:.2f} M parameters; load with AutoModelForCausalLM.from_pretrained)")
    return 0


def _count_params(path) -> int:
    import math

    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
