"""The trainer on CUDA: FSDP2 + bf16 over NCCL on a Qwen3-0.6B-shaped model, then one weight publish into vLLM.

Run by check_trainer.sh (UNTESTED: written on a machine without a GPU; every step it takes runs on CPU in
`make test` and `rollart bench trainer`). Prints one JSON object:

- `train`: per rank, tokens/s of the measured step (a warm-up step first), torch.cuda.max_memory_allocated
  and max_memory_reserved, the loss; `ranks` = min(2, GPUs), each on its own GPU.
- `publish`: the trained weights (fp32 master weights, exported by rank 0 one gathered tensor at a time) go
  into a vLLM engine started from the initial checkpoint, through the `update_weights` path an inference
  worker uses; then the engine's greedy continuation of a prompt is scored by a transformers forward of the
  exported weights: the mean |logprob difference| (bf16 on both sides: ~1e-2, not 0, and far below the
  difference to the untrained weights, also reported).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

QWEN3_0_6B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=3072, vocab_size=151936)
LENGTHS = [2048, 2048, 1024, 1024]


def rank_main(rank: int, world: int, work: str) -> None:
    from benchmarks.trainer_ranks import batch
    from rollart.algo import PolicyObjective
    from rollart.config import PoolConfig, RunConfig, default_pools
    from rollart.trainer import Trainer

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{work}/store", rank=rank, world_size=world)
    pools = {**default_pools(), "train": PoolConfig(kind="gpu", device="cuda", capacity=world)}
    cfg = RunConfig(model={"path": f"{work}/model"}, pools=pools,
                    train={"workers": world, "strategy": "fsdp2", "precision": "bf16", "lr": 1e-5})
    trainer = Trainer(cfg, PolicyObjective.of(cfg), rank=rank, world_size=world,
                      device=f"cuda:{rank}")
    vocab = QWEN3_0_6B["vocab_size"]
    trainer.train_step(batch(LENGTHS, 0, 0, vocab))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    metrics = trainer.train_step(batch(LENGTHS, 1, 1, vocab))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    trainer.export(f"{work}/trained")
    out = {"rank": rank, "tokens_per_s": sum(LENGTHS) / seconds, "step_s": seconds, "loss": metrics["train/loss"],
           "max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
           "max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}
    Path(work, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def publish(work: Path) -> dict[str, float]:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rollart.inference.vllm_engine import VLLMEngine
    from rollart.types import GenerationRequest, SamplingParams

    trained = load_file(str(work / "trained" / "model.safetensors"))
    engine = VLLMEngine(work / "model", device="cuda", dtype="bfloat16", max_batch_size=4, kv_cache_mb=0,
                        gpu_memory_utilization=0.3, max_model_len=1024)
    start = time.perf_counter()
    engine.swap_weights(1, trained)
    swap_s = time.perf_counter() - start
    prompt = tuple(range(10, 42))
    engine.add(GenerationRequest("r0", "t0", "check", prompt, SamplingParams(temperature=0.0, max_new_tokens=16)))
    results = []
    while not results:
        results = engine.step()
    engine.close()
    tokens = prompt + results[0].token_ids
    served = torch.tensor(results[0].logprobs)

    def scored(path: Path) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).cuda().eval()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tokens]).cuda()).logits[0, len(prompt) - 1:-1].float()
        targets = torch.tensor(results[0].token_ids).cuda()[:, None]
        return torch.log_softmax(logits, -1).gather(-1, targets).squeeze(-1).cpu()

    return {"swap_s": swap_s,
            "mean_abs_logprob_diff_vs_trained": float((scored(work / "trained") - served).abs().mean()),
            "mean_abs_logprob_diff_vs_initial": float((scored(work / "model") - served).abs().mean())}


def main() -> None:
    from benchmarks.trainer import build_model

    work = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/check-trainer")
    work.mkdir(parents=True, exist_ok=True)
    world = min(2, torch.cuda.device_count())
    if world < 1 or not torch.cuda.is_bf16_supported():
        sys.exit("check_trainer: needs a CUDA GPU with bfloat16")
    build_model(work / "model", QWEN3_0_6B)
    mp.start_processes(rank_main, args=(world, str(work)), nprocs=world, join=True, start_method="spawn")
    train = [json.loads((work / f"rank{r}.json").read_text()) for r in range(world)]
    print(json.dumps({"ranks": world, "gpu": torch.cuda.get_device_name(0), "train": train,
                      "publish": publish(work)}, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    main()
