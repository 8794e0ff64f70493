#!/usr/bin/env bash
# Build the guess_env server image without a registry: rollart's environment image as the base (`make
# env-image`), openenv-core installed into a build context on the host with pip (from PyPI or pip's cache).
# Usage: examples/openenv/build_image.sh [IMAGE] [ENGINE]   (default localhost/rollart-openenv-guess:0.3.0, podman)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
image="${1:-localhost/rollart-openenv-guess:0.3.0}"
engine="${2:-podman}"
python="${PYTHON:-python3}"
context="$(mktemp -d /var/tmp/rollart-openenv-build.XXXXXX)"
trap 'rm -rf "$context"' EXIT
"$python" -m pip install --quiet --no-compile --target "$context/site" "openenv-core==0.3.0"
cp -r "$here/guess_env" "$context/guess_env"
find "$context/guess_env" -name __pycache__ -prune -exec rm -rf {} +
"$engine" build --pull=never -t "$image" -f "$here/Containerfile" "$context"
echo "built $image"
