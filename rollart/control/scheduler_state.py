"""The rollout scheduler's checkpoint state as plain data: what a resumed run needs to go on where one stood.

In: the scheduler's counters and its buffer's ready groups (`SchedulerState.of_parts`), or the JSON data of a
checkpoint (`decode_state`: data, not trusted). Out: `SchedulerState` (frozen) and its JSON form (`to_json`).

Fields: `next_seq` (the next group's sequence number); `rng` (the domain sampler's `random.Random` state);
`replay` ((domain, seq, seed) of the groups still running: admitted again in order, exact for α = 0);
`ordinals` (each dataset domain's next row ordinal); `ready` (the groups scored but not yet trained, each
trajectory as JSON, `rollart.base.codec`: they go back into the buffer as they were — trained once, never
generated again); `filtered` (groups the group filter dropped while the next batch formed: its per-batch
bound goes on counting). A state written before `filtered` existed reads as 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping

from rollart.base.codec import from_json, to_json
from rollart.control.buffer import ReadyGroup


@dataclass(frozen=True)
class SchedulerState:
    next_seq: int
    rng: tuple
    replay: tuple[tuple[str, int, int], ...]  # (domain, seq, seed)
    ordinals: dict[str, int]  # each dataset domain's next row ordinal
    ready: tuple[ReadyGroup, ...]
    filtered: int = 0

    def to_json(self) -> dict[str, Any]:
        version, internal, gauss = self.rng
        return {"next_seq": self.next_seq, "rng": [version, list(internal), gauss],
                "replay": [list(r) for r in self.replay], "ordinals": dict(self.ordinals),
                "ready": [to_json(g) for g in self.ready], "filtered": self.filtered}


def decode_state(state: Mapping[str, Any]) -> SchedulerState:
    """Read a scheduler state (from a checkpoint: data, not trusted) without applying it; ValueError naming
    the field that does not read back — the driver's pre-check runs it before anything starts."""
    def field_of(name: str) -> Any:
        if name not in state:
            raise ValueError(f"field 'scheduler.{name}' is missing")
        return state[name]

    try:
        next_seq = field_of("next_seq")
        if not isinstance(next_seq, int) or isinstance(next_seq, bool) or next_seq < 0:
            raise ValueError(f"field 'scheduler.next_seq' must be an integer ≥ 0, got {next_seq!r:.80}")
        raw = field_of("rng")
        try:
            rng = (raw[0], tuple(raw[1]), raw[2])
            random.Random().setstate(rng)
        except (TypeError, ValueError, IndexError, OverflowError) as exc:
            raise ValueError(f"field 'scheduler.rng' is not a random.Random state ({exc})") from None
        raw_replay, raw_ordinals = field_of("replay"), field_of("ordinals")
        try:
            replay = tuple((str(d), int(seq), int(seed)) for d, seq, seed in raw_replay)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"field 'scheduler.replay' must be [[domain, seq, seed], …] ({exc})") from None
        try:
            ordinals = {str(d): int(n) for d, n in raw_ordinals.items()}
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"field 'scheduler.ordinals' must map domains to row ordinals ({exc})") from None
        filtered = state.get("filtered", 0)
        if not isinstance(filtered, int) or isinstance(filtered, bool) or filtered < 0:
            raise ValueError(f"field 'scheduler.filtered' must be an integer ≥ 0, got {filtered!r:.80}")
        ready = state.get("ready", [])
        if not isinstance(ready, list):
            raise ValueError(f"field 'scheduler.ready' must be a list, got {type(ready).__name__}")
        groups = []
        for i, data in enumerate(ready):
            try:
                groups.append(from_json(ReadyGroup, data))
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"field 'scheduler.ready[{i}]' is not a scored group ({exc})") from None
    except TypeError as exc:  # `state` itself is no mapping
        raise ValueError(f"field 'scheduler' must be an object ({exc})") from None
    return SchedulerState(next_seq, rng, replay, ordinals, tuple(groups), filtered)
