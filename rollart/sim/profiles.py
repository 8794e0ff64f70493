"""A profile for every domain of a run: the one it declares, else the declared default of its kind, else a
refusal that says how to declare one.

In: a `RunConfig`. Out: `with_profiles(cfg) -> (RunConfig, notes)` — the config with every domain's
`profile` set, and one line per domain saying where its profile came from (the twin and the planner print
them), or `MissingProfiles` naming every domain that has neither a profile nor a kind with a default.

A domain's kind is read from its env: `frozenlake`; `math` (also `gem:math:*`); `game` (`sokoban`,
`guess_number`, `gem:game:*`); `code` (also `gem:code:*`); `swe`. The defaults are the paper-scale episode
profiles of `rollart.sim.presets.TASKS` (declared, not measured: see that module). An agent domain, a
gymnasium env or a user's class has no kind the twin can know: it needs a declared profile — or one
measured by a short real run (its `profile/<domain>/*` metrics).
"""

from __future__ import annotations

from rollart.config import DomainConfig, DomainProfileConfig, RunConfig
from rollart.sim.presets import TASKS

_KIND_OF_ENV = {"frozenlake": "frozenlake", "math": "math", "sokoban": "game", "guess_number": "game",
                "code": "code", "swe": "swe"}
_KIND_OF_GEM = {"math": "math", "game": "game", "code": "code"}


class MissingProfiles(ValueError):
    """Domains with no declared profile and no default for their kind."""


def kind_of(domain: DomainConfig) -> str | None:
    """The task kind of `TASKS` a domain is, or None (agents, gymnasium envs, user classes)."""
    if domain.runs_agent:
        return None
    if domain.env in _KIND_OF_ENV:
        return _KIND_OF_ENV[domain.env]
    if domain.env.startswith("gem:"):
        return _KIND_OF_GEM.get(domain.env.split(":")[1])
    return None


def describe(profile: DomainProfileConfig) -> str:
    turns = profile.turns.mean
    text = f"{turns:g} turn{'s' if turns != 1 else ''}, prompt {profile.prompt_tokens.mean:g} tokens"
    if turns > 1:
        text += f", {profile.obs_tokens.mean:g} more per turn"
    return text + f", responses {profile.response_tokens.mean:g} tokens"


def with_profiles(cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """`cfg` with a profile on every domain, and where each came from (see the module docstring)."""
    domains: dict[str, DomainConfig] = {}
    notes: list[str] = []
    missing: list[str] = []
    for name, domain in cfg.domains.items():
        if domain.profile is not None:
            domains[name] = domain
            notes.append(f"{name}: declared profile ({describe(domain.profile)})")
            continue
        kind = kind_of(domain)
        if kind is None:
            what = f"agent {domain.agent}" if domain.agent else f"env {domain.env}"
            missing.append(f"domains.{name} ({what})")
            continue
        profile = DomainProfileConfig.model_validate(TASKS[kind]["profile"])
        domains[name] = domain.model_copy(update={"profile": profile})
        notes.append(f"{name}: no profile declared: the default of a {kind} domain ({describe(profile)}; "
                     f"rollart/sim/presets.py); declare domains.{name}.profile for your own figures")
    if missing:
        raise MissingProfiles(
            f"{', '.join(missing)}: no profile declared and no default for this kind of domain; declare "
            "domains.<name>.profile (turns, prompt_tokens, obs_tokens, response_tokens, env_step, reward: "
            "`rollart config explain domains.<name>.profile`), e.g. from the profile/<name>/* metrics of a "
            "short real run")
    return cfg.model_copy(update={"domains": domains}), notes
