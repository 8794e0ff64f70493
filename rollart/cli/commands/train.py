"""`rollart train [RUN.yaml] [overrides]`: run a training job; `resume=true` continues the run in run_dir.

It says at start where the run goes, how to read its samples and the TensorBoard command that shows it
live (Ray's dashboard URL follows once Ray is up, when there is one: `cluster.dashboard`). A run that stops
on an error (a trainer that kept dying, a lost cluster, a bug) or on Ctrl-C ends with the
exact command that continues it from its last checkpoint: the same run file and overrides, with
`run_dir=<its run dir> resume=true`. An expected failure (the trainer ranks rebuilt past `train.restarts`, a
resource-plane error) is told in one message; anything else with its traceback. A domain whose env, agent
or reward function keeps failing (`DomainBroken`, the circuit breaker) is a bug, not an outage: one message
with the domain, the count and the first error's traceback, and no resume command; so is an error of the
run's input found only once it started (its data, its model, a reward function's shape: `input_error`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import traceback
from typing import Sequence

from rollart.cli.commands.common import add_run_args, config_from_args
from rollart.config import RunConfig
from rollart.resources.logs import configure_logging


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train an agent (the default config runs a multi-task job on CPU)")
    add_run_args(parser)
    parser.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # a bad config stops here, before anything starts
    configure_logging(cfg.observability.log_level)
    from rollart.config.loader import ConfigError
    from rollart.control import DomainBroken
    from rollart.job.driver import train
    from rollart.observability.report import build_report
    from rollart.resources.errors import ResourceError
    from rollart.trainer import TrainerFailed

    from rollart.base.run_dir import RunPaths

    paths = RunPaths.of(cfg.run_dir)
    print(f"rollart: training into {paths.root} — `rollart samples {paths.root}` shows what the model writes"
          + (f"; watch it live: tensorboard --logdir {paths.tensorboard}" if cfg.observability.tensorboard else ""),
          flush=True)
    try:
        summary = train(cfg)
    except ConfigError:
        raise  # refused before anything started: nothing to resume
    except DomainBroken as exc:  # a bug in a domain's env or agent: the message says what; no resume for it
        print(f"rollart: training stopped: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"rollart: interrupted. {resume_hint(args.items, cfg)}", file=sys.stderr)
        return 130
    except (TrainerFailed, ResourceError) as exc:
        print(f"rollart: training stopped: {exc}\n{resume_hint(args.items, cfg)}", file=sys.stderr)
        return 1
    except Exception as exc:
        if (wrong := input_error(exc)) is not None:
            # the data, the model or a function the config names is wrong: the same start fails the same way
            print(f"rollart: training stopped: {type(wrong).__name__}: {wrong}\nFix it and start the run again; a "
                  "resume cannot fix it.", file=sys.stderr)
            return 1
        traceback.print_exc()
        print(f"rollart: training stopped on the error above. {resume_hint(args.items, cfg)}", file=sys.stderr)
        return 1
    report = build_report(cfg.run_dir)
    print(_table(summary))
    print(json.dumps({k: summary[k] for k in ("eval_first", "eval_last", "steps", "wall_s")}, default=str))
    print(f"run directory: {cfg.run_dir}  (report: {report})")
    return 0


def input_error(exc: BaseException) -> BaseException | None:
    """The error in `exc` or its causes that says the run's input is wrong — its data (`DataError`), its model
    (`CheckpointError`), the shape of a reward function (`RewardShapeError`) or an env or agent it names — which a
    resume would meet again (None: an error a resume may get past)."""
    from rollart.envs.agents.function import AgentSpecError
    from rollart.envs.dataset import DataError
    from rollart.envs.spec import EnvSpecError
    from rollart.models.loading import CheckpointError
    from rollart.reward.shapes import RewardShapeError

    kinds = (DataError, CheckpointError, RewardShapeError, EnvSpecError, AgentSpecError)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kinds):
            return exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def resume_command(items: Sequence[str], run_dir: str) -> str:
    """`rollart train` with the same run file and overrides, pointed at `run_dir`, with resume=true."""
    kept = [i for i in items if i.split("=", 1)[0] not in ("run_dir", "resume")]
    return shlex.join(["rollart", "train", *kept, f"run_dir={run_dir}", "resume=true"])


def resume_hint(items: Sequence[str], cfg: RunConfig) -> str:
    from rollart.trainer import latest_checkpoint

    latest = latest_checkpoint(cfg.run_dir)
    where = f"its last checkpoint ({latest.name})" if latest else "the start (no checkpoint was written yet)"
    return f"To continue from {where}:\n  {resume_command(items, cfg.run_dir)}"


def _table(summary: dict) -> str:
    first, last = summary.get("eval_first_by_domain") or {}, summary.get("eval_last_by_domain") or {}
    rows = [f"{'domain':<14}{'first eval':>12}{'last eval':>12}{'change':>10}"]
    for d in sorted(set(first) | set(last)):
        a, b = first.get(d), last.get(d)
        change = f"{b - a:+.3f}" if a is not None and b is not None else "—"
        rows.append(f"{d:<14}{_fmt(a):>12}{_fmt(b):>12}{change:>10}")
    a, b = summary.get("eval_first"), summary.get("eval_last")
    rows.append(f"{'mean':<14}{_fmt(a):>12}{_fmt(b):>12}"
                f"{(f'{b - a:+.3f}' if a is not None and b is not None else '—'):>10}")
    return "\n".join(rows)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"
