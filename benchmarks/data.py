"""`rollart bench data`: what a dataset domain costs next to a built-in one — start-up, memory, the preview.

Arms, side by side in one run (a fresh `datasets` cache for every dataset run, so each pays the conversion a
user's first run pays):
- `startup`: `rollart train` as a user starts it (a fresh process, one RL step, no warm start, 1 validation
  episode, the local math reward) on the built-in `math` domain and on a dataset domain of a 100,000-row Parquet file (GSM8K format),
  alternating, `rounds` of each. Measured: from the process's start to the end of its first trajectory
  (RUN_DIR/timeline.json: t0_unix + the earliest trajectory's end). `dataset_startup_s` = the mean of the
  dataset runs − the mean of the built-in runs (target ≤ 10 s).
- `rss`: one fresh process builds the built-in domain's env factory and resets 200 envs, notes its peak RSS
  (VmHWM), then imports `datasets`, reads the same Parquet file (`domain_env_factory`: read, filter, order)
  and resets 200 of its envs, and notes its peak again. `dataset_rss_mb` = the difference (target ≤ 300 MB).
- `preview`: `rollart data preview` of a 1,000-row JSONL file in a fresh process: its wall time (target ≤ 5 s)
  and its CPU time (user + system), the steadier figure on a shared machine.
- `long row`: the same preview with one more row of `LONG_ROW_MB` MB (a row far over any prompt budget: the
  length filter once tokenised it whole — 256 s and 6.3 GB for 30 MB): `preview_long_row_s` (target ≤ 10 s)
  and `preview_long_row_rss_mb`, the process's peak RSS (target ≤ 1,000 MB).
`--quick`: 10,000 rows, one round.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult

NAMES = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
ITEMS = ("apples", "pens", "coins", "books", "cards", "shells", "stamps", "marbles")
ROWS_FULL, ROWS_QUICK, PREVIEW_ROWS = 100_000, 10_000, 1_000
LONG_ROW_MB = 30
TIMEOUT_S = 600

# both arms alike but for where the task comes from: one turn, scored by the local math reward (the default
# math domain's serverless reward would add Ray Serve's start-up to the built-in arm)
DOMAIN_COMMON = {"max_turns": 1, "max_new_tokens": 8, "max_total_tokens": 128, "pool": "gen_decode",
                 "reward": {"fn": "math", "backend": "local"}}
BUILTIN = {"frozenlake": None, "math": DOMAIN_COMMON}


def gsm_rows(n: int) -> list[dict[str, str]]:
    """`n` GSM8K-format rows (question, answer ending in `#### N`), each question distinct."""
    rows = []
    for i in range(n):
        name, item, a, b = NAMES[i % 10], ITEMS[(i // 10) % 8], i % 4, (i // 80) % 4
        rows.append({"question": f"{name} has {a} {item} (lot {i}) and gets {b}. How many now?",
                     "answer": f"{a} + {b} = {a + b}.\n#### {a + b}"})
    return rows


def dataset_domains(train: Path, validation: Path) -> dict[str, Any]:
    gsm = {"env": "dataset", "system_prompt": "Answer with the number in \\boxed{}.",
           "data": {"train": str(train), "validation": str(validation),
                    "columns": {"prompt": "question", "answer": "answer"}}, **DOMAIN_COMMON}
    return {"frozenlake": None, "math": None, "gsm": gsm}


def run_config(path: Path, domains: dict[str, Any]) -> Path:
    cfg = {"domains": domains, "rollout": {"batch_size": 4, "group_size": 2},
           "train": {"steps": 1, "warm_start": {"steps": 0}}, "eval": {"episodes_per_domain": 1},
           "observability": {"progress": "quiet", "tensorboard": False}}
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def child_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def first_rollout_s(cfg: Path, run_dir: Path, cache: Path) -> float:
    """A fresh `rollart train CFG`: seconds from its start to the end of its first trajectory."""
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "rollart.cli", "train", str(cfg), f"run_dir={run_dir}"],
                         capture_output=True, text=True, timeout=TIMEOUT_S, env=child_env(cache), cwd=cfg.parent)
    if out.returncode != 0:
        raise RuntimeError(f"rollart train {cfg.name} failed ({out.returncode}): {out.stderr[-2000:]}")
    trace = json.loads((run_dir / "timeline.json").read_text())
    ends = [e["ts"] + e.get("dur", 0) for e in trace["traceEvents"] if e.get("name") == "trajectory"]
    if not ends:
        raise RuntimeError(f"rollart train {cfg.name}: no trajectory in {run_dir / 'timeline.json'}")
    return trace["otherData"]["t0_unix"] + min(ends) / 1e6 - t0


RSS_CHILD = """
import json, sys
from pathlib import Path
def peak_mb():
    return next(int(l.split()[1]) / 1024 for l in Path("/proc/self/status").read_text().splitlines()
                if l.startswith("VmHWM:"))
from rollart.config.loader import load_config
from rollart.envs.chat import ChatTokens
from rollart.envs.spec import domain_env_factory
from rollart.models import load_tokenizer, resolve_model_path
out = {}
for key, path, name in (("builtin", sys.argv[1], "math"), ("dataset", sys.argv[2], "gsm")):
    cfg = load_config(path, [])
    dom = cfg.domains[name]
    tok = load_tokenizer(resolve_model_path(cfg.model, cfg.seed), cfg.model.trust_remote_code)
    make = domain_env_factory(name, dom, ChatTokens(tok, dom.system_prompt, dom.thinking), cfg.seed)
    for seed in range(200):
        make().reset(seed)
    out[key] = peak_mb()
