#!/usr/bin/env bash
# Every registered algorithm (train.algorithm) for a few train steps on CUDA: FSDP2 + bf16 over NCCL
# (min(2, GPUs) ranks) on a Qwen3-0.6B-shaped random-init model — losses, grad norms, the mismatch metrics, ppo's
# critic share, peak GPU memory. UNTESTED: no CUDA machine was available when this was written (the same code
# paths run on CPU in `make test` and `rollart bench algos`).
#
# Usage, from anywhere:  bash benchmarks/gpu/check_algos.sh      (about 10 minutes, most of it the install)
# Env: VENV (default .venv-vllm-cuda, shared with check_vllm.sh), WORK (default runs/check-algos-<time>).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-vllm-cuda}
WORK=${WORK:-runs/check-algos-$(date +%Y%m%d-%H%M%S)}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

command -v nvidia-smi >/dev/null || { echo "check_algos: no nvidia-smi here: this script needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv

source benchmarks/gpu/cuda_venv.sh

"$VENV/bin/python" -m pytest -q -ra tests/contracts/test_algorithm_contract.py tests/unit/test_algo_ppo.py
"$VENV/bin/python" benchmarks/gpu/algos_check.py "$WORK" | tee "$WORK.json"
echo "check_algos: OK — figures in $WORK.json"
