"""`rollart bench trainer`: the trainer's strategies, precision and memory switches, side by side.

Setup: a Qwen3-architecture model built locally (random init; full run: hidden 640, 10 layers, vocabulary
32,768 — 68 M parameters), trained by 2 gloo ranks, each a fresh process per setting (forked from a server
that imported the trainer once), one CPU thread each, glibc's mmap threshold at 64 KiB so RSS follows live
memory (trainer_ranks.py). Each setting trains a short warm-up step (2 sequences of 64 tokens) and then the measured step on a synthetic RL batch —
2 sequences of 2,048 tokens, one per rank, three quarters of each the model's own tokens — at
`train.micro_batch_tokens=4096`:

| row | strategy | precision | activation checkpointing | packing | chunked log-probs |
|---|---|---|---|---|---|
| ddp-fp32 | ddp | fp32 | – | on | 512 |
| fsdp2-fp32 | fsdp2 | fp32 | – | on | 512 |
| fsdp2-bf16 | fsdp2 | bf16 | – | on | 512 |
| fsdp2-bf16-ac | fsdp2 | bf16 | on | on | 512 |
| fsdp2-bf16-full-logits | fsdp2 | bf16 | – | on | off (0) |
| packing on / off | fsdp2 | fp32 | – | on / off | 512, on the demo's batch |

Each row: tokens/s (real tokens of the batch over the step's wall time), per-rank peak RSS and its rise over
the RSS before the step, per-rank parameters + gradients + optimizer state counted from the tensors, and the
row's wall time (spawn to exit).

Ratios (the issue's targets):
- `fsdp2_vs_ddp_max_abs_loss_diff`: fp32, 3 RL steps on the same batches (4 sequences of 64–128 tokens, in
  micro-batches of 128 tokens, so each rank accumulates gradients over two), 2 ranks each, ddp then fsdp2 in
  one pair of processes (target ≤ 1e-5).
- `fsdp2_state_bytes_vs_ddp`: per-rank parameters + gradients + AdamW state (target ≤ 0.55).
- `ac_activation_peak_reduction`: the step's RSS rise over its start, without ÷ with activation
  checkpointing (fsdp2-bf16 ÷ fsdp2-bf16-ac, a sequence of 2,048 per rank; target ≥ 3).
- `chunked_logprob_peak_reduction`: the peak of log-probs + entropy, forward and backward, from 4,096 hidden
  states against the 32,768-token head, whole ÷ in chunks of 512 (each in its own process; target ≥ 4).
- `packing_padding_reduction`: the padded fraction of the demo's batches (the default job's two domains,
  36 episodes as the warm start demonstrates them, tokenised by the default tokenizer) padded ÷ packed
  (packed has none: the ratio is reported as null with both fractions; target ≥ 2).
- `packing_tokens_per_s_gain`: packed ÷ padded tokens/s on that batch (target ≥ 1.3).
- `max_params_fsdp2_bf16_ac_vs_ddp_fp32`: the largest model each setting trains on this machine, from its
  measured bytes per parameter (the two ranks' peak RSS above their RSS after imports, over the parameter
  count) and the machine's memory less the two ranks' import RSS; confirmed by one real step of fsdp2-bf16-ac
  on a model of that size (or of the size the memory free at that moment allows, said in the notes), at
  sequences of 128 tokens (target ≥ 2.5).

`--rows A,B,…` measures only the named parts — setting rows (the table's names), `packing` (both packing rows),
`equality`, `logprobs`, `confirmation` (which needs the fsdp2-bf16-ac row) — and reports the ratios whose parts
all ran (e.g. `--rows fsdp2-bf16,fsdp2-bf16-ac` gives `ac_activation_peak_reduction` in about 4 minutes); the
parts, their order and their measurement are the full run's.

What keeps the full run near 10 minutes on 2 cores, and why none of it changes what a target reads:
- bf16 on a CPU without bf16 instructions (this machine: AVX2 only) runs its matrix products and attention
  through float32 kernels (cpu_bf16.py: same tensors in, out and saved for the backward; float32
  accumulation, as a GPU's bf16 GEMM). torch's own emulated bf16 is 8–30× slower than float32 here (measured:
  one 2-layer, 1,024-token forward + backward took 261 s in bf16 vs 9 s through float32 kernels), which put one
  bf16 step of this model past 10 minutes. A bf16 row is read for memory; its tokens/s then measures float32
  kernels, and the notes say so. On a CPU with bf16 instructions torch's kernels run unchanged.
- The warm-up step is short (trainer_ranks.measure: gradients are freed after every step, so the measured
  step starts from the same state — weights and AdamW state allocated — after a short warm-up as after a
  long one).
- One sequence of 2,048 tokens per rank (the length the activation target names) instead of 2,048 + 1,024:
  every ratio read from these rows compares two settings on the same batch.
- The packing rows run in fp32: their ratio is a tokens/s ratio, and fp32 keeps both sides on torch's own
  kernels (the padded side's masked attention would otherwise also go through the stand-in).
- The fsdp2-vs-ddp equality trains 4 short sequences per step (the ratio is about the arithmetic of two
  strategies, not the length), the confirmation step sequences of 128 tokens (its memory is bounded by the
  2,048-token rows' bytes per parameter it is sized from).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import BenchResult

FULL = dict(hidden_size=640, num_hidden_layers=10, num_attention_heads=10, num_key_value_heads=5, head_dim=64,
            intermediate_size=1792, vocab_size=32768)
QUICK = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=384, vocab_size=4096)
WIDE = dict(hidden_size=1536, num_attention_heads=12, num_key_value_heads=4, head_dim=128, intermediate_size=4096,
            vocab_size=32768)  # the shape the confirmation model grows in depth
LENGTHS = {True: [256, 256], False: [2048, 2048]}  # one sequence per rank
WARMUP = {True: [32, 32], False: [64, 64]}
EQUALITY = {True: [64, 48, 40, 32], False: [128, 96, 80, 64]}  # per step; micro-batches of the longest
SETTINGS = [
    ("ddp-fp32", {"strategy": "ddp", "precision": "fp32"}),
    ("fsdp2-fp32", {"strategy": "fsdp2", "precision": "fp32"}),
    ("fsdp2-bf16", {"strategy": "fsdp2", "precision": "bf16"}),
    ("fsdp2-bf16-ac", {"strategy": "fsdp2", "precision": "bf16", "activation_checkpointing": True}),
    ("fsdp2-bf16-full-logits", {"strategy": "fsdp2", "precision": "bf16", "logprob_chunk_tokens": 0}),
]
SETTINGS_BY_NAME = dict(SETTINGS)
WORLD = 2


def _params(shape: dict[str, int]) -> int:
    h, v, inter = shape["hidden_size"], shape["vocab_size"], shape["intermediate_size"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    layer = h * q * 2 + h * kv * 2 + 3 * h * inter + 2 * h + 2 * shape["head_dim"]
    return v * h + shape["num_hidden_layers"] * layer + h


def build_model(directory: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """A random-init Qwen3 checkpoint (tied head), written one tensor at a time, with the tiny tokenizer."""
    import torch
    from transformers import Qwen3Config

    from rollart.models.tiny import build_tokenizer
    from rollart.trainer.tensor_files import TensorSpec, write_safetensors

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(1024)
    config = Qwen3Config(**shape, tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config.architectures = ["Qwen3ForCausalLM"]
    with torch.device("meta"):
        from transformers import Qwen3ForCausalLM

        meta = Qwen3ForCausalLM(config)
    specs = [TensorSpec(n, torch.float32, tuple(p.shape)) for n, p in meta.named_parameters()]
    g = torch.Generator().manual_seed(seed)

    def tensors():
        for s in specs:
            yield (torch.ones(s.shape) if s.name.endswith("norm.weight")
                   else torch.randn(s.shape, generator=g) * 0.02)

    write_safetensors(directory / "model.safetensors", specs, tensors())
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _spawn(job: dict[str, Any], work: Path, label: str) -> list[dict[str, Any]]:
    """Run one setting on WORLD fresh rank processes; each rank's measurements (with the wall time, spawn to
    exit, as `wall_s`)."""
    import torch.multiprocessing as mp

    from benchmarks.trainer_ranks import _rank

    out = Path(tempfile.mkdtemp(dir=work))
    started = time.perf_counter()
    mp.start_processes(_rank, args=(WORLD, str(out / "store"), {**job, "out": str(out)}), nprocs=WORLD,
                       join=True, start_method="forkserver")
    wall = time.perf_counter() - started
    suffixes = [f"-{s}" for s in job["strategies"]] if job.get("strategies") else [""]
    ranks = [{**json.loads((out / f"rank{r}{x}.json").read_text()), "wall_s": wall, "name": x.lstrip("-")}
             for x in suffixes for r in range(WORLD)]
    brief = {k: round(v, 1) if isinstance(v, float) else v for k, v in ranks[0].items() if k != "losses"}
    print(f"bench trainer: {label} done in {wall:.0f} s: rank 0 {brief}", file=sys.stderr, flush=True)
    return ranks


def _row(name: str, ranks: list[dict[str, Any]], stand_in: bool) -> dict[str, Any]:
    seconds = max(r["step_s"] for r in ranks)
    return {
        "setting": name,
        "wall_s": round(ranks[0]["wall_s"], 1),
        "bf16_via_float32_kernels": stand_in,
        "tokens_per_s": round(ranks[0]["tokens"] / seconds, 1),
        "step_s": round(seconds, 2),
        "peak_rss_mb_per_rank": round(max(r["rss_peak_mb"] for r in ranks)),
        "step_rss_rise_mb_per_rank": round(max(r["rss_peak_mb"] - r["rss_before_mb"] for r in ranks)),
        "state_mb_per_rank": round(max(r["state_mb"] for r in ranks), 1),
        "params": ranks[0]["params"],
        "padding": round(ranks[0]["padding"], 4),
        # the model's share of the memory: both ranks' peak above their RSS after imports
        "bytes_per_param": sum(r["rss_peak_mb"] - r["rss_imported_mb"] for r in ranks) * 2**20 / ranks[0]["params"],
        "import_rss_mb": sum(r["rss_imported_mb"] for r in ranks),
    }


def _demo_samples() -> list[Any]:
    """The demo's batch: the default job's domains, 36 episodes as the warm start demonstrates them."""
    import random

    from rollart.config import RunConfig
    from rollart.models import resolve_model_path
    from rollart.types import TrainSample
    from rollart.job.warm_start import demonstration_batches

    cfg = RunConfig()
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={
        "warm_start": cfg.train.warm_start.model_copy(update={"batch_size": cfg.rollout.batch_size})})})
    path = resolve_model_path(cfg.model, cfg.seed)
    rng = random.Random(0)
    out = []
    for i, s in enumerate(next(iter(demonstration_batches(cfg, path)))):  # laid out as rollouts are
        out.append(TrainSample(s.trajectory_id, f"g{i // 4}", "demo", s.token_ids, s.loss_mask,
                               tuple(-2.0 * m for m in s.loss_mask), tuple(0 if m else -1 for m in s.loss_mask),
                               rng.uniform(-1, 1), 0.0))
    return out


def _logprob_peaks(shape: dict[str, int], tokens: int, work: Path) -> dict[int, float]:
    import torch.multiprocessing as mp

    from benchmarks.trainer_ranks import _logprob_rank

    peaks = {}
    for chunk in (512, 0):
        job = {"hidden_size": shape["hidden_size"], "vocab": shape["vocab_size"], "tokens": tokens, "chunk": chunk,
               "out": str(work)}
        mp.start_processes(_logprob_rank, args=(job,), nprocs=1, join=True, start_method="forkserver")
        peaks[chunk] = json.loads((work / f"logprobs-{chunk}.json").read_text())["peak_mb"]
    return peaks


PARTS = [name for name, _ in SETTINGS] + ["packing", "equality", "logprobs", "confirmation"]
NEEDS = {  # ratio: the parts it is computed from (a --rows run reports the ratios whose parts all ran)
    "fsdp2_vs_ddp_max_abs_loss_diff": ("equality",),
    "fsdp2_state_bytes_vs_ddp": ("ddp-fp32", "fsdp2-fp32"),
    "ac_activation_peak_reduction": ("fsdp2-bf16", "fsdp2-bf16-ac"),
    "chunked_logprob_peak_reduction": ("logprobs",),
    "packing_padding_reduction": ("packing",),
    "packing_tokens_per_s_gain": ("packing",),
    "max_params_fsdp2_bf16_ac_vs_ddp_fp32": ("ddp-fp32", "fsdp2-bf16-ac"),
}


def parse_rows(text: str | None) -> list[str]:
    """The parts a `--rows a,b,…` run measures, in the bench's order (None: all of them)."""
    if text is None:
        return list(PARTS)
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PARTS]
    if unknown or not chosen:
        raise ValueError(f"--rows {text!r}: {', '.join(unknown) or 'nothing named'}; choose from {', '.join(PARTS)}")
    if "confirmation" in chosen and "fsdp2-bf16-ac" not in chosen:
        raise ValueError("--rows: confirmation is sized from the fsdp2-bf16-ac row; name that row too")
    return [p for p in PARTS if p in chosen]


