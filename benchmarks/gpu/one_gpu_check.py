"""What a lent GPU machine can check in one short run: one GPU, no network, the machine's own PyTorch — no Ray, no vLLM.

Run by check_one_gpu.sh (which installs the carried wheels first); `--device cpu` runs the same steps on a CPU
(tests/integration/test_gpu_checks.py does, so the script cannot rot between the rare loans of a GPU). Prints one JSON
object and writes it to WORK/result.json. Four parts, each reported on its own (an error in one is recorded
under `errors` and the later parts that need it are skipped; the exit status is 1 if any part failed):

1. `train`: the trainer rank (`rollart.trainer.Trainer`, FSDP2, bf16 compute over fp32 master weights, one rank:
   NCCL on the GPU, gloo on a CPU) takes a warm-up step and a measured step on a Qwen3-0.6B-shaped random-init
   model (`--shape tiny` on a CPU): tokens/s, peak device memory, the loss.
2. `weights`: the same rank sends its rows over the weight group (`weights.transport=collective`: gloo, the
   rows staged through host memory — the path a real run takes; `rollart/weights/collective.py`) to a receiver
   process, a `CollectiveSubscriber` as an inference worker holds one: seconds, the sender's peak device memory
   over its shard, and whether every received tensor equals the trainer's own bit for bit (the invariant
   "served version n ≡ trained version n").
3. `serve`: rollart's built-in engine on the device starts from the initial weights, swaps in the received
   version (`swap_weights`, as an inference worker does) and continues a prompt greedily; a transformers forward
   of the trained weights scores that continuation — mean |logprob difference| against the trained weights
   (bf16 engine vs fp32 reference: small, not 0) and against the initial ones (larger: the swap took).
4. `lend`: the trainer rank lends its device to generation (`train.elastic_generation`): the engine a rank builds
   in its own process (`rollart.inference.lent_engine`) serves the trainer's own fp32 tensors, adopted without a
   copy, continues the same prompt, and gives the device back — the seconds to start serving and to reclaim, the
   device memory while serving and after the reclaim (the KV cache freed), and the same transformers score
   (fp32 both sides: ~0).

What it cannot check on one GPU: NCCL between a trainer and an engine (one communicator refuses two members on
one device) and vLLM (not on the machine, and too large to carry) — `check_weights.sh` needs two GPUs and PyPI,
`check_vllm.sh` PyPI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=512),
}
LENGTHS = {"qwen3-0.6b": [2048, 2048, 1024, 1024], "tiny": [64, 64, 32, 32]}
PROMPT = list(range(10, 42))
NEW_TOKENS = 16
TIMEOUT_S = 600.0


def build_model(work: Path, shape: str) -> None:
    """A random-init Qwen3 of `shape` (tied embeddings, as Qwen3-0.6B) with the tiny model's tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rollart.config import ModelConfig
    from rollart.models import load_tokenizer, resolve_model_path

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**SHAPES[shape], tie_word_embeddings=True)).save_pretrained(work / "model")
    load_tokenizer(resolve_model_path(ModelConfig(), 0)).save_pretrained(work / "model")


class NoStore:
    """The object-store fallback of the weight group: none here (a fall back is reported as an error)."""

    async def latest_version(self) -> int:
        return -1

    async def pull(self, version: int) -> dict[str, Any]:
        raise RuntimeError("the weight group fell back to the object store, which this check has not")

    def publish(self, version: int, weights: Any, replace: bool = False) -> dict[str, float]:
        raise RuntimeError("the weight group fell back to the object store, which this check has not")

    def latest(self) -> int:
        return -1


def device_memory(device: str) -> tuple[int, int]:
    """(bytes allocated now, peak since the last reset) on `device`; (0, 0) on a CPU."""
    if device.startswith("cuda"):
        return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    return 0, 0


