#!/usr/bin/env bash
# Slurm template: score a corpus with vLLM servers, sharded over a job array (docs/scaling.md).
#
#   python scripts/endpoint_config.py configs/paper-llama2-7b-vs-13b.yaml > llama2-vllm.yaml
#   ingest=$(sbatch --parsable scripts/slurm_score.sh llama2-vllm.yaml)           # no array: ingest once
#   sbatch --dependency=afterok:$ingest --array=0-15 scripts/slurm_score.sh llama2-vllm.yaml
#   bbox merge -c llama2-vllm.yaml && bbox run -c llama2-vllm.yaml                # the remaining stages
#
# Array task i of n scores shard i/n of the documents for every model (one GPU, each model's
# vLLM server in turn). Without an array the job only ingests the corpus, so the tasks never race
# to write documents.parquet. Adjust the #SBATCH lines to your cluster; a failed or preempted
# task is resubmitted with the same index (its finished shards are kept).
#SBATCH --job-name=bbox-score
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=12:00:00
#SBATCH --output=slurm-%x-%A_%a.out
set -euo pipefail

CONFIG=${1:?usage: sbatch [--array=0-N] scripts/slurm_score.sh CONFIG}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-0} TOKENIZERS_PARALLELISM=false
cd "${SLURM_SUBMIT_DIR:-.}"

if [ -z "${SLURM_ARRAY_TASK_ID:-}" ]; then
  exec "${PY:-python}" -c "import sys; from bbox_sae.config import load_config; from bbox_sae.scoring.stage import ingest; ingest(load_config(sys.argv[1]))" "$CONFIG"
fi
export LOGS="vllm-logs/$SLURM_ARRAY_JOB_ID-$SLURM_ARRAY_TASK_ID"
exec bash scripts/score_with_vllm.sh "$CONFIG" --shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT"
