"""`make bench-smoke` (`python -m benchmarks.smoke [NAME …]`): every registered benchmark, in its smallest form,
run to its end — so a benchmark that stops working is seen in CI, not when someone runs it by hand.

In: the benchmarks of `registry.BENCHMARKS` (or the NAMEs given), each with its `smoke` arguments (the
registry's `Benchmark.smoke`: `--quick` unless it declares a smaller form) and its `smoke_expect` (ratios that
must hold even at that size, e.g. chaos loses no trajectory). Out: one line per benchmark (name, seconds, ok
or why not) and exit 0 only when every one ran to its end.

Each runs as a user runs it — `rollart bench NAME ARGS --json TMP/NAME.json` in a fresh process from this
checkout, under a timeout (`smoke_timeout_s`) — and counts as run to its end when it exits 0 and wrote its
JSON, which names it and holds its ratios (written after `run()` returns, so a benchmark that died or hung
half-way has none), every `smoke_expect` ratio at its value. The JSON goes to a temporary directory, never
over the committed benchmarks/*.json, and the committed results (benchmarks/*.json, *.md, *.png) are checked
to be byte-for-byte unchanged afterwards. A benchmark added to the registry joins without an edit here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.registry import BENCHMARKS, Benchmark

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ("*.json", "*.md", "*.png")  # the results kept in benchmarks/ (and gpu/)


def command(bench: Benchmark, json_path: Path) -> list[str]:
    return [sys.executable, "-m", "rollart.cli", "bench", bench.name, *bench.smoke, "--json", str(json_path)]


def verdict(bench: Benchmark, returncode: int | None, json_path: Path) -> str:
    """'' when the benchmark ran to its end, else why not."""
    if returncode is None:
        return f"did not finish within {bench.smoke_timeout_s} s"
    if returncode != 0:
        return f"exited {returncode}"
    try:
        payload: Any = json.loads(json_path.read_text())
    except (OSError, ValueError) as exc:
        return f"wrote no readable JSON ({exc})"
    if not isinstance(payload, dict) or payload.get("bench") != bench.name:
        return f"its JSON does not name it ({str(payload)[:80]})"
    ratios = payload.get("ratios")
    if not isinstance(ratios, dict) or not ratios:
        return "its JSON holds no ratios"
    for name, want in bench.smoke_expect.items():
        got = ratios.get(name)
        if not isinstance(got, (int, float)) or not math.isclose(got, want):
            return f"ratio {name} = {got}, expected {want}"
    return ""


def committed_results() -> dict[str, str]:
    """sha256 of each committed result file under benchmarks/."""
    here = ROOT / "benchmarks"
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
            for pattern in COMMITTED for p in sorted(here.rglob(pattern))}


def run_one(bench: Benchmark, out: Path) -> tuple[str, float]:
    json_path = out / f"{bench.name}.json"
    log = out / f"{bench.name}.log"
    start = time.monotonic()
    with log.open("w") as sink:
        proc = subprocess.Popen(command(bench, json_path), cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        try:
            returncode: int | None = proc.wait(timeout=bench.smoke_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # its Ray and workers with it
            proc.wait(timeout=60)
            returncode = None
    why = verdict(bench, returncode, json_path)
    if why:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(f"    | {line}" for line in tail), flush=True)
    return why, time.monotonic() - start


def main(argv: list[str]) -> int:
    chosen = [b for b in BENCHMARKS if not argv or b.name in argv]
    unknown = set(argv) - {b.name for b in BENCHMARKS}
    if unknown:
        print(f"bench-smoke: unknown benchmark(s) {sorted(unknown)}; registered: "
              f"{', '.join(b.name for b in BENCHMARKS)}", file=sys.stderr)
        return 2
    before = committed_results()
    failed: list[str] = []
    total = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rollart-bench-smoke-") as tmp:
        print(f"bench-smoke: {len(chosen)} benchmarks, JSON and logs in {tmp}", flush=True)
        for bench in chosen:
            print(f"  {bench.name:<10} rollart bench {bench.name} {' '.join(bench.smoke)} …", flush=True)
            why, seconds = run_one(bench, Path(tmp))
            print(f"  {bench.name:<10} {seconds:6.1f} s  {'ok' if not why else 'FAILED: ' + why}", flush=True)
            if why:
                failed.append(f"{bench.name}: {why}")
    print(f"bench-smoke: {len(chosen) - len(failed)} of {len(chosen)} ran to their end in "
          f"{time.monotonic() - total:.0f} s", flush=True)
    after = committed_results()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        failed.append(f"committed results changed: {', '.join(changed)}")
    for line in failed:
        print(f"bench-smoke: FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
