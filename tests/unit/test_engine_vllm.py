"""VLLMEngine's pure parts — run in both venvs, vLLM installed or not: the engine arguments per device,
the bucketed transfer of weights, the message when vLLM is missing, the config that selects it. Its
behaviour against the engine contract is in tests/contracts/test_engine_contract.py."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load

from rollart.config import RunConfig
from rollart.inference.vllm_engine import VLLMEngine, _safetensors_buckets, engine_args

ARGS = dict(dtype="float32", max_batch_size=8, kv_cache_mb=64, gpu_memory_utilization=0.9, tensor_parallel_size=1,
            max_model_len=0, enforce_eager=None, seed=3)


def test_one_code_path_cpu_and_cuda_differ_only_in_arguments():
    cpu = engine_args("/m", device="cpu", **ARGS)
    cuda = engine_args("/m", device="cuda", **{**ARGS, "tensor_parallel_size": 4, "kv_cache_mb": 0})
    assert cpu["distributed_executor_backend"] == "uni" and cpu["enforce_eager"] is True
    assert cpu["kv_cache_memory_bytes"] == 64 * 2**20 and cpu["max_num_seqs"] == 8
    assert cuda["distributed_executor_backend"] == "mp" and cuda["tensor_parallel_size"] == 4
    assert cuda["enforce_eager"] is False and "kv_cache_memory_bytes" not in cuda
    # vLLM 0.32 on CPU cannot split a seeded request's prefill across steps (see engine_args)
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] >= 2048
    assert "enable_chunked_prefill" not in cuda
    for args in (cpu, cuda):  # what the contract relies on, on every device
        assert args["enable_prefix_caching"] and args["async_scheduling"] is False
        assert args["logprobs_mode"] == "processed_logprobs"
        assert args["worker_extension_cls"] == "rollart.inference.vllm_worker.WeightSwapExtension"


@pytest.mark.parametrize("device, change, message", [
    ("cpu", {"tensor_parallel_size": 2}, "tensor_parallel_size=2 needs a CUDA pool"),
    ("cpu", {"kv_cache_mb": 0}, "kv_cache_mb must be > 0 on CPU"),
    ("mps", {}, "device='mps' is not supported"),
])
def test_bad_settings_name_the_field(device, change, message):
    with pytest.raises(ValueError, match=message):
        engine_args("/m", device=device, **{**ARGS, **change})


def test_weights_travel_in_bounded_buckets_and_arrive_bit_identical():
    g = torch.Generator().manual_seed(0)
    tensors = {f"w{i}": torch.randn(64, 64, generator=g) for i in range(5)}  # 16 KiB each
    tensors["big"] = torch.randn(256, 64, generator=g)  # 64 KiB: over the bucket size, a bucket of its own
    blobs = list(_safetensors_buckets(tensors, bucket_bytes=40 * 2**10))
    got = [load(b) for b in blobs]
    assert [sorted(b) for b in got] == [["w0", "w1"], ["w2", "w3"], ["w4"], ["big"]]
    merged = {k: v for b in got for k, v in b.items()}
    assert all(torch.equal(merged[k], t) for k, t in tensors.items())


def test_without_vllm_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(RuntimeError, match="make install-vllm"):
        VLLMEngine(tmp_path)


def test_the_config_selects_vllm_and_describes_its_settings():
    cfg = RunConfig.model_validate({"inference": {"engine": "vllm", "on_update": "keep", "vllm": {"kv_cache_mb": 32}}})
    assert cfg.inference.engine == "vllm" and cfg.inference.on_update == "keep"
    assert cfg.inference.vllm.kv_cache_mb == 32
    for name, field in type(cfg.inference.vllm).model_fields.items():
        assert field.description, f"inference.vllm.{name} has no description"
    with pytest.raises(ValueError, match="on_update"):
        RunConfig.model_validate({"inference": {"on_update": "sometimes"}})


def test_a_vllm_worker_on_a_cuda_pool_asks_ray_for_its_tensor_parallel_gpus():
    from rollart.inference.worker import gpus_per_worker

    from rollart.config import default_pools

    pools = {"pools": {**{n: p.model_dump() for n, p in default_pools().items()},
                       "gen_decode": {"kind": "gpu", "device": "cuda"}}}
    vllm = RunConfig.model_validate({**pools, "inference": {"engine": "vllm", "vllm": {"tensor_parallel_size": 4}}})
    assert gpus_per_worker(vllm, "gen_decode") == 4.0 and gpus_per_worker(vllm, "gen_prefill") is None
    builtin = RunConfig.model_validate(pools)
    assert gpus_per_worker(builtin, "gen_decode") is None  # the placement default: one GPU
