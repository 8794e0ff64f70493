#!/usr/bin/env bash
# The trainer on a CUDA machine: FSDP2 + bf16 over NCCL (min(2, GPUs) ranks) on a Qwen3-0.6B-shaped random-init
# model — tokens/s and peak GPU memory per rank — then one weight publish into a vLLM engine, checked against a
# transformers forward of the published weights. UNTESTED: no CUDA machine was available when this was written
# (the same code paths run on CPU in `make test` and `rollart bench trainer`).
#
# Usage, from anywhere:  bash benchmarks/gpu/check_trainer.sh      (about 10 minutes, most of it the install)
# Env: VENV (default .venv-vllm-cuda, shared with check_vllm.sh), WORK (default runs/check-trainer-<time>).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-vllm-cuda}
WORK=${WORK:-runs/check-trainer-$(date +%Y%m%d-%H%M%S)}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

command -v nvidia-smi >/dev/null || { echo "check_trainer: no nvidia-smi here: this script needs a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv

# The venv: vllm (CUDA build) with rollart, shared with check_vllm.sh.
source benchmarks/gpu/cuda_venv.sh

# The trainer's unit tests in this venv first, then the check itself.
"$VENV/bin/python" -m pytest -q -ra tests/unit/test_trainer_core.py tests/unit/test_trainer_logprobs.py
"$VENV/bin/python" benchmarks/gpu/trainer_check.py "$WORK" | tee "$WORK.json"
echo "check_trainer: OK — figures in $WORK.json"
