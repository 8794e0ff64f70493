"""rollart.base — the foundation every other package may use: plain Python over `rollart.types`, nothing else.

- `codec`: records of `rollart.types` as plain JSON values and back (what a run writes to disk; no pickle).
- `run_dir`: the run-directory contract (every artefact named once; writes that never follow a link).
- `background`: waiting on one thing while a background task may fail (`unless_fails`).
- `background_start`: starting one part of a job on a background thread (`BackgroundStart`).
- `interrupts`: Ctrl-C that stops a job within seconds at any phase (`run`).
- `shards`: the rows of a tensor each of W ranks holds (`row_range`: FSDP2's dim-0 chunks).
- `proxy_shard`: the LLM-proxy shard a trajectory's turns go to (`proxy_shard`: a stable hash of its group).

It imports nothing of rollart but `rollart.types` (an import-linter contract keeps it so).
"""
