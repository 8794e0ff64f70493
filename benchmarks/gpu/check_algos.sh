#!/usr/bin/env bash
# Every registered algorithm (train.algorithm) for a few train steps on CUDA: FSDP2 + bf16 over NCCL
# (min(2, GPUs) ranks) on a Qwen3-0.6B-shaped random-init model — losses, grad norms, the mismatch metrics, ppo's
# critic share, peak GPU memory. UNTESTED: no CUDA machine was available when this was written (the same code
# paths run on CPU in `make test` and `rollart bench algos`). Needs no package index: the machine's own PyTorch
# and the wheels of benchmarks/gpu/wheels.sh (offline_python.sh), so one GPU with no network runs it.
#
# Usage, from anywhere:  bash benchmarks/gpu/check_algos.sh      (a few minutes)
# Env: WORK (default runs/check-algos-<time>), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-runs/check-algos-$(date +%Y%m%d-%H%M%S)}

command -v nvidia-smi >/dev/null || { echo "check_algos: no nvidia-smi here: this script needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv

source benchmarks/gpu/offline_python.sh

"$PY" -m pytest -q -ra -p no:cacheprovider tests/contracts/test_algorithm_contract.py tests/unit/test_algo_ppo.py
mkdir -p "$(dirname "$WORK")"
"$PY" benchmarks/gpu/algos_check.py "$WORK" | tee "$WORK.json"
echo "check_algos: OK — figures in $WORK.json"
