"""A run's ledger file (RUN_DIR/ledger.jsonl): written as the run goes, and read back — did every trajectory
end exactly once?

Writing: `LedgerFile(paths, keep_bytes)` (paths: the run's `RunPaths`) is the `LedgerSink` the rollout scheduler
writes each move to (one JSON line; handed to the OS at most `FLUSH_S` after it was written — a write per move
was the driver's largest per-trajectory I/O); `size()` makes the file durable and says how far a checkpoint taken
now covers
it, and a resumed run first cuts the file back to what its checkpoint covered (`keep_bytes`), so the file
always tells the history of the weights the run holds: what happened after the checkpoint never did — which
is also why a driver killed with moves still in its buffer loses nothing a resume would keep.

Reading: the ledger file a run wrote (one JSON object per move: {"time", "id", "group", "domain", "fate",
"reason", "digest", "batch"}; see `rollart.base.run_dir`). Out: `audit_ledger(path)` → a `LedgerAudit`: how many
trajectories started, how many ended how, which were lost (started, never ended) or moved twice (ended
twice, trained twice), and the trained trajectories with the batch and the digest of what was trained.

The moves a trajectory may make: started (running) → ready (scored, in the buffer) → trained, or → aborted
| failed | stale | filtered (its complete group dropped by the algorithm's group filter); ready → stale
(dropped from the buffer). A resumed run starts again the trajectories that
were running at its checkpoint (the file was cut back there): running → running is a restart, not a
duplicate. Any other move breaks "every trajectory ends exactly once" and is listed.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rollart.base.run_dir import RunPaths

FLUSH_S = 1.0  # a move reaches the OS (and a reader of the file) at most this long after it was written
_ALLOWED = {
    None: {"running"},
    "running": {"running", "ready", "aborted", "failed", "stale", "filtered"},
    "ready": {"trained", "stale"},
}


class LedgerFile:
    """The run's ledger file, open for appending (implements `rollart.types.LedgerSink`)."""

    def __init__(self, paths: RunPaths, keep_bytes: int = 0) -> None:
        self._file = paths.open(paths.ledger, "a+b")  # never through a link (rollart.base.run_dir)
        # what a crash left past the checkpoint never happened (the weights it led to were lost)
        self._file.truncate(min(keep_bytes, self._file.seek(0, os.SEEK_END)))
        self._flushed = time.monotonic()

    def write(self, entry: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(entry).encode() + b"\n")
        now = time.monotonic()
        if now - self._flushed >= FLUSH_S:
            self._file.flush()
            self._flushed = now

    def size(self) -> int:
        """Make the file durable; its size (what a checkpoint taken now covers)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return self._file.tell()

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class LedgerAudit:
    started: int
    fates: Counter  # final fate → trajectories
    lost: tuple[str, ...]  # started and never ended
    broken: tuple[str, ...]  # "<id>: <from> → <to>" moves that break exactly-once
    trained: dict[str, tuple[int, str]] = field(default_factory=dict)  # id → (batch, digest)

    @property
    def duplicated(self) -> int:
        """Trajectories that moved twice (ended twice, trained twice …)."""
        return len({b.split(":", 1)[0] for b in self.broken})


def audit_ledger(path: str | Path) -> LedgerAudit:
    state: dict[str, str] = {}
    broken: list[str] = []
    trained: dict[str, tuple[int, str]] = {}
    path = Path(path)
    numbered = RunPaths.of(path.parent).lines(path) if os.path.lexists(path) else iter(())
    for number, line in numbered:  # streamed, never through a link
        if line is not None and not line.strip():
            continue
        try:
            entry = json.loads(line) if line is not None else None
            trajectory_id, fate = str(entry["id"]), str(entry["fate"])  # type: ignore[index]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            raise ValueError(f"{path} line {number}: not a ledger entry ({str(exc)[:120]})") from None
        current = state.get(trajectory_id)
        if fate not in _ALLOWED.get(current, set()):
            broken.append(f"{trajectory_id}: {current} → {fate}")
        state[trajectory_id] = fate
        if fate == "trained":
            trained[trajectory_id] = (int(entry.get("batch", -1)), str(entry.get("digest", "")))
    return LedgerAudit(
        started=len(state),
        fates=Counter(state.values()),
        lost=tuple(sorted(t for t, f in state.items() if f == "running")),
        broken=tuple(broken),
        trained=trained,
    )
