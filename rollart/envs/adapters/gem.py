"""`gem:<id>` — any GEM environment (`gem-llm`) as a rollart env.

In: a GEM id (e.g. `game:GuessTheNumber-v0-easy`, `game:Sokoban-v0-easy`) and keyword options for
`gem.make`. Out: the GEM protocol unchanged except for the observation text, which is GEM's observation
plus its `info["suffix"]` (the board and the question of the turn: what GEM's own chat wrapper shows).
An action with no `\\boxed{...}` is reported as a format error without being passed to GEM (whose games
end the episode on one), so the domain's format-penalty policy applies to GEM envs as to every other.
Offline, GEM's `game:` and reasoning-gym `rg:` ids work; Wordle/Hangman/WordSearch need an NLTK
download and `math:`/`code:`/`qa:` need hub datasets, which an offline machine cannot download.
"""

from __future__ import annotations

import threading
from typing import Any

from rollart.envs.actions import extract_boxed

# GEM games draw from the process-global `random`/numpy RNGs, seeded in reset: calls from several
# threads at once would interleave seeding and drawing, so one lock makes episodes reproducible.
_GEM_LOCK = threading.Lock()


def _with_suffix(obs: str, info: dict[str, Any]) -> str:
    suffix = info.get("suffix")
    if not suffix:
        return obs
    return obs + ("" if obs.endswith("\n") or not obs else "\n") + str(suffix)


def _import_gem() -> Any:
    """`import gem`, undoing the root-logger configuration it does at import."""
    import logging

    root_handlers = list(logging.getLogger().handlers)
    root_level = logging.getLogger().level
    import gem

    logging.getLogger().handlers[:] = root_handlers
    logging.getLogger().setLevel(root_level)
    return gem


def registered_gem_ids() -> list[str]:
    """Every env id GEM knows (imports GEM: a few seconds)."""
    _import_gem()
    from gem.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


class GemEnv:
    """A GEM env made by `gem.make(env_id, **options)`."""

    FORM = "gem:<id>"
    EXAMPLE = "gem:game:GuessTheNumber-v0-easy"

    @classmethod
    def check_id(cls, env_id: str) -> None:
        """ValueError unless GEM has registered `env_id` (imports GEM: seconds)."""
        import difflib

        known = registered_gem_ids()
        if env_id not in known:
            close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join('gem:' + c for c in close)}? " if close else ""
            raise ValueError(f"GEM has no env {env_id!r}; {hint}ids start with game:, rg:, math:, code:, qa: "
                             f"({len(known)} registered)")

    def __init__(self, env_id: str, **options: Any) -> None:
        gem = _import_gem()
        try:
            with _GEM_LOCK:  # constructors may draw from the global RNGs too
                self.env = gem.make(env_id, **options)
        except Exception as exc:
            from gem.envs.registration import ENV_REGISTRY

            games = sorted(k for k in ENV_REGISTRY if k.startswith("game:"))
            raise ValueError(
                f"gem:{env_id}: GEM could not make this env ({type(exc).__name__}: {exc}). "
                f"Offline-capable ids include {', '.join(games[:8])} …"
            ) from exc
        self.env_id = env_id

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        with _GEM_LOCK:
            obs, info = self.env.reset(seed=seed)
        return _with_suffix(str(obs), info), dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if extract_boxed(action) is None:
            return "Invalid action: put your move in \\boxed{}.", 0.0, False, False, {
                "format_error": "no \\boxed{action} found"
            }
        with _GEM_LOCK:
            obs, reward, terminated, truncated, info = self.env.step(action)
        return _with_suffix(str(obs), info), float(reward), bool(terminated), bool(truncated), dict(info)

    def random_action(self) -> str:
        with _GEM_LOCK:
            return str(self.env.sample_random_action())

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
