"""`rollart samples RUN_DIR [--domain D] [--step N] [--worst | --best]`: what the model generated, in the terminal.

Prints the trajectories a run wrote to RUN_DIR/samples.jsonl (`observability.samples_per_domain` per domain
and step: rollart/observability/samples.py) — by default those of the last step it holds, for every domain —
each with its reward, status, versions and token counts, then every turn's prompt and response text as the
model saw and wrote it. `--step N` picks a step, `--domain D` a domain, `--worst` / `--best` the worst or best
trajectory of each domain. A run directory without samples, or a step or domain it has none of, exits 2 saying
what it does hold. The file is streamed (never read whole); lines that are not samples are skipped and
counted on stderr, with their line numbers.
"""

from __future__ import annotations

import argparse
import sys

from rollart.config.loader import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("samples", help="print the trajectories a run generated, as text")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (its run_dir)")
    parser.add_argument("--domain", help="only this domain")
    parser.add_argument("--step", type=int, help="this RL step (default: the last one with samples)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--worst", action="store_true", help="only the worst-rewarded trajectory of each domain")
    which.add_argument("--best", action="store_true", help="only the best-rewarded trajectory of each domain")
    parser.set_defaults(func=_samples)


def _samples(args: argparse.Namespace) -> int:
    from rollart.base.run_dir import RunPaths
    from rollart.base.untrusted import printable
    from rollart.observability.samples import read_samples, render_text, scan_samples

    path = RunPaths.of(args.run_dir).samples
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: RUN_DIR must be the run_dir of a run, and the run must have "
                          "written samples (observability.samples_per_domain > 0)")
    index = scan_samples(path)  # streamed: which steps of which domains the file holds, nothing more
    if skipped := index.skipped.describe(path):
        print(printable(skipped), file=sys.stderr)
    domains = index.domains
    if args.domain is not None and args.domain not in domains:
        raise ConfigError(f"--domain {args.domain}: {path} holds samples of {domains or 'no domain'}")
    steps = index.steps(args.domain)
    if not steps:
        raise ConfigError(f"{path} holds no samples yet" + (" (every line skipped: see above)" if skipped else ""))
    if args.step is not None and args.step not in steps:
        raise ConfigError(f"--step {args.step}: {path} holds samples of steps {steps[0]}–{steps[-1]}")
    step = args.step if args.step is not None else steps[-1]
    chosen = read_samples(path, [step], args.domain)
    if args.worst or args.best:
        by_domain: dict[str, list] = {}
        for sample in chosen:
            by_domain.setdefault(sample["domain"], []).append(sample)

        def reward(sample: dict) -> float:
            return sample["reward"] if sample["reward"] is not None else float("-inf")

        pick = min if args.worst else max
        chosen = [pick(group, key=reward) for _, group in sorted(by_domain.items())]
    print("\n\n".join(render_text(sample) for sample in chosen))
    return 0
