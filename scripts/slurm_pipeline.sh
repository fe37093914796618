#!/usr/bin/env bash
# Slurm: the whole pipeline as three dependent jobs (docs/scaling.md).
#
#   bash scripts/slurm_pipeline.sh CONFIG N        # on the login node: submits the three jobs
#
# 1. ingest: reads the corpus once (no array, so the workers never race to write it).
# 2. an array of N tasks: task i scores shard i/n with every model (endpoint models behind their
#    own vLLM servers on the task's GPU, scripts/score_with_vllm.sh; in-process models with
#    `bbox score --shard i/n`), then embeds the same shard (`bbox embed --shard i/n`).
# 3. the rest on one GPU node: `bbox merge` checks every shard of both stages, then `bbox run`
#    builds the matrix, trains the SAE, and writes features, labels and the report.
# Shard k of the documents (`corpus.shard_docs` per shard) belongs to task k mod N. Every finished
# shard is written atomically with a checksum and never redone: a failed or preempted task is
# resubmitted with its index (`PHASE=shards sbatch --array=7 scripts/slurm_pipeline.sh CONFIG`).
# Edit the #SBATCH lines for your cluster; SBATCH_ARGS adds options to every submission,
# VLLM_ARGS flags to `vllm serve`, BBOX the command (default `bbox`).
#SBATCH --job-name=bbox
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=12:00:00
#SBATCH --output=slurm-%x-%A_%a.out
set -euo pipefail

CONFIG=${1:?usage: bash scripts/slurm_pipeline.sh CONFIG N}
BBOX=${BBOX:-bbox}
SBATCH=${SBATCH:-sbatch}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-0} TOKENIZERS_PARALLELISM=false
cd "${SLURM_SUBMIT_DIR:-.}"

case "${PHASE:-submit}" in
  submit)
    N=${2:?usage: bash scripts/slurm_pipeline.sh CONFIG N}
    script=$(realpath "$0")
    read -ra extra <<<"${SBATCH_ARGS:-}"
    ingest=$("$SBATCH" --parsable "${extra[@]}" --export=ALL,PHASE=ingest --job-name=bbox-ingest "$script" "$CONFIG")
    shards=$("$SBATCH" --parsable "${extra[@]}" --export=ALL,PHASE=shards --job-name=bbox-shards \
      --dependency="afterok:$ingest" --array="0-$((N - 1))" "$script" "$CONFIG")
    rest=$("$SBATCH" --parsable "${extra[@]}" --export=ALL,PHASE=rest --job-name=bbox-rest \
      --dependency="afterok:$shards" "$script" "$CONFIG")
    echo "ingest $ingest, shards $shards (array 0-$((N - 1))), rest $rest"
    ;;
  ingest)
    "$BBOX" ingest -c "$CONFIG"
    ;;
  shards)
    shard="${SLURM_ARRAY_TASK_ID:?PHASE=shards runs as an array task}/${SLURM_ARRAY_TASK_COUNT:?}"
    export LOGS="vllm-logs/${SLURM_ARRAY_JOB_ID:-job}-$SLURM_ARRAY_TASK_ID"
    BBOX="$BBOX" bash scripts/score_with_vllm.sh "$CONFIG" --shard "$shard"
    # In-process and `source: parquet` models; endpoint models' shards are done and start nothing.
    "$BBOX" score -c "$CONFIG" --shard "$shard"
    "$BBOX" embed -c "$CONFIG" --shard "$shard"
    ;;
  rest)
    "$BBOX" merge -c "$CONFIG" --stage score --stage embed
    "$BBOX" run -c "$CONFIG"
    ;;
  *)
    echo "PHASE must be submit, ingest, shards or rest (got '$PHASE')" >&2
    exit 2
    ;;
esac
