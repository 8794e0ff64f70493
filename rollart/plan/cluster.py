"""The run the planner plans for: the user's run with every domain's profile known and token budgets that
hold the episodes those profiles describe.

In: a `RunConfig` (often a laptop's: the demo caps answers at 12 tokens). Out: `for_the_cluster(cfg) ->
(RunConfig, notes)` — every domain with a profile (`rollart.sim.profiles.with_profiles`: declared, or its
kind's default; a domain with neither is refused), `max_new_tokens` and `max_total_tokens` raised where they
would cut the profile's episodes short, and one note per change. The twin scores candidates on this run and
`plan/run.yaml` is written from it, so what was planned is what the cluster runs.

A budget holds a long episode: mean + 3 std of each count (the largest sample of an empirical one), turns
capped by `max_turns`, rounded up to a power of two. Budgets are only ever raised: a larger one the run set
stays.
"""

from __future__ import annotations

from math import ceil, log2

from rollart.config import CountConfig, DomainConfig, RunConfig
from rollart.sim.profiles import with_profiles


def _long(count: CountConfig) -> float:
    """A long draw of `count`: mean + 3 std, or the largest sample."""
    if count.dist == "empirical":
        return float(max(count.samples))
    return count.mean + (3 * count.std if count.dist != "constant" else 0.0)


def _power_of_two(tokens: float) -> int:
    return 1 << ceil(log2(max(tokens, 16.0)))


def token_budgets(domain: DomainConfig) -> dict[str, int]:
    """`max_new_tokens` and `max_total_tokens` that hold a long episode of the domain's profile."""
    assert domain.profile is not None
    prof = domain.profile
    response = _long(prof.response_tokens)
    turns = min(domain.max_turns, max(1, ceil(_long(prof.turns))))
    context = _long(prof.prompt_tokens) + (turns - 1) * _long(prof.obs_tokens) + turns * response
    return {"max_new_tokens": _power_of_two(response), "max_total_tokens": _power_of_two(context)}


def for_the_cluster(cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """`cfg` as the planner plans it, and what was filled in or raised (see the module docstring)."""
    cfg, notes = with_profiles(cfg)
    domains: dict[str, DomainConfig] = {}
    for name, domain in cfg.domains.items():
        raised = {key: value for key, value in token_budgets(domain).items() if value > getattr(domain, key)}
        domains[name] = domain.model_copy(update=raised)
        if raised:
            changes = ", ".join(f"{key} {getattr(domain, key)} → {value}" for key, value in raised.items())
            notes.append(f"{name}: {changes} (to hold its profile's long episodes: mean + 3 std)")
    return cfg.model_copy(update={"domains": domains}), notes
