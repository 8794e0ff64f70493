"""`rollart env play SPEC`, `rollart env list` and `rollart env serve DOMAIN`.

`serve` runs an env server for one domain of a run config (`envs.server`: 127.0.0.1:8710 unless told
otherwise; the protocol is in rollart/envs/serving/server.py) until Ctrl-C or SIGTERM, so `remote:<url>` envs on
other machines can use it. A domain pooled by `envs.warm_pool` is served from prepared envs. The server
token comes from `$envs.server.token_env` (default ROLLART_ENV_TOKEN); unset, a fresh one is printed.

`play` runs one episode of any env spec (built-in, an adapter — `gem:<id>`, `gym:<id>`, `reasoning_gym:<dataset>`,
`openenv` with `--option url=...|app=...` —, `module.path:Class`, with the current directory importable) and
prints each observation, action, reward and the end status; for `verifiers:<taskset>` you answer each model
call (env_play_agent.py). Actions
come from `--actions 'a;b;c'`, from `--policy expert|random`, or from the prompt. A bare action such as
`Right` is sent as `\\boxed{Right}` (the format the built-ins and GEM expect); `--raw` sends it verbatim.
For math and code the env's reference (answer, hidden tests) is shown: scoring is the reward plane's.

`--policy model --model RUN_DIR|CHECKPOINT` lets a trained checkpoint play (the run's newest, as `rollart
eval` finds it): the episode runs through the rollout's own code — an `EnvWorker` with the run's config,
its chat template token-in/token-out, the engine the run generates with, in this process, no Ray — so the
model sees exactly the prompts it was trained on. SPEC may name one of the run's domains (its env, options
and limits) or any env spec (the run's defaults for a domain). `--split val` (the default for a model)
samples at `eval.temperature`, `train` at the rollout's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Callable

EXIT_BAD_SPEC = 2


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("env", help="try environments by hand")
    inner = parser.add_subparsers(dest="env_command", metavar="ACTION", required=True)
    play = inner.add_parser("play", help="play one episode of an env spec")
    play.add_argument("spec", help="built-in name, gem:<id>, gym:<id> or module.path:Class")
    play.add_argument("--seed", type=int, default=0, help="task seed (default 0)")
    play.add_argument("--split", choices=["train", "val"], default=None,
                      help="seed range (default train; val for --policy model)")
    play.add_argument("--actions", help="actions separated by ';' (else --policy, else the prompt)")
    play.add_argument("--policy", choices=["expert", "random", "model"],
                      help="let the expert, a random policy or a trained model (--model) play")
    play.add_argument("--model", metavar="RUN_DIR|CHECKPOINT", help="--policy model: the run or checkpoint that plays")
    play.add_argument("--trust-run-config", action="store_true",
                      help="--model RUN_DIR: use what its config.yaml names beyond the run (code to import, a URL, "
                      "a weakened safeguard) without giving it again: only for a run directory you trust")
    play.add_argument("--raw", action="store_true", help="send actions verbatim (no \\boxed{} wrapping)")
    play.add_argument("--max-turns", type=int, default=50, help="stop after this many turns (default 50)")
    play.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="env keyword argument (YAML value)"
    )
    play.set_defaults(func=_play)
    listing = inner.add_parser("list", help="list built-in envs and the accepted spec forms")
    listing.set_defaults(func=_list)
    serve = inner.add_parser("serve", help="serve one domain's envs over HTTP for remote: envs elsewhere")
    serve.add_argument("domain", help="a domain of the run config (domains.<name>)")
    from rollart.cli.commands.common import add_run_args

    add_run_args(serve)
    serve.add_argument("--host", help="address to listen on (default envs.server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default envs.server.port; 0 = an ephemeral one)")
    serve.set_defaults(func=_serve)


def _list(args: argparse.Namespace) -> int:
    import inspect
    import sys as _sys
    import textwrap

    from rollart.envs.spec import ACCEPTED_FORMS, ADAPTERS, BUILTIN_ENVS

    indent = " " * 15

    def options_of(ctor: Any, skip: int = 0) -> None:
        params = list(inspect.signature(ctor).parameters.values())[skip:]
        options = [f"{p.name}={p.default!r}" for p in params if p.default is not inspect.Parameter.empty]
        if options:
            print(textwrap.fill("options: " + ", ".join(options), 110, initial_indent=indent,
                                subsequent_indent=indent + "  "))

    for name, ctor in BUILTIN_ENVS.items():
        summary = " ".join(inspect.getdoc(ctor).split("\n\n")[0].split()) if ctor.__doc__ else ""
        print(textwrap.fill(summary, 110, initial_indent=f"{name:14s} ", subsequent_indent=indent))
        options_of(ctor)
    print("\nAdapters (environments you bring; one file each in rollart/envs/adapters/):")
    for kind, cls in ADAPTERS.items():
        doc = inspect.getdoc(_sys.modules[cls.__module__]) or ""
        summary = " ".join(doc.split("\n\n")[0].split())
        print(textwrap.fill(summary, 110, initial_indent=f"{kind:14s} ", subsequent_indent=indent))
        print(f"{indent}example: env: {getattr(cls, 'EXAMPLE', getattr(cls, 'FORM', kind))}")
        options_of(cls, skip=1 if getattr(cls, "TAKES_ID", True) else 0)
    print("\n" + textwrap.fill(f"An env spec is {ACCEPTED_FORMS}.", 110))
    return 0


def _options(items: list[str]) -> dict[str, Any]:
    import yaml

    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"rollart env play: --option needs KEY=VALUE, got {item!r}")
        options[key] = yaml.safe_load(value)
    return options


def _as_action(text: str, raw: bool) -> str:
    if raw or "\\boxed" in text or "```" in text:
        return text
    return "\\boxed{" + text + "}"


def _action_source(args: argparse.Namespace, env: Any) -> Callable[[], str | None]:
    from rollart.envs.expert import expert_action, random_action

    if args.actions is not None:
        queue = [a.strip() for a in args.actions.split(";") if a.strip()]
        return lambda: _as_action(queue.pop(0), args.raw) if queue else None
    if args.policy:
        policy = expert_action if args.policy == "expert" else random_action
        return lambda: policy(env)

    def ask() -> str | None:
        try:
            text = input("action> ")
        except EOFError:
            return None
        return _as_action(text.strip(), args.raw)

    return ask


async def _episode(args: argparse.Namespace) -> int:
    from rollart.config import EnvsConfig
    from rollart.envs.protocol import FORMAT_ERROR_KEY, REFERENCE_KEY, AsyncEnv
    from rollart.envs.seeds import episode_seed
    from rollart.envs.spec import EnvSpecError, adapter_of, make_env
    from rollart.types import Task

    if getattr(adapter_of(args.spec), "RUNS_AGENT", False):  # you are the model of a verifiers:<taskset> episode
        from rollart.cli.commands.env_play_agent import play_agent

        return await play_agent(args, _options(args.option))
    try:
        raw_env = make_env(args.spec, _options(args.option))
    except EnvSpecError as exc:
        print(f"rollart: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    timeouts = EnvsConfig()
    env = AsyncEnv(raw_env)
    task = Task(trajectory_id="play", domain="play", env=args.spec, seed=args.seed, group_id="play", split=args.split)
    seed = episode_seed(task)
    next_action = _action_source(args, raw_env)
    try:
        obs, info = await asyncio.wait_for(env.reset(seed), timeouts.reset_timeout_s)
        print(f"== {args.spec}  seed {args.seed} ({args.split}, reset seed {seed})")
        if info.get(REFERENCE_KEY):
            print(f"reference: {info[REFERENCE_KEY]}")
        total, status = 0.0, f"stopped after {args.max_turns} turn{'s' * (args.max_turns != 1)} (--max-turns)"
        for turn in range(1, args.max_turns + 1):
            print(f"\n-- observation {turn}\n{obs}")
            action = next_action()
            if action is None:
                status = "stopped: no more actions"
                break
            print(f"-- action {turn}: {action}")
            obs, reward, terminated, truncated, step_info = await asyncio.wait_for(
                env.step(action), timeouts.step_timeout_s
            )
            total += reward
            note = f"  (format error: {step_info[FORMAT_ERROR_KEY]})" if step_info.get(FORMAT_ERROR_KEY) else ""
            print(f"-- reward {reward:g}  terminated={terminated}  truncated={truncated}{note}")
            if terminated or truncated:
                print(f"\n-- final observation\n{obs}")
                status = "completed (env terminated)" if terminated else "truncated by the env"
                break
        print(f"\n== end: {status}; return {total:g}")
        return 0
    finally:
        await env.close()


def _play(args: argparse.Namespace) -> int:
    if args.model and args.policy in (None, "model"):
        args.policy = "model"
    elif args.policy == "model" or args.model:
        print("rollart: --policy model needs --model RUN_DIR|CHECKPOINT (and --model goes with --policy model)",
              file=sys.stderr)
        return EXIT_BAD_SPEC
    args.split = args.split or ("val" if args.policy == "model" else "train")
    return asyncio.run(_model_episode(args) if args.policy == "model" else _episode(args))


class _EngineClient:
    """The `LLMClient` an env worker generates through, over an engine in this process (`EngineLoop`)."""

    def __init__(self, loop: Any, timeout_s: float) -> None:
        self.loop, self.timeout_s = loop, timeout_s

    async def generate(self, request: Any) -> Any:
        return await self.loop.generate(request, self.timeout_s)

    async def abort(self, trajectory_id: str) -> None:
        self.loop.abort_trajectory(trajectory_id)


async def _model_episode(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rollart.cli.commands.eval import checkpoint_config
    from rollart.config import DomainConfig
    from rollart.envs.spec import EnvSpecError, check_env_spec
    from rollart.envs.worker import EnvWorker
    from rollart.inference.engine_loop import EngineLoop
    from rollart.inference.worker import build_engine
    from rollart.models.loading import resolve_model_path
    from rollart.types import Task

    checkpoint, cfg = checkpoint_config(Path(args.model), [], args.trust_run_config)
    domain = args.spec if args.spec in cfg.domains else next(
        (d for d, c in cfg.domains.items() if c.env == args.spec and not c.agent), None)
    if domain is None or args.option:  # an env the run did not train on: the run's defaults for a domain
        try:
            check_env_spec(args.spec)
        except EnvSpecError as exc:
            print(f"rollart: {exc}", file=sys.stderr)
            return EXIT_BAD_SPEC
        first_pool = next(iter(cfg.domains.values())).pool
        base = cfg.domains[domain] if domain else DomainConfig(env=args.spec, pool=first_pool)
        domain = domain or "play"
        cfg = cfg.model_copy(update={"domains": {**cfg.domains, domain: base.model_copy(
            update={"env": args.spec, "options": {**base.options, **_options(args.option)}})}})
    domain_cfg = cfg.domains[domain]
    engine = build_engine(cfg, domain_cfg.pool, "inference/play/0")
    loop = EngineLoop(engine, "inference/play/0")
    try:
        worker = EnvWorker(cfg, _EngineClient(loop, cfg.inference.request_timeout_s), name="env/play/0",
                           model_path=resolve_model_path(cfg.model, cfg.seed))
        task = Task(trajectory_id="play", domain=domain, env=domain_cfg.env or domain_cfg.agent, seed=args.seed,
                    group_id="play", split=args.split)
        temperature = cfg.eval.temperature if args.split == "val" else cfg.rollout.temperature
        what = f"its domain {domain} ({domain_cfg.env})" if domain != "play" else \
            f"{domain_cfg.env} (not one of its domains: a domain's default limits)"
        turns = domain_cfg.max_turns
        print(f"== {checkpoint} plays {what}, seed {args.seed} ({args.split}, temperature {temperature:g}, at most "
              f"{turns} turn{'s' * (turns != 1)})")
        traj = await worker.run(task, start_version=0)
    finally:
        loop.close()
    from rollart.base.untrusted import printable

    if traj.reference:
        print(f"reference: {traj.reference}")
    for i, turn in enumerate(traj.turns, start=1):
        note = "" if turn.format_ok else "  (malformed action)"
        print(printable(f"\n-- observation {i}\n{turn.observation}\n-- action {i} ({len(turn.response_token_ids)} "
                        f"tokens, {turn.finish_reason}): {turn.action}\n-- reward {turn.reward:g}{note}"))
    reason = f" ({traj.status_reason})" if traj.status_reason else ""
    print(f"\n== end: {traj.status.value if traj.status else 'running'}{reason}; return {traj.env_return:g} after "
          f"{len(traj.turns)} turn{'s' * (len(traj.turns) != 1)}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import os
    import secrets
    import signal
    import threading

    from rollart.cli.commands.common import config_from_args
    from rollart.config import is_loopback_host
    from rollart.config.loader import ConfigError
    from rollart.envs.spec import DATASET_ENV, domain_env_factory

    cfg = config_from_args(args)
    server_cfg = cfg.envs.server.model_copy(update={k: v for k, v in (("host", args.host), ("port", args.port))
                                                    if v is not None})
    domain_cfg = cfg.domains.get(args.domain)
    if domain_cfg is None or domain_cfg.runs_agent or domain_cfg.env.strip() == DATASET_ENV:
        env_domains = sorted(d for d, dc in cfg.domains.items() if not dc.runs_agent)
        raise ConfigError(f"rollart env serve: {args.domain!r} is not an env domain of this config (dataset "
                          f"domains are served in process; env domains: {env_domains})")
    if not is_loopback_host(server_cfg.host) and not server_cfg.allow_non_loopback:
        raise ConfigError(f"envs.server.host: {server_cfg.host!r} is not loopback; the protocol is plain HTTP, so "
                          "set envs.server.allow_non_loopback=true (with TLS or a private network in front of it)")
    from rollart.envs.serving.server import EnvServer
    from rollart.envs.spec import domain_env_factory

    chat = None
    if domain_cfg.data is not None:  # a dataset domain's rows are filtered by the model's chat template
        from rollart.envs.chat import ChatTokens
        from rollart.models import load_tokenizer, resolve_model_path

        tokenizer = load_tokenizer(resolve_model_path(cfg.model, cfg.seed), cfg.model.trust_remote_code)
        chat = ChatTokens(tokenizer, domain_cfg.system_prompt, domain_cfg.thinking)
    token = os.environ.get(server_cfg.token_env) or secrets.token_urlsafe(24)
    pool = cfg.envs.warm_pool.size if cfg.envs.pooled(args.domain, domain_cfg) else 0
    factory = domain_env_factory(args.domain, domain_cfg, chat, cfg.seed, cfg.envs.workspace)
    server = EnvServer(args.domain, domain_cfg.env, factory, server_cfg, cfg.envs, token=token, pool_size=pool).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"env server: domain {args.domain} ({domain_cfg.env}) at {server.url}"
          f"{f', {pool} prepared envs kept' if pool else ''}", flush=True)
    if os.environ.get(server_cfg.token_env):
        print(f"auth: Bearer token from ${server_cfg.token_env}", flush=True)
    else:
        print(f"auth: ${server_cfg.token_env} is unset; generated token: {token}", flush=True)
    print(f"use: domains.<name>.env=remote:{server.url} with ${server_cfg.token_env} set; Ctrl-C to stop", flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    print("stopping the env server (closing its sessions)", flush=True)
    server.stop()
    return 0
