"""Resolve a reward spec from config (`domains.<d>.reward.fn`) into a callable reward function.

In: a spec string and the `RunConfig`. Out: a `RewardFn` (see protocol.py).
- `env`, `format`, `exact`, `regex` — rule rewards (rule_rewards.py);
- `math` — math-verify in a process pool (math_reward.py);
- `code` — program + hidden tests in the sandbox (code_reward.py);
- `judge` — a local checkpoint scores yes/no (judge_reward.py);
- `module.path:callable` — a user function or class (a class is instantiated once with no arguments) in one of
  the shapes of shapes.py, recognised from its signature: rollart's `f(trajectory)` and `f(response, row)`,
  TRL's batched `f(completions, **kwargs)` and verl's `compute_score(data_source, solution_str, ground_truth,
  extra_info)`; each wrapped as a function of the trajectory (`ShapedReward`).
Built-ins are made once per `RewardFns` (they hold process pools or a model), lazily on first use.

An unknown built-in, a path that does not import or a function of no known shape fails with a ValueError (a
`RewardShapeError` for the shape) that names the spec, the domain and what would be valid.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys

from rollart.config import RunConfig
from rollart.reward.protocol import RewardFn
from rollart.reward.shapes import Shape, ShapedReward, shape_of

log = logging.getLogger("rollart.reward")

BUILTINS = ("env", "format", "math", "code", "judge", "exact", "regex")


def _make_builtin(name: str, cfg: RunConfig) -> RewardFn:
    if name == "env":
        from rollart.reward.rule_rewards import env_reward

        return env_reward
    if name == "format":
        from rollart.reward.rule_rewards import format_reward

        return format_reward
    if name == "exact":
        from rollart.reward.rule_rewards import exact_reward

        return exact_reward
    if name == "regex":
        from rollart.reward.rule_rewards import RegexReward

        return RegexReward({d: c.reward.pattern for d, c in cfg.domains.items() if c.reward.fn == "regex"})
    if name == "math":
        from rollart.reward.math_reward import MathReward

        return MathReward(cfg.reward.math_timeout_s, cfg.reward.math_workers)
    if name == "code":
        from rollart.reward.code_reward import CodeReward

        return CodeReward(cfg.reward.sandbox)
    if name == "judge":
        from rollart.models import resolve_model_path
        from rollart.reward.judge_reward import JudgeReward

        model = cfg.model.model_copy(update={"path": cfg.reward.judge_model, "revision": "", "adapter": ""}) \
            if cfg.reward.judge_model else cfg.model
        return JudgeReward(resolve_model_path(model, seed=cfg.seed, key="reward.judge_model"), model.dtype,
                           trust_remote_code=model.trust_remote_code)
    raise AssertionError(name)


def _target(spec: str) -> object:
    """The object `module.path:callable` names (imported, not called; the current directory importable)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward fn {spec!r}: expected a built-in {list(BUILTINS)} or 'module.path:callable'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"reward fn {spec!r} cannot be loaded: {exc}") from exc
    if not callable(obj):
        raise ValueError(f"reward fn {spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def import_reward(spec: str, max_steps: int = 0) -> RewardFn:
    """`module.path:callable` → a reward of the trajectory (a class is instantiated with no arguments), in whatever
    shape it is written (shapes.py); `max_steps` is TRL's `trainer_state.max_steps`."""
    obj = _target(spec)
    shape = shape_of(obj, spec)
    fn = obj() if inspect.isclass(obj) else obj
    if shape.kind == "trajectory":
        return fn  # type: ignore[return-value]
    return ShapedReward(fn, shape, spec, max_steps)  # type: ignore[return-value]


def check_spec(spec: str, where: str, *, here: bool = True) -> Shape | None:
    """Fail early (before anything starts) on a spec that can never resolve: a built-in, or a
    `module.path:callable` that — when it runs `here` (backends local and serverless; an `http` service has
    its own) — imports (not instantiated) and has a shape rollart calls. Its `Shape` (None: a built-in, or not
    checked here)."""
    if spec in BUILTINS:
        return None
    if ":" not in spec:
        raise ValueError(f"{where}: {spec!r} is not a built-in reward {list(BUILTINS)} nor 'module.path:callable'")
    if not here:
        return None
    try:
        return shape_of(_target(spec), spec)
    except ValueError as exc:  # RewardShapeError included
        raise type(exc)(f"{where}: {exc}") from None


class RewardFns:
    """The reward functions of one process (the driver's, or one Serve replica's), made on first use."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._fns: dict[str, RewardFn] = {}

    def get(self, spec: str) -> RewardFn:
        if spec not in self._fns:
            if spec in BUILTINS:
                self._fns[spec] = _make_builtin(spec, self.cfg)
            else:
                self._fns[spec] = import_reward(spec, self.cfg.train.steps)
        return self._fns[spec]

    def warm(self, specs: list[str]) -> None:
        """Make these fns now and let each warm up (`warm()`: start pools, load models), so the first
        request a process serves does not pay for it."""
        for spec in specs:
            try:
                warm = getattr(self.get(spec), "warm", None)
                if callable(warm):
                    warm()
            except Exception as exc:  # noqa: BLE001 — the error is reported by the requests that need it
                log.warning("reward fn %r failed to warm up: %s", spec, exc)

    def close(self) -> None:
        for fn in self._fns.values():
            close = getattr(fn, "close", None)
            if callable(close):
                close()
        self._fns.clear()
