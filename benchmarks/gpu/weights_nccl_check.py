"""Weights from FSDP2 shards to a vLLM engine over NCCL: rollart's weight-group protocol (`weights.transport=collective`,
rollart/weights/collective.py) with GPU tensors on both ends. Run by check_weights.sh.

UNTESTED: written on a machine without a GPU; the same protocol over gloo, from real FSDP2 and DDP ranks, is
tested on CPU (`tests/integration/test_weights_collective.py`) and measured by `rollart bench weights`.

Needs ≥ 2 GPUs: NCCL refuses two members of one communicator on one device, so the trainer ranks (min(2,
GPUs − 1), FSDP2, bf16 compute, fp32 master weights) use GPUs 0..R−1 and the vLLM engine (TP 1) GPU R.

1. The model: Qwen3-0.6B-shaped, random init, saved to WORK/model (with the tiny model's tokenizer).
2. vLLM starts from it, with rollart's weight-swap worker extension plus `rollart_receive_nccl`: in the vLLM
   worker, join the weight group (one NCCL group per trainer rank, this engine rank 1 of each), receive one
   version's buckets straight into GPU tensors (`collective.receive_buckets`), and load them with
   `reload_weights` (re-tying a tied head), as `rollart_apply_staged` does.
3. The trainer ranks take one train step, then each sends its own shard's rows (`Trainer.row_chunks`, never
   a full tensor) with `CollectivePublisher.publish_rows` while the engine receives; rank 0 also exports the
   trained weights (one gathered tensor at a time) for the check.
4. The check: the engine's greedy continuation of a prompt, scored by a transformers forward of the
   exported weights — mean |logprob difference| (bf16 engine vs fp32 reference: ~1e-2, far below the
   difference to the untrained weights, also reported) — plus each sender's peak GPU memory over its shard
   (`torch.cuda.max_memory_allocated` during the publish) and the publish time. Prints one JSON object.
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
PROMPT = list(range(100, 164))


class NcclReceiveExtension:
    """Mixed into vLLM's worker next to rollart's `WeightSwapExtension` (set in `worker_extension_cls`)."""

    def rollart_receive_nccl(self, spec: dict) -> dict:
        from rollart.weights.collective import WeightGroupSpec, announced_version, receive_buckets
        from rollart.weights.shard_plan import plan_buckets, specs_from_json
        import datetime

        group_spec = WeightGroupSpec(**spec)
        kv = group_spec.store()
        groups = [group_spec.group(kv, s, 1) for s in range(group_spec.senders)]
        kv.wait([f"{group_spec.prefix}/plan"], datetime.timedelta(seconds=group_spec.timeout_s))
        specs = specs_from_json(kv.get(f"{group_spec.prefix}/plan"))
        plans = [plan_buckets(specs, s, group_spec.senders, group_spec.bucket_bytes) for s in range(group_spec.senders)]
        keys = [f"{group_spec.prefix}/n1/s{s}" for s in range(group_spec.senders)]
        kv.wait(keys, datetime.timedelta(seconds=group_spec.timeout_s))
        version = announced_version([json.loads(kv.get(k)) for k in keys], plans)
        start = time.perf_counter()
        tensors, _ = receive_buckets(groups, specs, plans, device=torch.cuda.current_device(), checksum=False)
        torch.cuda.synchronize()
        received = time.perf_counter() - start
        named = {name: t for sp, t in zip(specs, tensors) for name in sp.names}
        self.reload_weights(weights_iterator=iter(named.items()))
        model = self.model_runner.get_model()
        if getattr(model.config, "tie_word_embeddings", False):
            from rollart.inference.vllm_worker import _retie_output_head

            _retie_output_head(model)
        return {"version": version, "receive_s": received, "tensors": len(named)}


def sender_main(rank: int, world: int, work: str, spec: dict) -> None:
    from benchmarks.trainer_ranks import batch
    from rollart.algo import PolicyObjective
    from rollart.config import PoolConfig, RunConfig, default_pools
    from rollart.trainer import Trainer
    from rollart.weights.collective import CollectivePublisher, WeightGroupSpec

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{work}/trainer-store", rank=rank, world_size=world)
    pools = {**default_pools(), "train": PoolConfig(kind="gpu", device="cuda", capacity=world)}
    cfg = RunConfig(model={"path": f"{work}/model"}, pools=pools,
                    train={"workers": world, "strategy": "fsdp2", "precision": "bf16", "lr": 1e-5})
    trainer = Trainer(cfg, PolicyObjective.of(cfg), rank=rank, world_size=world, device=f"cuda:{rank}")
    trainer.train_step(batch([512, 512], 0, 0, QWEN3_0_6B["vocab_size"]))
    shard = sum(c.numel() * c.element_size() for c in trainer.row_chunks())
    publisher = CollectivePublisher(WeightGroupSpec(**spec), store=None)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    metrics = publisher.publish_rows(trainer.version, rank, world, trainer.weight_specs(), trainer.row_chunks())
    torch.cuda.synchronize()
    out = {"rank": rank, "publish_s": time.perf_counter() - start, "shard_mb": shard / 2**20,
           "peak_over_shard": (shard + torch.cuda.max_memory_allocated() - base) / shard, **metrics}
    trainer.export(f"{work}/trained")
    Path(work, f"sender{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def logprobs_of(model_dir: str, tokens: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens], device="cuda")).logits.float().log_softmax(-1)[0]
    return logits[len(PROMPT) - 1:-1].gather(-1, torch.tensor(tokens[len(PROMPT):], device="cuda")[:, None])[:, 0].cpu()


def main(work: str) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from vllm import LLM, SamplingParams

    from rollart.config import ModelConfig
    from rollart.models import load_tokenizer, resolve_model_path
    from rollart.weights.collective import WeightGroupServer

    gpus = torch.cuda.device_count()
    if gpus < 2:
        sys.exit(f"weights_nccl_check: {gpus} GPU(s); it needs 2 (NCCL refuses two members on one device)")
    ranks = min(2, gpus - 1)
    Path(work).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**QWEN3_0_6B, tie_word_embeddings=True)).save_pretrained(f"{work}/model")
    load_tokenizer(resolve_model_path(ModelConfig(), 0)).save_pretrained(f"{work}/model")
    server = WeightGroupServer("127.0.0.1", ranks, 1, 64 * 2**20, 600.0)
    spec = {**server.spec.__dict__, "backend": "nccl"}

    os.environ["CUDA_VISIBLE_DEVICES"] = str(ranks)  # the engine's GPU (set before vLLM starts)
    llm = LLM(model=f"{work}/model", dtype="bfloat16", enforce_eager=True, gpu_memory_utilization=0.5,
              worker_extension_cls="benchmarks.gpu.weights_nccl_check.Extension")
    greedy = SamplingParams(max_tokens=32, temperature=0.0, logprobs=0)
    before = llm.generate([{"prompt_token_ids": PROMPT}], greedy)[0].outputs[0]
    del os.environ["CUDA_VISIBLE_DEVICES"]

    ctx = mp.get_context("spawn")
    senders = [ctx.Process(target=sender_main, args=(r, ranks, work, spec)) for r in range(ranks)]
    for p in senders:
        p.start()
    received = llm.collective_rpc("rollart_receive_nccl", kwargs={"spec": spec})[0]
    for p in senders:
        p.join(1200)
    if any(p.exitcode != 0 for p in senders):
        sys.exit(f"weights_nccl_check: a sender failed: {[p.exitcode for p in senders]}")
    llm.reset_prefix_cache()
    after = llm.generate([{"prompt_token_ids": PROMPT}], greedy)[0].outputs[0]
    tokens = PROMPT + list(after.token_ids)
    served = torch.tensor([next(iter(lp.values())).logprob for lp in after.logprobs])
    trained, untrained = logprobs_of(f"{work}/trained", tokens), logprobs_of(f"{work}/model", tokens)
    print(json.dumps({
        "received": received,
        "senders": [json.loads(Path(work, f"sender{r}.json").read_text()) for r in range(ranks)],
        "mean_abs_logprob_diff_vs_trained": float((served - trained).abs().mean()),
        "mean_abs_logprob_diff_vs_untrained": float((served - untrained).abs().mean()),
        "continuation_changed": list(before.token_ids) != list(after.token_ids),
    }, indent=2))


def _extension() -> type:
    from rollart.inference.vllm_worker import WeightSwapExtension

    return type("Extension", (NcclReceiveExtension, WeightSwapExtension), {})


Extension = _extension()

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else f"runs/check-weights-nccl-{time.strftime('%Y%m%d-%H%M%S')}")