print(json.dumps(out))
"""


def rss_mb(builtin: Path, dataset: Path, cache: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(builtin), str(dataset)], capture_output=True,
                         text=True, timeout=TIMEOUT_S, env=child_env(cache), cwd=dataset.parent)
    if out.returncode != 0:
        raise RuntimeError(f"the RSS probe failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def preview_s(cfg: Path, cache: Path) -> tuple[float, float]:
    """A fresh `rollart data preview gsm CFG`: its wall time and its CPU time (user + system), in seconds."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "rollart.cli", "data", "preview", "gsm", str(cfg)],
                         capture_output=True, text=True, timeout=TIMEOUT_S, env=child_env(cache), cwd=cfg.parent)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0 or f"{PREVIEW_ROWS} training rows" not in out.stdout:
        raise RuntimeError(f"rollart data preview failed ({out.returncode}): {out.stdout[-1000:]} {out.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


LONG_CHILD = """
import json, sys
from benchmarks.common import peak_rss_mb
from rollart.cli import main
code = main(["data", "preview", "gsm", sys.argv[1]])
print(json.dumps({"code": code, "peak_mb": peak_rss_mb()}))
"""


def long_row_preview(cfg: Path, cache: Path) -> tuple[float, float]:
    """`rollart data preview` in a fresh process of a file with one `LONG_ROW_MB` MB row: wall s, peak RSS MB."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", LONG_CHILD, str(cfg)], capture_output=True, text=True,
                         timeout=TIMEOUT_S, env=child_env(cache), cwd=Path(__file__).resolve().parent.parent)
    wall = time.perf_counter() - t0
    result = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"code": out.returncode}
    if result["code"] != 0 or "not tokenised" not in out.stdout:
        raise RuntimeError(f"the long-row preview failed ({out.returncode}): {out.stdout[-1000:]} {out.stderr[-2000:]}")
    return wall, result["peak_mb"]


def run(quick: bool = False) -> BenchResult:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, rounds = (ROWS_QUICK, 1) if quick else (ROWS_FULL, 2)
    with tempfile.TemporaryDirectory(prefix="rollart-bench-data-") as tmp_name:
        tmp = Path(tmp_name)
        pq.write_table(pa.Table.from_pylist(gsm_rows(n)), tmp / "train.parquet")
        (tmp / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm_rows(n + 64)[n:]))
        (tmp / "small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm_rows(PREVIEW_ROWS)))
        builtin = run_config(tmp / "builtin.yaml", BUILTIN)
        dataset = run_config(tmp / "dataset.yaml", dataset_domains(tmp / "train.parquet", tmp / "test.jsonl"))
        small = run_config(tmp / "small.yaml", dataset_domains(tmp / "small.jsonl", tmp / "test.jsonl"))
        long_row = {"question": "apple pie " * (LONG_ROW_MB * 2**20 // 10), "answer": "#### 1"}
        (tmp / "long.jsonl").write_text((tmp / "small.jsonl").read_text() + json.dumps(long_row) + "\n")
        long_cfg = run_config(tmp / "long.yaml", dataset_domains(tmp / "long.jsonl", tmp / "test.jsonl"))
        times: dict[str, list[float]] = {"builtin": [], "dataset": []}
        for r in range(rounds):
            for arm, cfg in (("builtin", builtin), ("dataset", dataset)):
                times[arm].append(first_rollout_s(cfg, tmp / f"run-{arm}-{r}", tmp / f"cache-{arm}-{r}"))
        rss = rss_mb(builtin, dataset, tmp / "cache-rss")
        preview, preview_cpu = preview_s(small, tmp / "cache-preview")
        long_s, long_mb = long_row_preview(long_cfg, tmp / "cache-long")
    mean = {arm: statistics.mean(ts) for arm, ts in times.items()}
    rows = [{"arm": f"startup_{arm}", "first_rollout_s": [round(t, 2) for t in ts], "mean_s": round(mean[arm], 2)}
            for arm, ts in times.items()]
    rows.append({"arm": "rss", "builtin_peak_mb": round(rss["builtin"], 1), "dataset_peak_mb": round(rss["dataset"], 1)})
    rows.append({"arm": "preview", "rows": PREVIEW_ROWS, "wall_s": round(preview, 2), "cpu_s": round(preview_cpu, 2)})
    rows.append({"arm": "long row", "row_mb": LONG_ROW_MB, "wall_s": round(long_s, 2), "peak_rss_mb": round(long_mb, 1)})
    ratios = {"dataset_startup_s": round(mean["dataset"] - mean["builtin"], 2),
              "dataset_rss_mb": round(rss["dataset"] - rss["builtin"], 1),
              "preview_1000_rows_s": round(preview, 2), "preview_1000_rows_cpu_s": round(preview_cpu, 2),
              "preview_long_row_s": round(long_s, 2), "preview_long_row_rss_mb": round(long_mb, 1)}
    notes = [f"{n:,}-row Parquet train file; {rounds} round(s) of each start-up arm, alternating; each dataset "
             "run with a fresh datasets cache (the conversion a first run pays)"]
    return BenchResult("data", ratios, rows, notes)
