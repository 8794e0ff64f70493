"""rollart.reward — the reward plane: score finished trajectories, locally or as an elastic service.

Public API (the driver needs only `RewardRouter`):
- `RewardRouter(cfg, *, service=None)` — implements `types.RewardScorer`: `start()`,
  `await score(trajectory) -> RewardResult`, `metrics() -> dict[str, float]`, `stop()` (router.py).
- `RewardService(cfg, *, token=None, port=None)` — the Ray Serve app: `start() -> url`, `stats()`,
  `scorings(key)`, `stop()` (service.py; `rollart serve-reward` runs one standalone).
- `RewardOutput`, `to_payload`, `trajectory_from_payload`, `final_action` — the reward protocol and the
  JSON payload (protocol.py); built-in fns `env`, `format`, `math`, `code`, `judge` (registry.py).
`service` (Ray Serve) is imported lazily: local scoring never loads Ray.
"""

from __future__ import annotations

from typing import Any

from rollart.reward.protocol import RewardOutput, final_action, to_payload, trajectory_from_payload
from rollart.reward.router import RewardRouter

__all__ = ["RewardOutput", "RewardRouter", "RewardService", "final_action", "to_payload", "trajectory_from_payload"]


def __getattr__(name: str) -> Any:
    if name == "RewardService":
        from rollart.reward.service import RewardService

        return RewardService
    raise AttributeError(f"module 'rollart.reward' has no attribute {name!r}")
