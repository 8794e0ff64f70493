"""The run's ledger file: moves are buffered and reach the OS at most `FLUSH_S` after they were written, all of
them by `size()` (which a checkpoint records) and `close()`; a resume cuts the file back to a checkpoint's size."""

from __future__ import annotations

from rollart.base.run_dir import RunPaths
from rollart.observability import ledger
from rollart.observability.ledger import LedgerFile, audit_ledger


def move(i: int, fate: str) -> dict:
    return {"time": float(i), "id": f"g/{i}", "group": "g", "domain": "d", "fate": fate}


def test_moves_reach_the_file_within_the_flush_interval_and_all_at_a_checkpoint(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(ledger.time, "monotonic", lambda: clock[0])
    paths = RunPaths.of(tmp_path)
    path = paths.ledger
    sink = LedgerFile(paths)
    sink.write(move(0, "running"))
    sink.write(move(1, "running"))
    assert path.read_bytes() == b""  # buffered: one write to the OS per interval, not per move
    clock[0] += ledger.FLUSH_S
    sink.write(move(0, "ready"))
    assert path.read_text().count("\n") == 3  # the interval passed: every move so far is in the file
    sink.write(move(1, "failed"))
    covered = sink.size()  # a checkpoint: everything, durable
    assert covered == path.stat().st_size and path.read_text().count("\n") == 4
    sink.write(move(0, "trained"))
    sink.close()
    audit = audit_ledger(path)
    assert audit.started == 2 and audit.fates["trained"] == 1 and audit.fates["failed"] == 1 and not audit.broken
    resumed = LedgerFile(paths, keep_bytes=covered)  # what came after the checkpoint never happened
    resumed.close()
    assert path.stat().st_size == covered and audit_ledger(path).fates["ready"] == 1
