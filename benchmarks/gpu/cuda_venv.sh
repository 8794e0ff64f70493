# Sourced by the check_*.sh scripts: make (or reuse) the CUDA venv $VENV — vllm (CUDA build) with rollart and
# the torch pinned in pyproject.toml (the [vllm] extra says which) — and check it sees the GPUs.
if [ ! -f "$VENV/.installed-stamp" ] || [ pyproject.toml -nt "$VENV/.installed-stamp" ]; then
    python3 -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/pip/', timeout=15)" 2>/dev/null || {
        echo "$(basename "$0"): this check installs vLLM (CUDA build) from PyPI, which this machine cannot reach;" \
             "benchmarks/gpu/check_one_gpu.sh is the check that runs offline on one GPU" >&2; exit 2; }
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet -e '.[dev,vllm]'
    touch "$VENV/.installed-stamp"
fi
"$VENV/bin/python" -c "import torch, vllm; assert torch.cuda.is_available(), 'torch has no CUDA'; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.device_count(), 'GPUs')"
