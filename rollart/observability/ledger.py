"""Reading a run's ledger file (RUN_DIR/ledger.jsonl): did every trajectory end exactly once?

In: the ledger file a run wrote (one JSON object per move: {"time", "id", "group", "domain", "fate",
"reason", "digest", "batch"}; see `rollart.run_dir`). Out: `audit_ledger(path)` → a `LedgerAudit`: how many
trajectories started, how many ended how, which were lost (started, never ended) or moved twice (ended
twice, trained twice), and the trained trajectories with the batch and the digest of what was trained.

The moves a trajectory may make: started (running) → ready (scored, in the buffer) → trained, or → aborted
| failed | stale; ready → stale (dropped from the buffer). A resumed run starts again the trajectories that
were running at its checkpoint (the file was cut back there): running → running is a restart, not a
duplicate. Any other move breaks "every trajectory ends exactly once" and is listed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_ALLOWED = {
    None: {"running"},
    "running": {"running", "ready", "aborted", "failed", "stale"},
    "ready": {"trained", "stale"},
}


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
    text = Path(path).read_text() if Path(path).is_file() else ""
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        tid, fate = entry["id"], entry["fate"]
        current = state.get(tid)
        if fate not in _ALLOWED.get(current, set()):
            broken.append(f"{tid}: {current} → {fate}")
        state[tid] = fate
        if fate == "trained":
            trained[tid] = (int(entry.get("batch", -1)), str(entry.get("digest", "")))
    return LedgerAudit(
        started=len(state),
        fates=Counter(state.values()),
        lost=tuple(sorted(t for t, f in state.items() if f == "running")),
        broken=tuple(broken),
        trained=trained,
    )
