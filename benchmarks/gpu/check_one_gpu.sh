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
PY=${PYTHON:-python3}

command -v nvidia-smi >/dev/null || { echo "check_one_gpu: no nvidia-smi here: this script needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv
if ! "$PY" -c "import pydantic" 2>/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || { echo "check_one_gpu: pydantic is missing and .whl/ holds no wheels: run benchmarks/gpu/wheels.sh where PyPI is reachable, and carry .whl" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rollart-site .whl/*.whl
    export PYTHONPATH=/tmp/rollart-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
"$PY" benchmarks/gpu/one_gpu_check.py "$WORK"
echo "check_one_gpu: OK — figures in $WORK/result.json"
