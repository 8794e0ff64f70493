"""`rollart serve-reward [RUN.yaml] [overrides] [--port N]`: run the reward service on its own.

For a separate cluster (or machine) that scores for a training job elsewhere: starts (or joins, with
`cluster.address`) Ray, deploys the reward service of `rollart/reward/service.py` (Ray Serve, autoscaling
per `reward.serverless`), prints its URL, and serves until Ctrl-C or SIGTERM, then stops cleanly (app,
ledger, Serve, Ray) and exits 0.

Auth: every request needs `Authorization: Bearer <token>`; the token is the value of the env var named by
`reward.http.token_env` (default ROLLART_REWARD_TOKEN), or, when that is unset, a fresh random one that is
printed once. The training job then uses backend `http` with `reward.http.url=<printed URL>` and the same
env var. Requests over `reward.max_payload_mb` are refused (413); every error is answered as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from rollart.commands.common import add_run_args, config_from_args


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve-reward", help="run the reward service standalone and print its URL")
    add_run_args(parser)
    parser.add_argument("--port", type=int, help="HTTP port (default reward.serverless.port)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # a bad config exits 2 here, before Ray starts
    from rollart.config_loader import ConfigError

    if problem := cfg.reward.plain_http_problem(serving=True, sending=False):
        raise ConfigError(f"invalid config:\n  - {problem}")

    from rollart.resources.errors import ResourceError
    from rollart.resources.runtime import Runtime
    from rollart.reward.service import RewardService

    token_env = cfg.reward.http.token_env
    try:
        with Runtime(cfg) as rt:
            service = RewardService(cfg, port=args.port)
            try:
                url = service.start()
                print(f"reward service: {url}  ({rt.describe()})", flush=True)
                if os.environ.get(token_env):
                    print(f"auth: Bearer token from ${token_env}", flush=True)
                else:
                    print(f"auth: ${token_env} is unset; generated token: {service.token}", flush=True)
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
