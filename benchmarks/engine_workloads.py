"""What the engine benchmarks share (`engine.py`: built-in engine vs `generate`; `engine_vllm.py`: vLLM vs
both): the workloads, the ways to run them through an engine or `generate`, and the worker-memory probe.

In: the model, its tokenizer, a `Workload` (prompt token ids, output length) or multi-turn conversations.
Out: timings (wall and CPU seconds), prefill counts and peak RSS. Every runner generates exactly the asked
number of tokens (greedy, no EOS stop) and `drive` checks it.
"""

from __future__ import annotations

import copy
import os
import time

import torch

from rollart.config import InferenceConfig, ModelConfig, RunConfig
from rollart.types import GenerationRequest, SamplingParams

BATCH = 16

Workload = list[tuple[tuple[int, ...], int]]  # (prompt token ids, output length)


def random_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [tuple(torch.randint(3, vocab, (k,), generator=g).tolist()) for k in lengths]


def spread_lengths(n: int, shortest: int, longest: int, seed: int) -> list[int]:
    """n output lengths from shortest to longest (evenly spaced, shuffled): spread exactly longest/shortest."""
    step = (longest - shortest) / max(1, n - 1)
    lengths = [round(shortest + i * step) for i in range(n)]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [lengths[i] for i in order]


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for fn(); CPU time is what a loaded machine disturbs least."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run_generate(model, work: Workload) -> None:
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


def engine_turn(engine, requests: list[tuple[str, tuple[int, ...]]], new_tokens: int) -> dict[str, tuple]:
    """One turn of every conversation through an engine: {conversation: (tokens, prompt, prefilled)}."""
    for cid, prompt in requests:
        engine.add(GenerationRequest(f"{cid}:{len(prompt)}", cid, "bench", prompt,
                                     SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)))
    out = {}
    while engine.has_work():
        for r in engine.step():
            out[r.trajectory_id] = (r.token_ids, r.prompt_tokens, r.prefill_tokens)
    return out


def generate_turn(model, requests: list[tuple[str, tuple[int, ...]]], new_tokens: int) -> dict[str, tuple]:
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


def multiturn(run_turn, vocab: int, convs: int, turns: int) -> tuple[int, int, float, float]:
    """(prompt tokens, prefilled tokens, wall s, CPU s) for `convs` concurrent `turns`-turn conversations:
    each turn's prompt is the last prompt + the 16-token response + a 24-token observation."""
    contexts = {f"conv{c}": p for c, p in enumerate(random_prompts(convs, 64, 64, vocab, seed=11))}
    observations = [random_prompts(turns, 24, 24, vocab, seed=100 + c) for c in range(convs)]
    prompt_total = prefill_total = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for t in range(turns):
        for cid, (tokens, prompt, prefilled) in run_turn(sorted(contexts.items()), 16).items():
            prompt_total += prompt
            prefill_total += prefilled
            if t + 1 < turns:
                contexts[cid] = contexts[cid] + tuple(tokens) + observations[int(cid[4:])][t + 1]
    return prompt_total, prefill_total, time.perf_counter() - wall, time.process_time() - cpu


def worker_peak_rss(path, requests: int, engine: str = "builtin") -> float:
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
        prompts = random_prompts(requests, 32, 96, 1000, seed=5)
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
