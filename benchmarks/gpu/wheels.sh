#!/usr/bin/env bash
# The Python packages check_one_gpu.sh needs that a lent GPU machine lacks, as wheels in .whl/ (git-ignored), to carry
# there: that machine reaches no package index, and its image holds PyTorch, transformers, safetensors, numpy,
# psutil, rich and PyYAML but not pydantic. Run here (where PyPI is reachable), once; ~3 MB. The wheels are for the
# machine's Python 3.12 on x86-64, whatever this machine runs.
#
# Usage, from anywhere:  bash benchmarks/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5"
ls -la .whl
