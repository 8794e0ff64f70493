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

import copy
import os
import statistics
import time
from typing import Any

import torch

from rollart.bench.common import BenchResult
from rollart.config import InferenceConfig, ModelConfig, RunConfig
from rollart.inference.hf_engine import HFEngine
from rollart.models import load_model, load_tokenizer, resolve_model_path
from rollart.types import GenerationRequest, SamplingParams

BATCH = 16
FULL = dict(rounds=5, uniform=(48, 128), mixed=((6, 48), (16, 128)), mixed_requests=64, convs=8, turns=8,
            worker_requests=32)
QUICK = dict(rounds=1, uniform=(48,), mixed=((6, 48),), mixed_requests=32, convs=4, turns=8, worker_requests=8)

Workload = list[tuple[tuple[int, ...], int]]  # (prompt token ids, output length)


def _prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [tuple(torch.randint(3, vocab, (k,), generator=g).tolist()) for k in lengths]


def _spread_lengths(n: int, shortest: int, longest: int, seed: int) -> list[int]:
    """n output lengths from shortest to longest (evenly spaced, shuffled): spread exactly longest/shortest."""
    step = (longest - shortest) / max(1, n - 1)
    lengths = [round(shortest + i * step) for i in range(n)]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [lengths[i] for i in order]


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for fn(); CPU time is what a loaded machine disturbs least."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _run_generate(model, work: Workload) -> None:
    """`generate` over `work` in batches of BATCH, left-padded, each batch to its longest."""
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id, gc.do_sample = None, False
    pad = gc.pad_token_id or 0
    for i in range(0, len(work), BATCH):
        chunk = work[i : i + BATCH]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p, _ in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
        gc.max_new_tokens = max(n for _, n in chunk)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)


def _run_engine(model, tokenizer, work: Workload) -> None:
    """The built-in engine over `work`, all queued at once, BATCH rows in flight."""
    drive(HFEngine(model, tokenizer, max_batch_size=BATCH, prefix_cache_mb=0), work)


def drive(engine, work: Workload) -> None:
    """Any `InferenceEngine` over `work`, all queued at once; checks every asked-for token came out."""
    for i, (prompt, n) in enumerate(work):
        engine.add(GenerationRequest(f"r{i}", f"t{i}", "bench", prompt,
                                     SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)))
    done = 0
    while engine.has_work():
        done += sum(len(r.token_ids) for r in engine.step())
    if done != sum(n for _, n in work):
        raise RuntimeError(f"{type(engine).__name__} produced {done} tokens, {sum(n for _, n in work)} were asked for")


def _compare(name: str, model, tokenizer, work: Workload, rounds: int, rows: list[dict[str, Any]]) -> float:
    tokens = sum(n for _, n in work)
    times: dict[str, list[tuple[float, float]]] = {"generate": [], "engine": []}
    for r in range(rounds):
        order = ("generate", "engine") if r % 2 == 0 else ("engine", "generate")
        for system in order:
            if system == "generate":
                times[system].append(_timed(lambda: _run_generate(model, work)))
            else:
                times[system].append(_timed(lambda: _run_engine(model, tokenizer, work)))
    wall = {s: statistics.median(t[0] for t in ts) for s, ts in times.items()}
    cpu = {s: statistics.median(t[1] for t in ts) for s, ts in times.items()}
    for system in times:
        rows.append({"case": name, "system": system, "requests": len(work), "tokens": tokens,
                     "seconds_median": round(wall[system], 3), "tokens_per_s": round(tokens / wall[system], 1),
                     "cpu_s_median": round(cpu[system], 3), "rounds": rounds})
    rows.append({"case": name, "system": "ratio engine/generate", "tokens_per_s": round(wall["generate"] / wall["engine"], 3),
                 "tokens_per_cpu_s": round(cpu["generate"] / cpu["engine"], 3)})
    return wall["generate"] / wall["engine"]


def _engine_turn(engine, requests: list[tuple[str, tuple[int, ...]]], new_tokens: int) -> dict[str, tuple]:
    """One turn of every conversation through an engine: {conversation: (tokens, prompt, prefilled)}."""
    for cid, prompt in requests:
        engine.add(GenerationRequest(f"{cid}:{len(prompt)}", cid, "bench", prompt,
                                     SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)))
    out = {}
    while engine.has_work():
        for r in engine.step():
            out[r.trajectory_id] = (r.token_ids, r.prompt_tokens, r.prefill_tokens)
    return out


def _generate_turn(model, requests: list[tuple[str, tuple[int, ...]]], new_tokens: int) -> dict[str, tuple]:
    """The same turn through `generate` (one left-padded batch, every prompt prefilled in full)."""
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id, gc.do_sample, gc.max_new_tokens = None, False, new_tokens
    pad = gc.pad_token_id or 0
    width = max(len(p) for _, p in requests)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for _, p in requests])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p in requests])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
    return {cid: (tuple(out[i, width:].tolist()), len(p), len(p)) for i, (cid, p) in enumerate(requests)}