def sender(work: str, device: str, shape: str, spec: Any) -> None:
    """Part 1 and the sending half of part 2, in the trainer's own process."""
    from rollart.algo import PolicyObjective
    from rollart.config import PoolConfig, RunConfig, default_pools
    from rollart.trainer import Trainer
    from benchmarks.trainer_ranks import batch
    from rollart.weights.collective import CollectivePublisher

    out: dict[str, Any] = {}
    cuda = device.startswith("cuda")
    try:
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{work}/trainer-store", rank=0,
                                world_size=1)
        pool = PoolConfig(kind="gpu", device="cuda", capacity=1) if cuda else PoolConfig(kind="cpu", capacity=1)
        cfg = RunConfig(model={"path": f"{work}/model"}, pools={**default_pools(), "train": pool},
                        train={"workers": 1, "strategy": "fsdp2", "precision": "bf16", "lr": 1e-3})
        trainer = Trainer(cfg, PolicyObjective.of(cfg), rank=0, world_size=1, device=device)
        vocab, lengths = SHAPES[shape]["vocab_size"], LENGTHS[shape]
        trainer.train_step(batch(lengths, 0, 0, vocab))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        metrics = trainer.train_step(batch(lengths, 1, 1, vocab))
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        _, peak = device_memory(device)
        out["train"] = {"tokens_per_s": sum(lengths) / seconds, "step_s": seconds, "loss": metrics["train/loss"],
                        "peak_gib": peak / 2**30, "version": trainer.version}
        trainer.export(f"{work}/trained")

        shard = sum(c.numel() * c.element_size() for c in trainer.row_chunks())
        publisher = CollectivePublisher(spec, NoStore())
        base, _ = device_memory(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        sent = publisher.publish_rows(trainer.version, 0, 1, trainer.weight_specs(), trainer.row_chunks())
        if cuda:
            torch.cuda.synchronize()
        _, peak = device_memory(device)
        out["weights"] = {"publish_s": time.perf_counter() - start, "shard_mb": shard / 2**20,
                          "device_peak_over_shard": (shard + peak - base) / shard if cuda else None, **sent}
        from safetensors.torch import save_file

        save_file({k: v.detach().to("cpu").clone().contiguous() for k, v in trainer.state_dict().items()},
                  f"{work}/trainer_state.safetensors")
        out["lend"] = lend(cfg, trainer, device)
        dist.destroy_process_group()
    except Exception:
        out["error"] = traceback.format_exc(limit=8)
    Path(work, "sender.json").write_text(json.dumps(out))


def lend(cfg: Any, trainer: Any, device: str) -> dict[str, Any]:
    """Part 4, in the trainer's own process: a loan of its device to generation, one greedy continuation, the
    device taken back."""
    from rollart.inference.lent_engine import BuiltinLentEngine
    from rollart.types import GenerationRequest, SamplingParams

    before, _ = device_memory(device)
    engine = BuiltinLentEngine(cfg, "trainer/train/0/lent", device)
    try:
        start = time.perf_counter()
        engine.serve(trainer.version, trainer.published_weights())
        lend_s = time.perf_counter() - start
        request = GenerationRequest("l0", "tl", "check", tuple(PROMPT),
                                    SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))
        engine.submit("check", [(0, request)])
        outcomes: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while not outcomes and time.monotonic() < deadline:
            outcomes = engine.take("check", 5.0)
        if not outcomes:
            raise TimeoutError(f"the lent engine gave no result within {TIMEOUT_S:g} s")
        (_, result, error), = outcomes
        if error is not None:
            raise error
        serving, _ = device_memory(device)
        start = time.perf_counter()
        stopped = engine.stop(TIMEOUT_S)
        reclaim_s = time.perf_counter() - start
        after, _ = device_memory(device)
    finally:
        engine.close()
    return {"lend_s": lend_s, "reclaim_s": reclaim_s, "busy_s": stopped["busy_s"],
            "versions_are_the_trainers": set(result.versions) == {trainer.version},
            "token_ids": list(result.token_ids), "logprobs": list(result.logprobs),
            "device_mb_serving_over_before": (serving - before) / 2**20,
            "device_mb_after_reclaim_over_before": (after - before) / 2**20}


def receiver(work: str, spec: Any) -> None:
    """The receiving half of part 2: a `CollectiveSubscriber`, as an inference worker holds one."""
    from safetensors.torch import save_file

    from rollart.weights.collective import CollectiveSubscriber

    subscriber = CollectiveSubscriber(spec, NoStore())

    async def take() -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while (version := await subscriber.latest_version()) < 0:
            if subscriber.fell_back:
                raise RuntimeError(f"the weight group fell back to the store: {subscriber.fell_back}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no version came within {TIMEOUT_S:g} s")
            await asyncio.sleep(0.05)
        start = time.perf_counter()
        tensors = await subscriber.pull(version)
        return {"version": version, "pull_s": time.perf_counter() - start, "tensors": tensors}

    out: dict[str, Any] = {}
    try:
        got = asyncio.run(take())
        save_file({k: v.clone().contiguous() for k, v in got.pop("tensors").items()}, f"{work}/received.safetensors")
        out = got
    except Exception:
        out["error"] = traceback.format_exc(limit=8)
    finally:
        subscriber.close()
    Path(work, "receiver.json").write_text(json.dumps(out))


def compare(work: Path) -> dict[str, Any]:
    """Every received tensor against the trainer's own, bit for bit."""
    from safetensors.torch import load_file

    received, trained = load_file(str(work / "received.safetensors")), load_file(str(work / "trainer_state.safetensors"))
    names = sorted(set(received) & set(trained))
    differ = [n for n in names if received[n].dtype != trained[n].dtype or not torch.equal(received[n], trained[n])]
    return {"tensors_received": len(received), "tensors_compared": len(names), "differ": differ[:10],
            "bit_identical": bool(names) and not differ and set(trained) <= set(received)}


