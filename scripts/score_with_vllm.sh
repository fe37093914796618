#!/usr/bin/env bash
# Score every endpoint model of CONFIG with vLLM servers started here, one model at a time.
#
#   bash scripts/score_with_vllm.sh CONFIG [--shard i/n]
#
# CONFIG comes from scripts/endpoint_config.py: model i's replica r is served on port
# 8000 + 100*i + r, on the r-th visible GPU (give --replicas = the GPUs of this machine or job).
# For each model: start its replicas, wait until they answer /health, `bbox score --model NAME`
# (with --shard when given), stop them. One model at a time, so a 13B model gets a GPU's memory
# to itself. Finished shards are never redone, so a preempted job is simply resubmitted.
# Environment: BBOX (default `bbox`), VLLM (default `vllm`), VLLM_ARGS (extra `vllm serve` flags),
# HEALTH_TIMEOUT_S (default 1800: first start downloads the weights).
set -euo pipefail

CONFIG=${1:?usage: score_with_vllm.sh CONFIG [--shard i/n]}
shift
BBOX=${BBOX:-bbox}
VLLM=${VLLM:-vllm}
HEALTH_TIMEOUT_S=${HEALTH_TIMEOUT_S:-1800}
PY=${PY:-python}
LOGS=${LOGS:-vllm-logs}
mkdir -p "$LOGS"

pids=()
stop_servers() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_servers EXIT

# name, served model, window and ports of every endpoint model: "name model window port,port".
mapfile -t MODELS < <("$PY" - "$CONFIG" <<'PYEOF'
import sys
from urllib.parse import urlparse
from bbox_sae.config import load_config
for m in load_config(sys.argv[1]).models:
    if m.source == "endpoint":
        ports = ",".join(str(urlparse(e).port) for e in m.endpoints)
        print(m.name, m.served_model or m.name, m.window, ports)
PYEOF
)

for line in "${MODELS[@]}"; do
  read -r name served window ports <<<"$line"
  IFS=, read -ra port_list <<<"$ports"
  # Replica r takes the r-th GPU this job may use (Slurm sets CUDA_VISIBLE_DEVICES to its allocation).
  IFS=, read -ra gpus <<<"${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((${#port_list[@]} - 1)))}"
  if [ "${#gpus[@]}" -lt "${#port_list[@]}" ]; then
    echo "model $name has ${#port_list[@]} replicas but only ${#gpus[@]} GPU(s) are visible" >&2; exit 1
  fi
  for r in "${!port_list[@]}"; do
    port=${port_list[$r]}
    # Prefix caching off: vLLM computes no prompt log-probs for cached prefix tokens.
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=${gpus[$r]} "$VLLM" serve "$served" --port "$port" --host 127.0.0.1 --dtype bfloat16 \
      --max-model-len "$window" --no-enable-prefix-caching ${VLLM_ARGS:-} >"$LOGS/$name-$port.log" 2>&1 &
    pids+=($!)
  done
  for port in "${port_list[@]}"; do
    waited=0
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
      sleep 5; waited=$((waited + 5))
      if [ "$waited" -ge "$HEALTH_TIMEOUT_S" ]; then echo "vLLM for $name on port $port not healthy after ${waited}s (see $LOGS/)" >&2; exit 1; fi
    done
  done
  "$BBOX" score -c "$CONFIG" --model "$name" "$@"
  stop_servers
done
