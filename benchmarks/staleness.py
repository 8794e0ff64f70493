"""`rollart bench staleness`: how the validation score depends on α, the staleness mode and the importance
weights (a study like the paper's Fig. 10), over several seeds — resumable, one arm × seed per piece.

Arms: `sync` (α = 0, `barrier=batch`: the paper's Sync+) and α ∈ {1, 2, 4, 8} × `rollout.staleness`
{trajectory, token} × the behaviour correction `train.correction` {token_tis (`iw`), none (`noiw`)}, e.g.
`a4-token-iw`. At α = 0 nothing is stale, so mode and weights make no difference there and one sync arm stands for all four.
Beside the grid, `a1-trajectory-iw-adaptive` and `a2-trajectory-iw-adaptive`: those arms with the adaptive batch
(`rollout.min_batch_fraction` = `ADAPTIVE_FLOOR`), to show what it does to the scores; each run records how many of
its batches were partial (`batches_partial`) and the mean share of a batch it trained (`batch_fraction_mean`).
Seeds 0, 1, 2 (`seed=` of the run: rollout sampling, env seeds, mini-batch splits).

The job: the default job (`make demo`) shortened to `STEPS` RL steps with an evaluation every `EVAL_EVERY`
steps on `EPISODES` greedy episodes per domain. Every arm and seed starts RL from one warm-started base
(the default job's 100-step warm start, built once in this process by `rollart.job.driver.warm_start_checkpoint`
and cached under the work directory): the tiny model needs its warm start, and a shared start removes the
warm start's variance and time from the comparison.

Per piece (`--piece ARM/SEED`, or `--piece next` for the first missing one in priority order) the run goes
through the real CLI in a subprocess while holding the study's lock (`--lock`, below), and its record — the
eval curve as (step, seconds since RL start, score) and the staleness actually trained — is appended to
the `--json` file, whose summary (rows, ratios, notes, `missing`) and PNG curves (`<json stem>_steps.png`,
`<json stem>_wall.png`, beside it) are rebuilt from every record so far. `--report` only rebuilds them.
`--quick`: sync and a4-token-iw, one seed, 20 steps — a smoke run under 10 minutes, into `--json` if given.
`--steps N`: N RL steps per run instead (the smoke run of `make bench-smoke`).

The lock exists so that a piece, a 10–30 minute training run whose wall-time curve is part of the result,
never shares the machine with another heavy job it knows of, and so that two pieces never build the shared
base at once. By default it is `heavy.lock` in the study's work directory (`runs/bench-staleness/`, the
run's own output): every piece of every study in that directory queues on it. `--lock PATH` joins another
lock instead — e.g. a machine-wide one that other heavy jobs take with `flock PATH …` — and `--lock ''`
takes none. The default is not a fixed name under `/tmp`: in a world-writable directory another user can
plant that name first (a symbolic link the open would follow, a FIFO that blocks it, a file they hold
forever). Whatever the path, the lock file is opened without following a symbolic link and refused unless
it is a regular file.

Per arm (over seeds): score vs steps and vs wall time (mean ± standard deviation), final score,
time-to-score (wall seconds since RL start and steps until the seed-mean curve first reaches the target:
90% of sync's mean final score), mean and max staleness of the trained trajectories (`buffer/staleness_*`,
in the arm's own mode) and of the trained tokens (`train/version_lag_*`), and how many seeds collapsed (an
evaluation after the start scored below half the start score: a seed mean hides one run that fell apart). Ratios:
`final_score_alpha4_token_is_vs_sync` (a4-token-iw final ÷ sync final) and `time_to_score_alpha1_vs_sync`
(a1-trajectory-iw time-to-score ÷ sync's; < 1 = α = 1 is faster). Wall times on a shared machine are noisy:
prefer the score-vs-steps verdict.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from benchmarks.common import BenchResult, machine_info
from rollart.observability import read_metrics
from rollart.base.run_dir import RunPaths

STEPS, EVAL_EVERY, EPISODES = 150, 25, 32
QUICK_STEPS, QUICK_EVAL_EVERY, QUICK_EPISODES = 20, 10, 16
SEEDS = (0, 1, 2)
ALPHAS = (1, 2, 4, 8)
ADAPTIVE_ALPHAS, ADAPTIVE_FLOOR = (1, 2), 0.5  # arms with the adaptive batch (`rollout.min_batch_fraction`)
TARGET_FRACTION = 0.9  # time-to-score target: this fraction of sync's mean final score
COLLAPSE_FRACTION = 0.5  # a seed collapsed when an evaluation after the start falls below this × its start
PIECE_TIMEOUT_S = 1800
LOCK_WAIT_S = 4 * 3600


def arm_overrides() -> dict[str, list[str]]:
    arms = {"sync": ["rollout.alpha=0", "rollout.barrier=batch"]}
    for alpha in ALPHAS:
        for mode in ("trajectory", "token"):
            for iw in (True, False):
                arms[f"a{alpha}-{mode}-{'iw' if iw else 'noiw'}"] = [
                    f"rollout.alpha={alpha}", "rollout.barrier=none", f"rollout.staleness={mode}",
                    f"train.correction={'token_tis' if iw else 'none'}",
                ]
    for alpha in ADAPTIVE_ALPHAS:  # the adaptive batch beside the same arm without it (issue: its score cost)
        arms[f"a{alpha}-trajectory-iw-adaptive"] = [*arms[f"a{alpha}-trajectory-iw"],
                                                    f"rollout.min_batch_fraction={ADAPTIVE_FLOOR}"]
    return arms


ARMS = arm_overrides()
# What a partial study needs first: the two ratios' arms, then the paper's α = 2 claim, then the rest.
PRIORITY = ["sync", "a1-trajectory-iw", "a4-token-iw", "a2-trajectory-iw", "a4-token-noiw", "a8-token-iw",
            "a1-token-iw", "a2-token-iw", "a4-trajectory-iw", "a8-trajectory-iw"]
PRIORITY += [a for a in ARMS if a not in PRIORITY]
QUICK_ARMS = ("sync", "a4-token-iw")


def run(quick: bool, piece: str | None = None, report: bool = False, json_path: str | None = None,
        workdir: str = "runs/bench-staleness", lock: str | None = None, steps: int | None = None) -> BenchResult:
    """`--quick`, one `--piece`, or `--report` (module docstring); returns the study's summary so far.
    `lock`: None = `heavy.lock` in `workdir`, "" = none, else that file."""
    work = Path(workdir)
    if lock is None:
        work.mkdir(parents=True, exist_ok=True)
        lock = str(work / "heavy.lock")
    if quick:
        records = [_run_piece(arm, 0, work, lock, quick=True, steps=steps) for arm in QUICK_ARMS]
        return summarize(records, quick=True)
    if json_path is None:
        raise ValueError("rollart bench staleness needs --json PATH (the study's file: pieces are appended to it)")
    path = Path(json_path)
    records = load_records(path)
    if piece is not None:
        arm, seed = _choose_piece(piece, records)
        if arm is None:
            print("every arm × seed of the study is done; nothing to run")
        else:
            print(f"staleness piece {arm} seed {seed} ({len(records)} of {len(ARMS) * len(SEEDS)} done)", flush=True)
            records.append(_run_piece(arm, seed, work, lock, quick=False, steps=steps))
    elif not report:
        raise ValueError("rollart bench staleness: give --piece ARM/SEED|next (run one piece), --report, or --quick")
    result = summarize(records, quick=False)
    plot(result, path)
    return result


# --- one piece -------------------------------------------------------------------------------------


def _choose_piece(piece: str, records: list[dict[str, Any]]) -> tuple[str | None, int]:
    done = {(r["arm"], r["seed"]) for r in records}
    if piece == "next":
        for arm in PRIORITY:  # arm by arm, every seed: a partial study has whole arms (mean ± spread)
            for seed in SEEDS:
                if (arm, seed) not in done:
                    return arm, seed
        return None, -1
    arm, _, seed_text = piece.partition("/")
    if arm not in ARMS or not seed_text.isdigit():
        raise ValueError(f"--piece {piece!r}: give ARM/SEED (ARM one of {', '.join(ARMS)}; SEED an integer) or 'next'")
    if (arm, int(seed_text)) in done:
        raise ValueError(f"--piece {piece}: already in the study file; delete its record to run it again")
    return arm, int(seed_text)


def _run_piece(arm: str, seed: int, work: Path, lock: str, quick: bool, steps: int | None = None) -> dict[str, Any]:
    default, every, episodes = (QUICK_STEPS, QUICK_EVAL_EVERY, QUICK_EPISODES) if quick else (STEPS, EVAL_EVERY, EPISODES)
    steps = steps or default
    every = min(every, steps)
    with heavy_lock(lock):
        base = ensure_base(work)
        run_dir = work / ("quick" if quick else "study") / f"{arm}-seed{seed}"
        if run_dir.exists():  # a piece that died half-way starts over (its record was never written)
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "rollart.cli", "train", f"run_dir={run_dir}", f"seed={seed}",
               f"model.path={base}", "train.warm_start.steps=0", f"train.steps={steps}", f"eval.every={every}",
               f"eval.episodes_per_domain={episodes}", "observability.progress=plain",
               "observability.tensorboard=false", *ARMS[arm]]
        started = time.time()
        load_before = os.getloadavg()[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIECE_TIMEOUT_S,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"piece {arm}/seed {seed} failed ({proc.returncode}); its run is in {run_dir}:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    record = read_run(run_dir)
    return {"arm": arm, "seed": seed, "steps": steps, **record, "piece_wall_s": round(time.time() - started, 1),
            "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "overrides": ARMS[arm]}


def read_run(run_dir: Path) -> dict[str, Any]:
    """A finished run's eval curve (step, seconds since the first evaluation = RL start, mean score) and the
    staleness it trained on."""
    metrics = RunPaths.of(run_dir).metrics
    records = read_metrics(metrics)
    # eval times from the eval lines themselves (read_metrics merges a step's lines, and its wall_s with them)
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    evals = [(int(r["step"]), float(r["wall_s"]), float(r["eval/mean"])) for r in lines if "eval/mean" in r]
    if not evals:
        raise RuntimeError(f"{metrics}: no evaluation in it")
    t0 = evals[0][1]
    steps = [r for r in records if "buffer/staleness_max" in r]
    trained = [r for r in records if "train/version_lag_max" in r]
    return {
        "curve": [[s, round(w - t0, 2), round(v, 4)] for s, w, v in evals],
        "final": round(evals[-1][2], 4),
        "staleness_mean": round(statistics.fmean(r["buffer/staleness_mean"] for r in steps), 4),
        "staleness_max": max(int(r["buffer/staleness_max"]) for r in steps),
        "token_lag_mean": round(statistics.fmean(r["train/version_lag_mean"] for r in trained), 4),
        "token_lag_max": max(int(r["train/version_lag_max"]) for r in trained),
        # how often the adaptive batch fired (a counter: its last value) and the mean share of a batch trained
        "batches_partial": int(max((r.get("rollout/batches_partial", 0) for r in steps), default=0)),
        "batch_fraction_mean": round(statistics.fmean(r.get("rollout/batch_fraction", 1.0) for r in steps), 4),
    }


def open_lock_file(path: str) -> int:
    """A file descriptor for the lock file at `path`, created (0600) if missing. Never follows a symbolic
    link (O_NOFOLLOW) and never blocks on a FIFO (O_NONBLOCK); anything but a regular file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        kind = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
        raise ValueError(f"--lock {path}: {kind}; give a regular file, or '' for no lock") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"--lock {path}: not a regular file; give a regular file, or '' for no lock")
    return fd