def serve(work: Path, device: str) -> dict[str, Any]:
    """Part 3: the built-in engine swaps in the received weights and continues a prompt; transformers scores it."""
    from safetensors.torch import load_file

    from rollart.inference.builtin_engine import BuiltinEngine
    from rollart.models import load_model, load_tokenizer
    from rollart.types import GenerationRequest, SamplingParams

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    model = load_model(work / "model", dtype=dtype, device=device).to(device)
    engine = BuiltinEngine(model, load_tokenizer(str(work / "model")), max_batch_size=4)
    received = load_file(str(work / "received.safetensors"))
    slots = dict(model.named_parameters(remove_duplicate=False))
    weights = {n: t.to(device=device, dtype=slots[n].dtype) for n, t in received.items() if n in slots}
    start = time.perf_counter()
    engine.swap_weights(1, weights)
    swap_s = time.perf_counter() - start
    engine.add(GenerationRequest("r0", "t0", "check", tuple(PROMPT),
                                 SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)))
    results: list[Any] = []
    deadline = time.monotonic() + TIMEOUT_S
    while not results:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine gave no result within {TIMEOUT_S:g} s")
        results = engine.step()
    engine.close()
    continuation = list(results[0].token_ids)
    served = torch.tensor(results[0].logprobs)
    return {"swap_s": swap_s, "tokens": len(continuation),
            "mean_abs_logprob_diff_vs_trained": float((scored(work / "trained", device, continuation) - served)
                                                      .abs().mean()),
            "mean_abs_logprob_diff_vs_initial": float((scored(work / "model", device, continuation) - served)
                                                      .abs().mean())}


def scored(path: Path, device: str, continuation: list[int]) -> torch.Tensor:
    """The log-probabilities a transformers forward of the fp32 weights at `path` gives the continuation of PROMPT."""
    from rollart.models import load_model

    reference = load_model(path, dtype="float32", device=device).to(device).eval()
    tokens = torch.tensor([PROMPT + continuation], device=device)
    with torch.no_grad():
        logits = reference(input_ids=tokens).logits[0, len(PROMPT) - 1:-1].float()
    targets = torch.tensor(continuation, device=device)[:, None]
    return torch.log_softmax(logits, -1).gather(-1, targets).squeeze(-1).cpu()


def run(work: Path, device: str, shape: str) -> dict[str, Any]:
    from rollart.weights.collective import WeightGroupServer

    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"device": device, "shape": shape, "torch": torch.__version__, "errors": {}}
    if device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(0)
    build_model(work, shape)
    group = WeightGroupServer("127.0.0.1", 1, 1, 64 * 2**20, TIMEOUT_S, interface=_loopback())
    ctx = mp.get_context("spawn")
    members = [ctx.Process(target=sender, args=(str(work), device, shape, group.spec)),
               ctx.Process(target=receiver, args=(str(work), group.spec))]
    for p in members:
        p.start()
    for p in members:
        p.join(TIMEOUT_S + 60)
    for p in members:
        if p.is_alive():
            p.kill()
            result["errors"][p.name] = "hung: killed"
    sent = _read(work / "sender.json")
    got = _read(work / "receiver.json")
    for part, answer in (("sender", sent), ("receiver", got)):
        if "error" in answer:
            result["errors"][part] = answer.pop("error")
    result["train"] = sent.get("train")
    result["lend"] = sent.get("lend")
    if result["lend"] and (work / "trained").exists():
        served = torch.tensor(result["lend"].pop("logprobs"))
        result["lend"]["mean_abs_logprob_diff_vs_trained"] = float(
            (scored(work / "trained", device, result["lend"]["token_ids"]) - served).abs().mean())
    result["weights"] = {**sent.get("weights", {}), "receiver": got} if "weights" in sent else None
    if result["weights"] and "version" in got:
        try:
            result["weights"].update(compare(work))
        except Exception:
            result["errors"]["compare"] = traceback.format_exc(limit=8)
    if "version" in got and (work / "trained").exists():
        try:
            result["serve"] = serve(work, device)
        except Exception:
            result["errors"]["serve"] = traceback.format_exc(limit=8)
    return result


def _loopback() -> str:
    from rollart.resources.nodes import loopback_interface

    return loopback_interface() or ""


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"error": f"{path.name} was not written"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES), help="qwen3-0.6b on cuda, tiny on cpu")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("one_gpu_check: torch sees no CUDA device here (use --device cpu to run the steps on a CPU)",
              file=sys.stderr)
        return 2
    shape = args.shape or ("qwen3-0.6b" if args.device == "cuda" else "tiny")
    result = run(args.work, "cuda:0" if args.device == "cuda" else "cpu", shape)
    text = json.dumps(result, indent=2)
    (args.work / "result.json").write_text(text)
    print(text)
    ok = (not result["errors"] and result.get("serve") and result["weights"] and result["weights"].get("bit_identical")
          and result.get("lend") and result["lend"]["versions_are_the_trainers"])
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    sys.exit(main())
