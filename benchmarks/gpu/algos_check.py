"""Every registered algorithm on CUDA: a few train steps of FSDP2 + bf16 over NCCL on a Qwen3-0.6B-shaped model.

Run by check_algos.sh (UNTESTED: written on a machine without a GPU; every path it takes runs on CPU in
`make test` — the contract test trains every registered algorithm for one step of the tiny model — and in
`rollart bench algos`). Prints one JSON object: per algorithm, per step the loss, the grad norm, the mismatch
metrics (engine-vs-trainer KL, importance-weight quantiles: here the behaviour log-probabilities are the
trainer's own at version 0 perturbed by noise, standing in for an engine), the step time and, for ppo, the
critic's share (`time/critic`) and value loss; and the peak GPU memory. `ranks` = min(2, GPUs).
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
STEPS = 3
KEYS = ("train/loss", "train/grad_norm", "train/mismatch_kl", "train/iw_p01", "train/iw_p50", "train/iw_p99",
        "train/iw_truncated_frac", "train/iw_masked_frac", "train/value_loss", "time/critic", "time/train")


def trajectories(step: int, vocab: int, groups: int = 4, size: int = 4, prompt: int = 512, response: int = 512):
    """Groups of single-turn trajectories with random tokens, behaviour logprobs near the model's (−ln V ± noise)
    and rewards that vary within each group but one (what dynamic sampling drops)."""
    from rollart.types import Status, Task, Trajectory, Turn

    g = torch.Generator().manual_seed(step)
    out = []
    for k in range(groups):
        for i in range(size):
            ids = torch.randint(3, vocab, (prompt + response,), generator=g).tolist()
            logprobs = (-torch.log(torch.tensor(float(vocab))) + 0.05 * torch.randn(response, generator=g)).tolist()
            turn = Turn(tuple(ids[:prompt]), tuple(ids[prompt:]), tuple(logprobs), (step,) * response)
            task = Task(f"s{step}g{k}/{i}", "math", "math", k, f"s{step}g{k}")
            reward = 1.0 if k == 0 else float((i + k) % 2)
            out.append(Trajectory(task.trajectory_id, task, step, turns=(turn,)).finished(Status.COMPLETED).scored(reward))
    return out


def rank_main(rank: int, world: int, work: str, name: str) -> None:
    from rollart.algo import PolicyObjective, build_train_batch
    from rollart.config import PoolConfig, RunConfig, default_pools
    from rollart.trainer import Trainer

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{work}/store-{name}", rank=rank, world_size=world)
    pools = {**default_pools(), "train": PoolConfig(kind="gpu", device="cuda", capacity=world)}
    cfg = RunConfig(model={"path": f"{work}/model"}, pools=pools,
                    train={"workers": world, "strategy": "fsdp2", "precision": "bf16", "lr": 1e-6,
                           "algorithm": name, "mini_batches": 2, "micro_batch_tokens": 8192})
    trainer = Trainer(cfg, PolicyObjective.of(cfg), rank=rank, world_size=world, device=f"cuda:{rank}")
    limits = {d: c.max_new_tokens for d, c in cfg.domains.items()}
    steps = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(STEPS):
        batch = build_train_batch(trajectories(step, QWEN3_0_6B["vocab_size"]), trainer.version, cfg.train, limits)
        torch.cuda.synchronize()
        start = time.perf_counter()
        metrics = trainer.train_step(batch)
        torch.cuda.synchronize()
        steps.append({"step_s": time.perf_counter() - start, **{k: metrics[k] for k in KEYS if k in metrics}})
    out = {"rank": rank, "steps": steps, "max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
    Path(work, f"{name}-rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> None:
    from benchmarks.trainer import build_model
    from rollart.algo import ALGORITHMS

    work = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/check-algos")
    work.mkdir(parents=True, exist_ok=True)
    world = min(2, torch.cuda.device_count())
    if world < 1 or not torch.cuda.is_bf16_supported():
        sys.exit("check_algos: needs a CUDA GPU with bfloat16")
    build_model(work / "model", QWEN3_0_6B)
    results = {}
    for name in ALGORITHMS:
        mp.start_processes(rank_main, args=(world, str(work), name), nprocs=world, join=True, start_method="spawn")
        results[name] = [json.loads((work / f"{name}-rank{r}.json").read_text()) for r in range(world)]
    print(json.dumps({"ranks": world, "gpu": torch.cuda.get_device_name(0), "algorithms": results}, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    main()
