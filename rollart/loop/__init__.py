"""The RL loop (`RLLoop`, rl_loop.py) and what it needs of its collaborators (protocols.py)."""

from rollart.loop.protocols import DRIVER_LANE, TRAINER_LANE, LoopRecorder, LoopSystem, Rollout, TrainedVersion
from rollart.loop.rl_loop import RLLoop, TrainStepInFlight

__all__ = ["DRIVER_LANE", "TRAINER_LANE", "LoopRecorder", "LoopSystem", "RLLoop", "Rollout", "TrainStepInFlight",
           "TrainedVersion"]
