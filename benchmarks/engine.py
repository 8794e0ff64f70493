"""`rollart bench engine`: the built-in continuous-batching engine against transformers `generate`
(`--engine vllm`: vLLM against both, see engine_vllm.py).

In: `quick` (a smoke version under a minute). Out: a `BenchResult` with
- `speedup_uniform`: engine tokens/s ÷ `generate` tokens/s, batch 16, every request 48 tokens (the
  default `domains.*.max_new_tokens`, the per-turn length this system generates);
- `speedup_mixed`: the same with output lengths spread 8× between shortest and longest (6…48). `generate`
  runs the requests in batches of 16 and pads every sequence to its batch's longest (its tokens/s counts
  only the tokens asked for); the engine keeps 16 rows busy, a new request joining as soon as one leaves;
- full version only, `speedup_uniform_long` / `speedup_mixed_long`: the same at 128 tokens / 16…128, to
  show how the ratios move with length (generate's fixed cost per call weighs less on long outputs);
- `prefill_reduction_multiturn`: prompt tokens prefilled without ÷ with prefix reuse over 8-turn
  conversations (each turn's prompt = the last prompt + the response + a new observation), and
  `wall_ratio_multiturn`, their wall-time ratio;
- `peak_rss_mb_worker`: peak resident memory of one `InferenceWorker` actor after serving a load.

Method: one model (the built-in tiny model, the default config's), one thread for torch in every
process, greedy decoding without EOS stops so every request produces exactly its asked length; the
same prompts and lengths for both systems; rounds alternate which system runs first and each figure is
the median over rounds (the machine is shared: absolute times are noise, ratios measured side by side).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from benchmarks.common import BenchResult
from benchmarks.engine_workloads import (
    BATCH,
    Workload,
    drive,
    engine_turn,
    multiturn,
    random_prompts,
    run_generate,
    spread_lengths,
    timed,
    worker_peak_rss,
)
from rollart.config import ModelConfig
from rollart.inference.builtin_engine import BuiltinEngine
from rollart.models import load_model, load_tokenizer, resolve_model_path

FULL = dict(rounds=5, uniform=(48, 128), mixed=((6, 48), (16, 128)), mixed_requests=64, convs=8, turns=8,
            worker_requests=32)
QUICK = dict(rounds=1, uniform=(48,), mixed=((6, 48),), mixed_requests=32, convs=4, turns=8, worker_requests=8)


def _run_engine(model, tokenizer, work: Workload) -> None:
    """The built-in engine over `work`, all queued at once, BATCH rows in flight."""
    drive(BuiltinEngine(model, tokenizer, max_batch_size=BATCH, prefix_cache_mb=0), work)


def _compare(name: str, model, tokenizer, work: Workload, rounds: int, rows: list[dict[str, Any]]) -> float:
    tokens = sum(n for _, n in work)
    times: dict[str, list[tuple[float, float]]] = {"generate": [], "engine": []}
    for r in range(rounds):
        order = ("generate", "engine") if r % 2 == 0 else ("engine", "generate")
        for system in order:
            if system == "generate":
                times[system].append(timed(lambda: run_generate(model, work)))
            else:
                times[system].append(timed(lambda: _run_engine(model, tokenizer, work)))
    wall = {s: statistics.median(t[0] for t in ts) for s, ts in times.items()}
    cpu = {s: statistics.median(t[1] for t in ts) for s, ts in times.items()}
    for system in times:
        rows.append({"case": name, "system": system, "requests": len(work), "tokens": tokens,
                     "seconds_median": round(wall[system], 3), "tokens_per_s": round(tokens / wall[system], 1),
                     "cpu_s_median": round(cpu[system], 3), "rounds": rounds})
    rows.append({"case": name, "system": "ratio engine/generate", "tokens_per_s": round(wall["generate"] / wall["engine"], 3),
                 "tokens_per_cpu_s": round(cpu["generate"] / cpu["engine"], 3)})
    return wall["generate"] / wall["engine"]


def run(quick: bool, engine: str = "builtin") -> BenchResult:
    """The built-in engine against `generate`; with engine="vllm", vLLM against both (engine_vllm.py)."""
    if engine == "vllm":
        from benchmarks import engine_vllm

        return engine_vllm.run(quick)
    if engine != "builtin":
        raise ValueError(f"--engine {engine!r} is invalid: use builtin or vllm")
    size = QUICK if quick else FULL
    torch.set_num_threads(1)
    path = resolve_model_path(ModelConfig())
    model, tokenizer = load_model(path), load_tokenizer(path)
    vocab = model.config.vocab_size
    rows: list[dict[str, Any]] = []

    warm = [(p, 8) for p in random_prompts(4, 8, 16, vocab, seed=1)]
    run_generate(model, warm)
    _run_engine(model, tokenizer, warm)

    ratios: dict[str, float] = {}
    for length, key in zip(size["uniform"], ("speedup_uniform", "speedup_uniform_long")):
        uniform = [(p, length) for p in random_prompts(BATCH, 32, 32, vocab, seed=2)]
        ratios[key] = round(_compare(f"uniform {length}", model, tokenizer, uniform, size["rounds"], rows), 3)
    n = size["mixed_requests"]
    for (lo, hi), key in zip(size["mixed"], ("speedup_mixed", "speedup_mixed_long")):
        mixed = list(zip(random_prompts(n, 16, 48, vocab, seed=3), spread_lengths(n, lo, hi, seed=4)))
        ratios[key] = round(_compare(f"mixed {lo}-{hi}", model, tokenizer, mixed, size["rounds"], rows), 3)

    def hf_turns(reuse: bool):
        engine = BuiltinEngine(model, tokenizer, max_batch_size=BATCH, prefix_cache_mb=64 if reuse else 0)
        return lambda requests, n: engine_turn(engine, requests, n)

    runs = {True: [], False: []}
    for r in range(size["rounds"]):
        for reuse in ((True, False) if r % 2 == 0 else (False, True)):
            runs[reuse].append(multiturn(hf_turns(reuse), vocab, size["convs"], size["turns"]))
    for reuse, results in runs.items():
        rows.append({"case": "multiturn", "system": "prefix reuse" if reuse else "no reuse",
                     "conversations": size["convs"], "turns": size["turns"],
                     "prompt_tokens": results[0][0], "prefill_tokens": results[0][1],
                     "seconds_median": round(statistics.median(x[2] for x in results), 3),
                     "cpu_s_median": round(statistics.median(x[3] for x in results), 3)})
    prefill_reduction = runs[False][0][1] / runs[True][0][1]
    wall_ratio = statistics.median(x[2] for x in runs[False]) / statistics.median(x[2] for x in runs[True])
    cpu_ratio = statistics.median(x[3] for x in runs[False]) / statistics.median(x[3] for x in runs[True])
    rows.append({"case": "multiturn", "system": "ratio no reuse/reuse", "seconds": round(wall_ratio, 3),
                 "cpu_s": round(cpu_ratio, 3)})

    rss = worker_peak_rss(path, size["worker_requests"])
    rows.append({"case": "worker", "system": "InferenceWorker actor", "requests": size["worker_requests"],
                 "peak_rss_mb": round(rss, 1)})
    return BenchResult(
        bench="engine",
        ratios={
            **ratios,
            "prefill_reduction_multiturn": round(prefill_reduction, 3),
            "wall_ratio_multiturn": round(wall_ratio, 3),
            "peak_rss_mb_worker": round(rss, 1),
        },
        rows=rows,
        notes=[
            f"model: built-in tiny Qwen3 ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params), "
            f"float32, torch threads 1; greedy, no EOS stop; batch {BATCH}",
            "targets: speedup_uniform ≥ 1.2, speedup_mixed ≥ 2, prefill_reduction_multiturn ≥ 3",
        ],
    )
