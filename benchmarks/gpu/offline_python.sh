# Sourced by the checks that need no package index (check_one_gpu.sh, check_algos.sh): the machine's own python3
# (PyTorch with CUDA, transformers, safetensors … — what a GPU machine's image holds) plus the wheels
# benchmarks/gpu/wheels.sh saved in .whl/ (pydantic), installed into /tmp/rollart-site when pydantic is missing.
# Sets PY and PYTHONPATH (the repository first); stops with a reason when torch sees no GPU.
PY=${PYTHON:-python3}
if ! "$PY" -c "import pydantic" 2>/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || { echo "$(basename "$0"): pydantic is missing and .whl/ holds no wheels: run benchmarks/gpu/wheels.sh where PyPI is reachable and bring .whl/ along" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rollart-site .whl/*.whl
    PYTHONPATH=/tmp/rollart-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
"$PY" -c "import torch, transformers; assert torch.cuda.is_available(), 'torch sees no CUDA device'; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.device_count(), 'GPU(s)')"
