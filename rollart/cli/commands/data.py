"""`rollart data preview DOMAIN [RUN.yaml] [k=v …]`: a dataset domain as the model will see it, before training.

Prints the rows kept, held out and dropped (each reason with the file, row and column of its first rows), a
few first prompts exactly as the model sees them (the token ids a rollout sends, decoded: system prompt, chat
template, generation prompt) with their reference answers, and a histogram of first-prompt token lengths in
training order. `--json PATH` writes it all. A domain that is not a dataset domain, or data that cannot be
read, exits 2 with the file, row and column named.
"""

from __future__ import annotations

import argparse
import json

from rollart.cli.commands.common import add_run_args
from rollart.config.loader import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("data", help="look at a dataset domain's rows as the model will see them")
    inner = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    show = inner.add_parser("preview", help="rendered prompts, prompt-length histogram, rows dropped and why")
    show.add_argument("domain", help="a dataset domain of the run config (env: dataset)")
    add_run_args(show)
    show.add_argument("--show", type=int, default=3, help="prompts to print (default 3)")
    show.add_argument("--sample", type=int, default=2000, help="rows measured for the histogram (default 2000)")
    show.add_argument("--json", metavar="PATH", help="also write the preview as JSON to PATH")
    show.set_defaults(func=_preview)


def _preview(args: argparse.Namespace) -> int:
    from rollart.config.loader import load_config
    from rollart.envs.chat import ChatTokens
    from rollart.envs.dataset import DataError, open_dataset_domain
    from rollart.envs.dataset.preview import preview
    from rollart.models import load_tokenizer, resolve_model_path
    from rollart.models.loading import CheckpointError

    # not the whole preflight: only what the preview reads (the rows and the model's tokenizer), each error
    # named as preflight names it — so a preview costs its own work, not the run's checks
    items = list(args.items)
    cfg = load_config(items.pop(0) if items and "=" not in items[0] else None, items)
    domain_cfg = cfg.domains.get(args.domain)
    if domain_cfg is None or domain_cfg.data is None:
        datasets = sorted(d for d, c in cfg.domains.items() if c.data is not None)
        raise ConfigError(f"data preview: {args.domain!r} is not a dataset domain of this config (its dataset "
                          f"domains: {datasets or 'none'}; a dataset domain has env: dataset and data)")
    try:
        tokenizer = load_tokenizer(resolve_model_path(cfg.model, cfg.seed), cfg.model.trust_remote_code)
        chat = ChatTokens(tokenizer, domain_cfg.system_prompt, domain_cfg.thinking)
    except (CheckpointError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    try:
        shown = preview(open_dataset_domain(args.domain, domain_cfg, chat, cfg.seed), chat, args.show, args.sample)
    except DataError as exc:
        raise ConfigError(f"domains.{args.domain}.data: {exc}") from None
    print(shown.render())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(shown.to_json(), f, indent=2)
        print(f"wrote {args.json}")
    return 0
