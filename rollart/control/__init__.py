"""Control plane: rollout scheduler (admission, collection, ledger), sample buffer, staleness policy, turn barrier
(docs/architecture.md §2–6)."""

from rollart.control.buffer import BatchTimeout, ReadyGroup, SampleBuffer, domain_quotas
from rollart.control.ledger import Fate
from rollart.control.scheduler import DomainBroken, RolloutScheduler, SchedulerFailed
from rollart.control.staleness import StalenessPolicy
from rollart.control.turn_barrier import ActorTurnBarrier, LocalTurnBarrier

__all__ = [
    "ActorTurnBarrier",
    "BatchTimeout",
    "DomainBroken",
    "Fate",
    "LocalTurnBarrier",
    "ReadyGroup",
    "RolloutScheduler",
    "SchedulerFailed",
    "SampleBuffer",
    "StalenessPolicy",
    "domain_quotas",
]
