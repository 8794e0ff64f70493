#!/usr/bin/env bash
# Weights from FSDP2 shards to a vLLM engine over NCCL (weights.transport=collective's protocol on GPUs): each trainer
# rank sends its own shard's rows, the engine receives them into GPU tensors and reloads; then its greedy
# continuation is scored against a transformers forward of the trained weights. UNTESTED: no CUDA machine was
# available when this was written (the same protocol over gloo is tested on CPU by
# tests/integration/test_weights_collective.py and measured by `rollart bench weights`). Needs 2 GPUs or more.
#
# Usage, from anywhere:  bash benchmarks/gpu/check_weights.sh      (about 10 minutes, most of it the install)
# Env: VENV (default .venv-vllm-cuda, shared with check_vllm.sh), WORK (default runs/check-weights-<time>).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-vllm-cuda}
WORK=${WORK:-runs/check-weights-$(date +%Y%m%d-%H%M%S)}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

command -v nvidia-smi >/dev/null || { echo "check_weights: no nvidia-smi here: this script needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv
GPUS=$(nvidia-smi --list-gpus | wc -l)
[ "$GPUS" -ge 2 ] || { echo "check_weights: $GPUS GPU here; it needs 2 (NCCL refuses two members of one communicator on one device): benchmarks/gpu/check_one_gpu.sh runs on one" >&2; exit 2; }

source benchmarks/gpu/cuda_venv.sh
"$VENV/bin/python" -m pytest -q -ra tests/unit/test_weights_shard_plan.py
"$VENV/bin/python" benchmarks/gpu/weights_nccl_check.py "$WORK" | tee "$WORK.json"
echo "check_weights: OK — figures in $WORK.json"
