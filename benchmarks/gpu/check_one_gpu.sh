#!/usr/bin/env bash
# What a lent GPU machine (one GPU, no network, its own PyTorch; no Ray, no vLLM) can check in one short run: the
# trainer rank (FSDP2 + bf16) on a Qwen3-0.6B-shaped model, its rows sent over the weight group to a receiver bit
# for bit, and the built-in engine serving them on the GPU (benchmarks/gpu/one_gpu_check.py says what each part
# measures). Its steps run on CPU in `make test` (tests/integration/test_gpu_checks.py); on a GPU it has not run yet.
#
# Here first (PyPI reachable):   bash benchmarks/gpu/wheels.sh      (pydantic for Python 3.12, into .whl/)
# There, carrying .whl:          bash benchmarks/gpu/check_one_gpu.sh [WORK]   (a few minutes; WORK default
#                                runs/check-one-gpu-<time>; the figures in WORK/result.json, also printed).
# WORK holds the models too (~10 GB): where only a results folder comes back, keep WORK elsewhere and copy
# WORK/result.json there.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-runs/check-one-gpu-$(date +%Y%m%d-%H%M%S)}

command -v nvidia-smi >/dev/null || { echo "check_one_gpu: no nvidia-smi here: this script needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv
source benchmarks/gpu/offline_python.sh
"$PY" benchmarks/gpu/one_gpu_check.py "$WORK"
echo "check_one_gpu: OK — figures in $WORK/result.json"
