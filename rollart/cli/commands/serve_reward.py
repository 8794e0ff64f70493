"""`rollart serve-reward [RUN.yaml] [overrides] [--port N]`: run one reward service for many jobs.

Starts (or joins, with `cluster.address`) Ray, deploys the shared reward service of
`rollart/reward/service.py` (Ray Serve, autoscaling from 0 to `reward.serverless.max_replicas` replicas),
prints its URL, and serves until Ctrl-C or SIGTERM, then stops cleanly (app, ledger, Serve, Ray), exit 0.

Jobs: every `rollart train` whose domains use backend `serverless` in the same Ray cluster attaches to it
with a token and run id of its own; a job elsewhere uses backend `http` with `reward.http.url=<URL>` and a
job token in the env var `reward.http.token_env` (default ROLLART_REWARD_TOKEN), made by `rollart
serve-reward --issue-token NAME` from the service secret in that same variable. The service keeps every
job's idempotency keys apart, so no job ever receives another's result.

Auth: every request needs `Authorization: Bearer <token>` — the service secret (the env var, or when unset a
fresh random one printed once) or a job token derived from it. On a non-loopback
`reward.serverless.host` the service refuses to start unless `reward.allow_plain_http=true`. Requests over
`reward.max_payload_mb` are refused (413); every error is answered as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from rollart.cli.commands.common import add_run_args, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve-reward", help="run the reward service standalone and print its URL")
    add_run_args(parser)
    parser.add_argument("--port", type=int, help="HTTP port (default reward.serverless.port)")
    parser.add_argument("--issue-token", metavar="NAME",
                        help="print the job token of job NAME (from the secret in $reward.http.token_env) and exit")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # a bad config exits 2 here, before Ray starts
    from rollart.config.loader import ConfigError

    token_env = cfg.reward.http.token_env
    if args.issue_token is not None:
        from rollart.reward import tokens

        secret = os.environ.get(token_env)
        if not secret:
            raise ConfigError(f"--issue-token: ${token_env} must hold the service secret (the token the service runs with)")
        try:
            print(tokens.issue(secret, args.issue_token))
        except ValueError as exc:
            raise ConfigError(f"--issue-token: {exc}") from None
        return 0

    if problem := cfg.reward.plain_http_problem(serving=True, sending=False):
        raise ConfigError(f"invalid config:\n  - {problem}")

    from rollart.resources.errors import ResourceError
    from rollart.resources.runtime import Runtime
    from rollart.reward.service import RewardService

    try:
        with Runtime(cfg) as rt:
            service = RewardService(cfg, port=args.port, shared=True)
            try:
                url = service.start()
                print(f"reward service: {url}  ({rt.describe()})", flush=True)
                if os.environ.get(token_env):
                    print(f"auth: Bearer token from ${token_env}", flush=True)
                else:
                    print(f"auth: ${token_env} is unset; generated token: {service.token}", flush=True)
                print(f"jobs: in this Ray cluster, reward backend serverless attaches here; elsewhere, backend http "
                      f"with reward.http.url={url} and ${token_env} from `rollart serve-reward --issue-token NAME`",
                      flush=True)
                print("Ctrl-C to stop", flush=True)
                threading.Event().wait()  # until SIGINT (KeyboardInterrupt) or SIGTERM (SystemExit, Runtime)
            except (KeyboardInterrupt, SystemExit):
                print("stopping the reward service", flush=True)
            finally:
                service.stop()
    except ResourceError as exc:
        print(f"rollart: {exc}", file=sys.stderr)
        return 1
    return 0