@contextmanager
def heavy_lock(path: str) -> Iterator[None]:
    """Hold the lock (flock on `path`; "" = no lock) for one piece, saying while it waits.

    A blocking flock (in a thread, so the wait can be bounded and reported): it queues fairly with other
    `flock` users, where polling with LOCK_NB would lose every race to them."""
    if not path:
        yield
        return
    fd = open_lock_file(path)
    with os.fdopen(fd, "rb") as f:
        acquired = threading.Event()
        threading.Thread(target=lambda: (fcntl.flock(f, fcntl.LOCK_EX), acquired.set()), daemon=True).start()
        start = time.time()
        while not acquired.wait(60):
            if time.time() - start > LOCK_WAIT_S:
                raise TimeoutError(f"{path} stayed held by other heavy jobs for {LOCK_WAIT_S / 3600:.0f} h")
            print(f"waiting for {path} (held by another heavy job) for {(time.time() - start) / 60:.0f} min …",
                  flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_base(work: Path) -> Path:
    """The study's warm-started base: the default job's warm start, built once (in this process) and cached."""
    from rollart.config.loader import load_config
    from rollart.job.driver import warm_start_checkpoint

    cfg = load_config(None, [])
    key = hashlib.sha256(f"{cfg.model.model_dump_json()}|{cfg.train.warm_start.model_dump_json()}|"
                         f"{sorted(cfg.domains)}|{cfg.seed}".encode()).hexdigest()[:10]
    base = work / f"base-{key}"
    if not (base / "model.safetensors").is_file():
        tmp = base.with_name(base.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"building the warm-started base ({cfg.warm_start_steps()} steps) in {base} …", flush=True)
        warm_start_checkpoint(cfg, tmp)
        tmp.rename(base)
    return base.resolve()


# --- the study's summary ------------------------------------------------------------------------------


def load_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    if data.get("bench") != "staleness" or "runs" not in data:
        raise ValueError(f"{path} is not a staleness study file (no bench=staleness with runs)")
    return list(data["runs"])


def summarize(records: list[dict[str, Any]], quick: bool) -> BenchResult:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_arm.setdefault(r["arm"], []).append(r)
    rows = [_arm_row(arm, sorted(rs, key=lambda r: r["seed"])) for arm, rs in by_arm.items()]
    rows.sort(key=lambda row: PRIORITY.index(row["arm"]) if row["arm"] in PRIORITY else len(PRIORITY))
    rows_by = {row["arm"]: row for row in rows}
    notes = [f"{'quick: ' if quick else ''}default job shortened to {records[0]['steps'] if records else STEPS} RL "
             "steps from one shared warm-started base; eval = greedy mean score over frozenlake and math",
             "wall times were measured on a shared 2-core machine while other jobs ran: prefer score vs steps"]
    ratios: dict[str, float] = {}
    if "sync" in rows_by:
        target = round(TARGET_FRACTION * rows_by["sync"]["final_mean"], 4)
        notes.append(f"time-to-score target: {TARGET_FRACTION:.0%} of sync's mean final score = {target}")
        for row in rows:
            row["target"] = target
            row["time_to_score_s"], row["steps_to_score"] = _time_to_score(row, target)
        if "a4-token-iw" in rows_by and rows_by["sync"]["final_mean"] > 0:
            ratios["final_score_alpha4_token_is_vs_sync"] = round(
                rows_by["a4-token-iw"]["final_mean"] / rows_by["sync"]["final_mean"], 4)
        sync_t = rows_by["sync"]["time_to_score_s"]
        if "a1-trajectory-iw" in rows_by and sync_t and rows_by["a1-trajectory-iw"]["time_to_score_s"] is not None:
            ratios["time_to_score_alpha1_vs_sync"] = round(rows_by["a1-trajectory-iw"]["time_to_score_s"] / sync_t, 4)
    result = BenchResult("staleness", ratios, rows, notes)
    done = {(r["arm"], r["seed"]) for r in records}
    result.data = {
        "runs": records,
        "missing": [] if quick else [f"{a}/{s}" for a in PRIORITY for s in SEEDS if (a, s) not in done],
        "study": {"steps": records[0]["steps"] if records else QUICK_STEPS if quick else STEPS,
                  "eval_every": QUICK_EVAL_EVERY if quick else EVAL_EVERY,
                  "episodes_per_domain": QUICK_EPISODES if quick else EPISODES, "seeds": list(SEEDS),
                  "arms": ARMS, "machine_at_summary": machine_info()},
    }
    return result


def _arm_row(arm: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± std over seeds at every eval step the seeds share."""
    steps = sorted(set.intersection(*({p[0] for p in r["curve"]} for r in runs)))
    at = [{p[0]: p for p in r["curve"]} for r in runs]
    scores = [[a[s][2] for a in at] for s in steps]
    walls = [[a[s][1] for a in at] for s in steps]
    finals = [r["final"] for r in runs]
    return {
        "arm": arm, "seeds": [r["seed"] for r in runs],
        "final_mean": round(statistics.fmean(finals), 4), "final_std": round(_std(finals), 4),
        "first_mean": round(statistics.fmean(r["curve"][0][2] for r in runs), 4),
        "curve_steps": steps,
        "curve_mean": [round(statistics.fmean(v), 4) for v in scores],
        "curve_std": [round(_std(v), 4) for v in scores],
        "curve_wall_mean": [round(statistics.fmean(v), 1) for v in walls],
        "rl_wall_s_mean": round(statistics.fmean(r["curve"][-1][1] for r in runs), 1),
        "staleness_mean": round(statistics.fmean(r["staleness_mean"] for r in runs), 3),
        "staleness_max": max(r["staleness_max"] for r in runs),
        "token_lag_mean": round(statistics.fmean(r["token_lag_mean"] for r in runs), 3),
        "token_lag_max": max(r["token_lag_max"] for r in runs),
        "collapsed_seeds": [r["seed"] for r in runs if collapsed(r["curve"])],
        # (records from before these fields count as full batches: the adaptive batch did not exist then)
        "batches_partial_mean": round(statistics.fmean(r.get("batches_partial", 0) for r in runs), 1),
        "batch_fraction_mean": round(statistics.fmean(r.get("batch_fraction_mean", 1.0) for r in runs), 4),
    }


def collapsed(curve: list[list[float]]) -> bool:
    """Whether a run's eval curve [(step, wall, score), …] fell below half its start score after the start."""
    start = curve[0][2]
    return any(score < COLLAPSE_FRACTION * start for _, _, score in curve[1:])


def _time_to_score(row: dict[str, Any], target: float) -> tuple[float | None, int | None]:
    for step, score, wall in zip(row["curve_steps"], row["curve_mean"], row["curve_wall_mean"]):
        if score >= target:
            return wall, step
    return None, None


def _std(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


# --- curves ------------------------------------------------------------------------------------------


def plot(result: BenchResult, json_path: Path) -> list[Path]:
    """Two PNGs beside the JSON: score vs steps and vs wall time, one panel per (mode, weights), every α."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r["arm"]: r for r in result.rows}
    out = []
    for axis, suffix in (("curve_steps", "steps"), ("curve_wall_mean", "wall")):
        fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True, sharey=True)
        for ax, (mode, iw) in zip(axes.flat, [("trajectory", "iw"), ("trajectory", "noiw"), ("token", "iw"), ("token", "noiw")]):
            for name, color in [("sync", "black")] + [(f"a{a}-{mode}-{iw}", c) for a, c in zip(ALPHAS, ("tab:blue", "tab:green", "tab:orange", "tab:red"))]:
                if name not in rows:
                    continue
                r = rows[name]
                x = r[axis]
                lo = [m - s for m, s in zip(r["curve_mean"], r["curve_std"])]
                hi = [m + s for m, s in zip(r["curve_mean"], r["curve_std"])]
                label = "Sync (α=0)" if name == "sync" else f"α={name.split('-')[0][1:]}"
                ax.plot(x, r["curve_mean"], color=color, label=f"{label} (n={len(r['seeds'])})")
                ax.fill_between(x, lo, hi, color=color, alpha=0.15)
            ax.set_title(f"staleness={mode}, importance weights {'on' if iw == 'iw' else 'off'}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
        for ax in axes[1]:
            ax.set_xlabel("RL step" if suffix == "steps" else "seconds since RL start (shared machine: noisy)")
        for ax in axes[:, 0]:
            ax.set_ylabel("validation score (mean ± std over seeds)")
        fig.suptitle("rollart bench staleness: validation score vs " + ("steps" if suffix == "steps" else "wall time"))
        fig.tight_layout()
        path = json_path.with_name(f"{json_path.stem}_{suffix}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        out.append(path)
    return out
