#!/usr/bin/env bash
# Run the tests that need a real NVIDIA GPU (the `gpu` marker), on a machine that has one.
#
#   bash scripts/gpu-test.sh            # in a Python that already has torch with CUDA
#
# It installs envdoctor with --no-deps into a private directory (the GPU image already
# has torch, nvidia-ml-py, psutil, prometheus-client, typer and rich, and its torch must
# not be replaced), then runs `pytest -m gpu` with the figures printed (-s). Where there
# is no driver every test skips with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SITE="$(mktemp -d)"
"$PY" -m pip install --quiet --no-deps --no-build-isolation --target "$SITE" . >/dev/null
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "== GPU and driver"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv || true
echo "== torch"
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.backends.cudnn.version())" || true
echo "== pytest -m gpu"
cd tests
# Only the files that hold gpu tests: the rest need test-only packages this image may lack.
mapfile -t FILES < <(grep -l "pytest.mark.gpu" ./*.py)
exec "$PY" -m pytest -p no:cacheprovider -m gpu -v -s -o addopts="" "${FILES[@]}" "$@"
