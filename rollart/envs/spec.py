"""Resolve an env spec (the `env` of a domain in config) to a factory of fresh environments.

In: a spec string and keyword options (`domains.<name>.options`). Accepted forms:
- a built-in name: see `BUILTIN_ENVS` (frozenlake, sokoban, math, code, guess_number, swe, and `dataset`, whose
  episodes are the rows of `domains.<name>.data`: `domain_env_factory` builds it);
- an adapter's kind (`ADAPTERS`, one file each in envs/adapters/): `<kind>:<id>` — e.g. `gem:<GEM id>`,
  `gym:<gymnasium id>`, `remote:<url of rollart env serve>`, `reasoning_gym:<dataset>` — or the bare kind of an
  adapter that takes no id (its options say what to reach);
- `module.path:Class`: the user's own env class — a class with the env protocol's `reset` and `step`
  (protocol.py), never any other callable (`os:system` is refused); the current directory is importable,
  so `my_envs:MyEnv` finds `./my_envs.py`.
Out: `EnvFactory`, a zero-argument callable returning a new env. The spec is checked here (module and
class imported, class found; an adapter's id by its own `check_id`) so a typo fails at start-up with an error
listing the accepted forms; envs themselves are built lazily, one per trajectory.

The adapter seam: an adapter is a class registered in `ADAPTERS` under its kind, built as `Class(id, **options)`
(or `Class(**options)` when its `TAKES_ID` is False); an optional `check_id(id)` classmethod raises ValueError
for an id that names nothing; `RUNS_AGENT = True` marks a kind whose trajectories a program runs through the
agent gateway (the env worker runs it as an agent domain: `adapter_agent`), not through reset/step.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
from typing import Any, Callable, Mapping

from rollart.config import DomainConfig, WorkspaceConfig
from rollart.envs.dataset import DatasetEnv, open_dataset_domain
from rollart.envs.dataset.rows import PromptMeter
from rollart.envs.domains.code_env import CodeEnv
from rollart.envs.domains.frozenlake import FrozenLakeEnv
from rollart.envs.domains.guess_number import GuessNumberEnv
from rollart.envs.domains.math_env import MathEnv
from rollart.envs.domains.sokoban import SokobanEnv
from rollart.envs.domains.swe.env import SweEnv
from rollart.envs.adapters.gem import GemEnv
from rollart.envs.adapters.gym import GymEnv
from rollart.envs.adapters.openenv import OpenEnvEnv
from rollart.envs.adapters.reasoning_gym import ReasoningGymEnv
from rollart.envs.adapters.verifiers import VerifiersEnv
from rollart.envs.adapters.remote import RemoteEnv
from rollart.envs.adapters.user_object import import_user_object
from rollart.envs.protocol import EnvFactory

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

# env kinds that bring someone else's environment (envs/adapters/): kind → adapter class
ADAPTERS: dict[str, type] = {
    "gem": GemEnv,
    "gym": GymEnv,
    "remote": RemoteEnv,
    "reasoning_gym": ReasoningGymEnv,
    "openenv": OpenEnvEnv,
    "verifiers": VerifiersEnv,
}


def _form(kind: str) -> str:
    """How a spec of the adapter reads (its `FORM`, e.g. remote:<url>)."""
    default = f"{kind}:<id>" if getattr(ADAPTERS[kind], "TAKES_ID", True) else kind
    return f"'{getattr(ADAPTERS[kind], 'FORM', default)}'"


ACCEPTED_FORMS = (
    f"a built-in name ({', '.join(BUILTIN_ENVS)}), an adapter ({', '.join(_form(k) for k in ADAPTERS)}; "
    "`rollart env list` shows each with an example) or 'module.path:Class' (your own class; the current "
    "directory is importable)"
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
    adapter = ADAPTERS.get(kind)
    if adapter is not None and getattr(adapter, "TAKES_ID", True):
        if sep and rest:
            return functools.partial(adapter, rest)
    elif adapter is not None:
        if not sep:
            return adapter
        raise EnvSpecError(f"env spec {spec!r}: the {kind} adapter takes no id; write `env: {kind}` and say what "
                           f"to reach in the domain's options")
    elif sep and rest and kind and all(p.isidentifier() for p in kind.split(".")):
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
    imports, or an id its adapter knows (checking one imports that package: seconds for GEM). Nothing is
    constructed."""
    env_constructor(spec)
    kind, _, env_id = spec.strip().partition(":")
    check_id = getattr(ADAPTERS.get(kind), "check_id", None)
    if env_id and callable(check_id):
        try:
            check_id(env_id)
        except ValueError as exc:
            raise EnvSpecError(f"env spec {spec!r}: {exc}") from None


def adapter_of(spec: str) -> type | None:
    """The adapter class of an adapter spec (`kind:<id>` or a bare kind), else None."""
    kind = spec.strip().partition(":")[0]
    return ADAPTERS.get(kind) if spec.strip() not in BUILTIN_ENVS else None


def adapter_agent(domain_cfg: DomainConfig) -> Callable[..., Any]:
    """The agent function of a domain whose env kind runs as an agent (its adapter `RUNS_AGENT`: e.g.
    verifiers:<taskset>): the `run(base_url, api_key, task)` of the adapter built with the domain's options."""
    adapter = adapter_of(domain_cfg.env)
    if adapter is None or not getattr(adapter, "RUNS_AGENT", False):
        raise EnvSpecError(f"env spec {domain_cfg.env!r} is not an agent-run kind (those are: "
                           f"{', '.join(k for k, c in ADAPTERS.items() if getattr(c, 'RUNS_AGENT', False))})")
    return make_env(domain_cfg.env, domain_cfg.options).run


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


def domain_env_factory(name: str, domain_cfg: DomainConfig, meter: PromptMeter | None, seed: int,
                       workspace: WorkspaceConfig | None = None) -> EnvFactory:
    """The env factory of a domain: its spec with its options, or for a dataset domain its rows — read,
    filtered with `meter` (the domain's chat template; needed for a dataset domain) and ordered by `seed`
    once, here. An env that takes a `workspace` option (the SWE domain) gets the run's `envs.workspace`: the
    keys the run sets (e.g. `backend: podman`), under the domain's own `options.workspace`."""
    if domain_cfg.env.strip() == DATASET_ENV:
        if meter is None:
            raise ValueError(f"domain {name!r}: a dataset domain's rows are measured with the model's chat template")
        domain = open_dataset_domain(name, domain_cfg, meter, seed)
        log.info("%s", domain.report())
        return domain.make_env
    options = dict(domain_cfg.options)
    run_set = workspace.model_dump(exclude_unset=True) if workspace is not None else {}
    cls = env_class(domain_cfg.env)
    if run_set and cls is not None and "workspace" in inspect.signature(cls).parameters:
        options["workspace"] = {**run_set, **dict(options.get("workspace") or {})}
    return resolve_env(domain_cfg.env, options)


def make_env(spec: str, options: Mapping[str, Any] | None = None) -> Any:
    """One env of `spec`; an error from its constructor names the spec and the options."""
    try:
        return resolve_env(spec, options)()
    except EnvSpecError:
        raise
    except TypeError as exc:
        raise EnvSpecError(f"env spec {spec!r} rejected options {dict(options or {})}: {exc}") from exc
