#!/usr/bin/env bash
# What an offline GPU box (python 3.12, its own torch and transformers) lacks to run
# `bash benchmarks/gpu_check.sh --tiny --wheels .whl` and the tests: the wheels below (pip --no-deps, so each
# dependency is named; the set that ran on an H200 image with torch 2.11 and transformers 5.17),
# and the packaged tokenizers for the tiny project (tests/helpers/assets.py), as one tar.
#
#   bash scripts/device_wheels.sh [DIR]     # default .whl (ignore it: echo /.whl/ >> .git/info/exclude)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PY:-.venv/bin/python}
mkdir -p "$DIR"
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
args=(--no-deps --only-binary=:all: --implementation cp --python-version 3.12 -d "$DIR")
for p in "${platforms[@]}"; do args+=(--platform "$p"); done
# sae-lens and what it imports at import time that such an image lacks (wandb is imported by
# sae_lens.config), pydantic and gguf for bbox_sae, openai for its labeler.
PIP_CONSTRAINT= "$PY" -m pip download -q "${args[@]}" \
  sae-lens==6.54.12 transformer-lens==3.9.0 wandb==0.31.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  simple-parsing==0.1.9 docstring-parser==0.18.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0 protobuf==7.36.2 gguf==0.19.0 openai==3.57.0 jiter==0.19.0 \
  distro==1.9.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 tenacity==9.2.1 \
  beartype==0.23.1 better-abc==0.0.3 fancy-einsum==0.0.3 typeguard==4.6.1 importlib-resources==7.1.0 \
  platformdirs==4.14.9 python-dotenv==1.2.4 cwevals==0.0.1b1 googleapis-common-protos==1.76.0 \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 \
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 \
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-otlp-common==0.66b2 \
  opentelemetry-exporter-http-transport==0.66b2
# What the tests need beside those, to run the suite at the box's own torch and transformers.
PIP_CONSTRAINT= "$PY" -m pip download -q "${args[@]}" \
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-timeout==2.4.0 hypothesis==6.170.17 sortedcontainers==2.4.0 \
  zstandard==0.25.0 psutil==7.2.2
# The tokenizers the tests build tiny models on, read from the installed model packages.
PYTHONPATH=tests "$PY" -c "from helpers.assets import tokenizer_dir; [tokenizer_dir(k) for k in ('smollm2', 'gemma', 'minilm')]"
tar -C "${BBOX_TEST_ASSETS:-.cache/test-assets}" -cJf "$DIR/tiny-tokenizers.tar.xz" tokenizers
du -sh "$DIR"