def _multiturn(run_turn, vocab: int, convs: int, turns: int) -> tuple[int, int, float, float]:
    """(prompt tokens, prefilled tokens, wall s, CPU s) for `convs` concurrent `turns`-turn conversations:
    each turn's prompt is the last prompt + the 16-token response + a 24-token observation."""
    contexts = {f"conv{c}": p for c, p in enumerate(_prompts(convs, 64, 64, vocab, seed=11))}
    observations = [_prompts(turns, 24, 24, vocab, seed=100 + c) for c in range(convs)]
    prompt_total = prefill_total = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for t in range(turns):
        for cid, (tokens, prompt, prefilled) in run_turn(sorted(contexts.items()), 16).items():
            prompt_total += prompt
            prefill_total += prefilled
            if t + 1 < turns:
                contexts[cid] = contexts[cid] + tuple(tokens) + observations[int(cid[4:])][t + 1]
    return prompt_total, prefill_total, time.perf_counter() - wall, time.process_time() - cpu


def _worker_peak_rss(path, requests: int, engine: str = "builtin") -> float:
    """Peak RSS (MiB) of one InferenceWorker actor (`inference.engine=engine`) on its own embedded Ray after
    `requests` requests."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from rollart.inference.worker import InferenceWorker

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, resources={"pool_gen_decode": 1}, include_dashboard=False,
                 object_store_memory=128 * 2**20, log_to_driver=False, namespace="rollart-bench-engine")
    try:
        cfg = RunConfig(model=ModelConfig(path=str(path)), inference=InferenceConfig(num_threads=1, engine=engine))
        worker = ray.remote(InferenceWorker).options(num_cpus=0, resources={"pool_gen_decode": 1}).remote(
            cfg, "gen_decode", 0)
        ray.get(worker.ready.remote(), timeout=120)
        prompts = _prompts(requests, 32, 96, 1000, seed=5)
        refs = [worker.generate.remote(GenerationRequest(f"w{i}", f"w{i}", "bench", p,
                                                         SamplingParams(max_new_tokens=64, seed=i, ignore_eos=True)))
                for i, p in enumerate(prompts)]
        ray.get(refs, timeout=300)
        rss = ray.get(worker.stats.remote(), timeout=30)["peak_rss_mb"]
        ray.get(worker.shutdown.remote(), timeout=30)
        ray.kill(worker)
        return rss
    finally:
        if started:
            ray.shutdown()


def run(quick: bool, engine: str = "builtin") -> BenchResult:
    """The built-in engine against `generate`; with engine="vllm", vLLM against both (engine_vllm.py)."""
    if engine == "vllm":
        from rollart.bench import engine_vllm

        return engine_vllm.run(quick)
    if engine != "builtin":
        raise ValueError(f"--engine {engine!r} is invalid: use builtin or vllm")
    size = QUICK if quick else FULL
    torch.set_num_threads(1)
    path = resolve_model_path(ModelConfig())
    model, tokenizer = load_model(path), load_tokenizer(path)
    vocab = model.config.vocab_size
    rows: list[dict[str, Any]] = []

    warm = [(p, 8) for p in _prompts(4, 8, 16, vocab, seed=1)]
    _run_generate(model, warm)
    _run_engine(model, tokenizer, warm)

    ratios: dict[str, float] = {}
    for length, key in zip(size["uniform"], ("speedup_uniform", "speedup_uniform_long")):
        uniform = [(p, length) for p in _prompts(BATCH, 32, 32, vocab, seed=2)]
        ratios[key] = round(_compare(f"uniform {length}", model, tokenizer, uniform, size["rounds"], rows), 3)
    n = size["mixed_requests"]
    for (lo, hi), key in zip(size["mixed"], ("speedup_mixed", "speedup_mixed_long")):
        mixed = list(zip(_prompts(n, 16, 48, vocab, seed=3), _spread_lengths(n, lo, hi, seed=4)))
        ratios[key] = round(_compare(f"mixed {lo}-{hi}", model, tokenizer, mixed, size["rounds"], rows), 3)

    def hf_turns(reuse: bool):
        engine = HFEngine(model, tokenizer, max_batch_size=BATCH, prefix_cache_mb=64 if reuse else 0)
        return lambda requests, n: _engine_turn(engine, requests, n)

    runs = {True: [], False: []}
    for r in range(size["rounds"]):
        for reuse in ((True, False) if r % 2 == 0 else (False, True)):
            runs[reuse].append(_multiturn(hf_turns(reuse), vocab, size["convs"], size["turns"]))
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

    rss = _worker_peak_rss(path, size["worker_requests"])
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
