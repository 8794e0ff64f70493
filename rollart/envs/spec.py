"""Resolve an env spec (the `env` of a domain in config) to a factory of fresh environments.

In: a spec string and keyword options (`domains.<name>.options`). Accepted forms:
- a built-in name: see `BUILTIN_ENVS` (frozenlake, sokoban, math, code, guess_number, swe, and `dataset`, whose
  episodes are the rows of `domains.<name>.data`: `domain_env_factory` builds it);
- `remote:<url>`: the envs an env server (`rollart env serve DOMAIN`) serves at that URL, e.g.
  `remote:http://127.0.0.1:8710` (options: `urls` for more servers, `token_env`, `timeout_s`);
- `gem:<id>`: any GEM env id, e.g. `gem:game:Minesweeper-v0-easy`;
- `gym:<id>`: a gymnasium env with a discrete action space, e.g. `gym:FrozenLake-v1`;
- `module.path:Class`: the user's own env class — a class with the env protocol's `reset` and `step`
  (protocol.py), never any other callable (`os:system` is refused); the current directory is importable,
  so `my_envs:MyEnv` finds `./my_envs.py`.
Out: `EnvFactory`, a zero-argument callable returning a new env. The spec is checked here (module and
class imported, class found) so a typo fails at start-up with an error listing the accepted forms;
envs themselves are built lazily, one per trajectory.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
from typing import Any, Callable, Mapping

from rollart.config import DomainConfig
from rollart.envs.dataset import DatasetEnv, open_dataset_domain
from rollart.envs.dataset.rows import PromptMeter
from rollart.envs.domains.code_env import CodeEnv
from rollart.envs.domains.frozenlake import FrozenLakeEnv
from rollart.envs.domains.guess_number import GuessNumberEnv
from rollart.envs.domains.math_env import MathEnv
from rollart.envs.domains.sokoban import SokobanEnv
from rollart.envs.domains.swe.env import SweEnv
from rollart.envs.adapters.gem import GemEnv, registered_gem_ids
from rollart.envs.adapters.gym import GymEnv
from rollart.envs.protocol import EnvFactory
from rollart.envs.adapters.remote import RemoteEnv
from rollart.envs.adapters.user_object import import_user_object

log = logging.getLogger("rollart.envs")

BUILTIN_ENVS: dict[str, Callable[..., Any]] = {
    "frozenlake": FrozenLakeEnv,
    "sokoban": SokobanEnv,
    "math": MathEnv,
    "code": CodeEnv,
    "guess_number": GuessNumberEnv,
    "swe": SweEnv,
    "dataset": DatasetEnv,
}
DATASET_ENV = "dataset"

ACCEPTED_FORMS = (
    f"a built-in name ({', '.join(BUILTIN_ENVS)}), 'gem:<id>' (e.g. gem:game:Minesweeper-v0-easy), "
    "'gym:<id>' (e.g. gym:FrozenLake-v1), 'remote:<url>' (an env server: `rollart env serve`) or "
    "'module.path:Class' (your own class; the current directory is importable)"
)

ENV_METHODS = "reset(seed) -> (obs, info) and step(action) -> (obs, reward, terminated, truncated, info)"


class EnvSpecError(ValueError):
    """An env spec that names nothing that can be built."""


def env_constructor(spec: str) -> Callable[..., Any]:
    """The callable that builds an env of `spec` from keyword options (checked, not yet called)."""
    spec = spec.strip()
    if spec in BUILTIN_ENVS:
        return BUILTIN_ENVS[spec]
    kind, sep, rest = spec.partition(":")
    if sep and rest:
        if kind == "gem":
            return functools.partial(GemEnv, rest)
        if kind == "gym":
            return functools.partial(GymEnv, rest)
        if kind == "remote":
            return functools.partial(RemoteEnv, rest)
        if kind and all(p.isidentifier() for p in kind.split(".")):
            return _env_class(spec, import_user_object(spec, "env spec", ACCEPTED_FORMS, EnvSpecError))
    raise EnvSpecError(f"unknown env spec {spec!r}. Accepted: {ACCEPTED_FORMS}")


def _env_class(spec: str, target: Any) -> type:
    """`target` if it is a class; EnvSpecError otherwise: a function that takes the domain's options as
    keyword arguments could be anything (`os:system` ran a shell command). Its env methods are checked by
    `missing_env_methods` (the pre-check)."""
    if not inspect.isclass(target):
        raise EnvSpecError(f"env spec {spec!r} names a {type(target).__name__}, not a class: an env spec must name "
                           f"an env class with {ENV_METHODS}")
    return target


def check_env_spec(spec: str) -> None:
    """Raise `EnvSpecError` unless `spec` names something that can be built: a built-in, a user class that
    imports, or an id GEM or gymnasium has registered (checking one imports that package: seconds for GEM).
    Nothing is constructed."""
    env_constructor(spec)
    kind, _, env_id = spec.strip().partition(":")
    if kind == "gem":
        known = registered_gem_ids()
        if env_id not in known:
            close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join('gem:' + c for c in close)}? " if close else ""
            raise EnvSpecError(f"env spec {spec!r}: GEM has no env {env_id!r}; {hint}ids start with game:, rg:, "
                               f"math:, code:, qa: ({len(known)} registered)")
    elif kind == "gym":
        import gymnasium

        try:
            gymnasium.spec(env_id)
        except gymnasium.error.Error as exc:
            raise EnvSpecError(f"env spec {spec!r}: gymnasium has no env {env_id!r} ({exc})") from None


def env_class(spec: str) -> type | None:
    """The class an env spec builds (for a `gem:`, `gym:` or `remote:` id, its adapter); None if it is no class."""
    ctor = env_constructor(spec)
    target = ctor.func if isinstance(ctor, functools.partial) else ctor
    return target if isinstance(target, type) else None


def missing_env_methods(spec: str, needs: tuple[str, ...] = ()) -> list[str]:
    """The methods of `reset`, `step` and `needs` that the class `spec` builds lacks (nothing is built;
    an adapter's env is not known before it is built: nothing is reported)."""
    cls = env_class(spec)
    if cls is None:
        return []
    missing = [m for m in ("reset", "step", *needs) if not callable(getattr(cls, m, None))]
    if "random_action" in missing and callable(getattr(cls, "sample_random_action", None)):
        missing.remove("random_action")  # GEM's name for it
    return missing


def resolve_env(spec: str, options: Mapping[str, Any] | None = None) -> EnvFactory:
    """A factory of fresh envs for `spec` built with `options` as keyword arguments."""
    if spec.strip() == DATASET_ENV:
        raise EnvSpecError("env 'dataset' is built from a domain's `data` (domain_env_factory), not from options")
    return functools.partial(env_constructor(spec), **dict(options or {}))


def domain_env_factory(name: str, domain_cfg: DomainConfig, meter: PromptMeter | None, seed: int) -> EnvFactory:
    """The env factory of a domain: its spec with its options, or for a dataset domain its rows — read,
    filtered with `meter` (the domain's chat template; needed for a dataset domain) and ordered by `seed`
    once, here."""
    if domain_cfg.env.strip() == DATASET_ENV:
        if meter is None:
            raise ValueError(f"domain {name!r}: a dataset domain's rows are measured with the model's chat template")
        domain = open_dataset_domain(name, domain_cfg, meter, seed)
        log.info("%s", domain.report())
        return domain.make_env
    return resolve_env(domain_cfg.env, domain_cfg.options)


def make_env(spec: str, options: Mapping[str, Any] | None = None) -> Any:
    """One env of `spec`; an error from its constructor names the spec and the options."""
    try:
        return resolve_env(spec, options)()
    except EnvSpecError:
        raise
    except TypeError as exc:
        raise EnvSpecError(f"env spec {spec!r} rejected options {dict(options or {})}: {exc}") from exc