def run(quick: bool = False, rows: str | None = None, **_: Any) -> BenchResult:
    import torch

    import torch.multiprocessing as mp

    parts = parse_rows(rows)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # inherited by the fork server (read at its start), so every rank
    # one fork server, started on the first spawn with the trainer imported: each rank is a fresh fork of it
    # (~10 s of imports saved per rank; its RSS after imports is measured in the rank, as before)
    mp.get_context("forkserver").set_forkserver_preload(["benchmarks.trainer_ranks", "rollart.trainer",
                                                         "rollart.algo", "transformers.models.qwen3.modeling_qwen3"])
    shape = QUICK if quick else FULL
    stand_in = not torch.ops.mkldnn._is_mkldnn_bf16_supported()  # no bf16 instructions: cpu_bf16.py
    work = Path(tempfile.mkdtemp(prefix="rollart-bench-trainer-"))
    notes: list[str] = []
    out_rows: list[dict[str, Any]] = []
    walls: list[str] = []
    equal: dict[str, list[float]] = {}
    logprob: dict[int, float] = {}
    confirm: dict[str, Any] | None = None
    started = time.perf_counter()
    try:
        model = str(build_model(work / "model", shape))
        lengths = LENGTHS[quick]
        base = {"micro_batch_tokens": 4096}
        by_name = {}
        for name, setting in SETTINGS:
            if name not in parts:
                continue
            bf16 = stand_in and setting["precision"] == "bf16"
            ranks = _spawn({"model_path": model, "train": {**base, **setting}, "lengths": lengths,
                            "warmup": WARMUP[quick], "steps": 1, "bf16_via_float32": bf16}, work, name)
            by_name[name] = _row(name, ranks, bf16)
            out_rows.append(by_name[name])

        if "packing" in parts:
            demo = _demo_samples()
            for packing in (True, False):
                name = f"packing-{'on' if packing else 'off'}"
                ranks = _spawn({"model_path": model, "train": {**base, "strategy": "fsdp2", "precision": "fp32",
                                                               "packing": packing},
                                "lengths": [], "samples": demo, "warmup": WARMUP[quick], "steps": 1}, work, name)
                by_name[name] = _row(name, ranks, False)
                out_rows.append(by_name[name])
        walls += [f"{r['setting']} {r['wall_s']:.0f} s" for r in out_rows]

        if "equality" in parts:
            short = EQUALITY[quick]
            ranks = _spawn({"model_path": model, "train": {"micro_batch_tokens": max(short), "lr": 1e-4},
                            "strategies": ["ddp", "fsdp2"], "lengths": short, "steps": 3}, work, "equality")
            equal = {r["name"]: r["losses"] for r in ranks if r["rank"] == 0}
            walls.append(f"equality (ddp then fsdp2 in one pair of processes) {ranks[0]['wall_s']:.0f} s")
        if "logprobs" in parts:
            logprob_started = time.perf_counter()
            logprob = _logprob_peaks(shape, 4096, work)
            walls.append(f"log-probs {time.perf_counter() - logprob_started:.0f} s")
        if "confirmation" in parts:
            confirm = _confirm_max(by_name, work, quick, notes, stand_in)
            walls.append(f"confirmation {confirm['wall_s']:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    total = psutil.virtual_memory().total
    max_params = {name: int((total - r["import_rss_mb"] * 2**20) / r["bytes_per_param"])
                  for name, r in by_name.items() if name in dict(SETTINGS)}
    for name, row in by_name.items():
        if name in max_params:
            row["max_params_this_machine"] = max_params[name]
            row["bytes_per_param"] = round(row["bytes_per_param"], 2)
    ratios: dict[str, float | None] = {}
    if "equality" in parts:
        ratios["fsdp2_vs_ddp_max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(equal["ddp"], equal["fsdp2"]))
    if {"ddp-fp32", "fsdp2-fp32"} <= set(parts):
        ratios["fsdp2_state_bytes_vs_ddp"] = (by_name["fsdp2-fp32"]["state_mb_per_rank"]
                                              / by_name["ddp-fp32"]["state_mb_per_rank"])
    if {"fsdp2-bf16", "fsdp2-bf16-ac"} <= set(parts):
        ratios["ac_activation_peak_reduction"] = (by_name["fsdp2-bf16"]["step_rss_rise_mb_per_rank"]
                                                  / by_name["fsdp2-bf16-ac"]["step_rss_rise_mb_per_rank"])
    if "logprobs" in parts:
        ratios["chunked_logprob_peak_reduction"] = logprob[0] / logprob[512]
    if "packing" in parts:
        pad_on, pad_off = by_name["packing-on"]["padding"], by_name["packing-off"]["padding"]
        ratios["packing_padding_reduction"] = pad_off / pad_on if pad_on > 0 else None
        ratios["packing_tokens_per_s_gain"] = (by_name["packing-on"]["tokens_per_s"]
                                               / by_name["packing-off"]["tokens_per_s"])
    if {"ddp-fp32", "fsdp2-bf16-ac"} <= set(parts):
        ratios["max_params_fsdp2_bf16_ac_vs_ddp_fp32"] = max_params["fsdp2-bf16-ac"] / max_params["ddp-fp32"]
    params = next(iter(by_name.values()))["params"] if by_name else None
    notes += [
        f"model: {f'{params / 1e6:.1f} M parameters ' if params else ''}({shape}); 2 gloo ranks, 1 thread each; "
        f"sequences {lengths}",
    ]
    if parts != PARTS:
        notes.append(f"--rows: only {', '.join(parts)} ran; the ratios are those these parts give")
    if equal:
        notes.append(f"fsdp2 vs ddp losses over 3 steps: {equal['fsdp2']} vs {equal['ddp']}")
    if logprob:
        notes.append(f"log-probs of 4,096 tokens × {shape['vocab_size']} vocabulary: peak {logprob[0]:.0f} MB "
                     f"whole, {logprob[512]:.0f} MB in chunks of 512")
    if "packing" in parts:
        notes.append(f"padded fraction of the demo's batch: {pad_off:.1%} padded, {pad_on:.1%} packed"
                     + (" (packed has no padding: packing_padding_reduction is unbounded, reported as null)"
                        if pad_on == 0 else ""))
    if confirm is not None:
        notes.append(f"confirmation: {confirm}")
    if any(SETTINGS_BY_NAME.get(p, {}).get("precision") == "bf16" for p in parts) or confirm is not None:
        notes.append("bf16 rows (and the confirmation) ran their matrix products and attention through float32 "
                     "kernels (cpu_bf16.py: this CPU has no bf16 instructions): their memory is bf16's, their "
                     "tokens/s is not bf16's on any hardware" if stand_in else "bf16 rows ran torch's own bf16 kernels")
    notes.append(f"wall time: rows {'; '.join(walls)}; whole bench {time.perf_counter() - started:.0f} s")
    return BenchResult("trainer", ratios, out_rows, notes,
                       data={"confirmation": confirm, "max_params": max_params, "parts": parts})


def _confirm_max(by_name: dict[str, dict[str, Any]], work: Path, quick: bool, notes: list[str],
                 stand_in: bool) -> dict[str, Any]:
    """One real fsdp2-bf16-ac step on the largest model its bytes per parameter allow (in the memory free now)."""
    row = by_name["fsdp2-bf16-ac"]
    total, free = psutil.virtual_memory().total, psutil.virtual_memory().available
    predicted = int((total - row["import_rss_mb"] * 2**20) / row["bytes_per_param"])
    # 70 % of what is free now: the machine is shared, and the step must not push anyone else into the OOM killer
    fits_now = int((free * 0.7 - row["import_rss_mb"] * 2**20) / row["bytes_per_param"])
    target = min(predicted, fits_now)
    if quick:
        target = min(target, 30_000_000)
    per_layer = _params({**WIDE, "num_hidden_layers": 1}) - _params({**WIDE, "num_hidden_layers": 0})
    layers = max(1, (target - _params({**WIDE, "num_hidden_layers": 0})) // per_layer)
    shape = {**WIDE, "num_hidden_layers": int(layers)}
    if quick:
        shape = {**QUICK, "num_hidden_layers": 4}
    model = build_model(work / "confirm", shape)
    ranks = _spawn({"model_path": str(model), "train": {"micro_batch_tokens": 4096, "strategy": "fsdp2",
                                                        "precision": "bf16", "activation_checkpointing": True},
                    "lengths": [128, 128], "steps": 1, "bf16_via_float32": stand_in}, work, "confirmation")
    shutil.rmtree(model, ignore_errors=True)
    used = sum(r["rss_peak_mb"] for r in ranks)
    result = {"params": ranks[0]["params"], "predicted_max_params": predicted, "free_gib_at_start": free / 2**30,
              "peak_rss_gib_both_ranks": used / 1024, "step_s": max(r["step_s"] for r in ranks),
              "loss": ranks[0]["losses"][-1], "wall_s": ranks[0]["wall_s"]}
    if target < predicted and not quick:
        notes.append(f"the confirmation ran at {result['params'] / 1e9:.2f} B parameters, what the "
                     f"{free / 2**30:.1f} GiB free at that moment allow, below the {predicted / 1e9:.2f} B the "
                     "whole machine would")
    return result
