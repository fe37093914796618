"""Every stage of a config on a slice of its corpus, one `bbox <stage>` process each: stage times,
peak RSS, scoring tokens/s per model, embedding words/s and SAE rows/s. The end-to-end step of
benchmarks/gpu_check.sh (a paper pair on a lent GPU; a tiny project on a CPU in its tests).

    .venv/bin/python benchmarks/pipeline_check.py --config configs/paper-olmo2-7b-vs-13b.yaml --device cuda --docs 64
    .venv/bin/python benchmarks/pipeline_check.py --config runs/tiny.yaml --device cpu --docs 6 --sae-rows 4096

The slice is the config's corpus cut to `--docs` documents (`corpus.max_docs`); every model scored
in process, the encoder and the SAE run on `--device`; the SAE sees `--sae-rows` rows; labels are
the offline heuristic's and W&B is off, so the check needs no network once the weights are cached.
`--model-batch` sets every in-process model's batch_size (an H200 holds far more than the configs'
defaults, which are sized for smaller GPUs).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, load_snapshot, results_header, run_stage, write_results  # noqa: E402

from bbox_sae.config import load_config  # noqa: E402
from bbox_sae.config.loading import load_raw  # noqa: E402
from bbox_sae.manifest import Manifest  # noqa: E402
from bbox_sae.stages import STAGE_NAMES  # noqa: E402

NAME = "pipeline"


def slice_overrides(config: Path, args) -> list[str]:
    raw = load_raw(config)
    sets = [
        f"output_dir={args.run_dir}",
        f"corpus.max_docs={args.docs}",
        f"embedding.device={args.device}",
        f"sae.device={args.device}",
        f"sae.total_rows={args.sae_rows}",
        "label.labeler=heuristic",
        "wandb.mode=disabled",
    ]
    for i, model in enumerate(raw.get("models", [])):
        if model.get("source", "hf") in ("hf", "gguf"):
            sets.append(f"models.{i}.device={args.device}")
            if args.model_batch:
                sets.append(f"models.{i}.batch_size={args.model_batch}")
    return [*sets, *args.set]


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--docs", type=int, default=64, help="documents of the corpus in the slice")
    p.add_argument("--sae-rows", type=int, default=1_000_000, help="sae.total_rows")
    p.add_argument("--model-batch", type=int, default=None, help="batch_size of every in-process model")
    p.add_argument("--run-dir", default=None, help="the slice's output dir (default: <results-dir>/pipeline-run, emptied first)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides")
    args = p.parse_args()
    args.threads = args.threads or 1
    config = Path(args.config).resolve()
    args.run_dir = str(Path(args.run_dir or Path(args.results_dir) / "pipeline-run").resolve())
    shutil.rmtree(args.run_dir, ignore_errors=True)
    sets = slice_overrides(config, args)
    cfg = load_config(config, sets)
    load_before = load_snapshot()
    stages = {}
    for stage in STAGE_NAMES:
        seconds, rss = run_stage(stage, config, sets, args.threads)
        stages[stage] = {"seconds": seconds, "peak_rss_mb": rss}
        print(f"stage {stage}: {seconds:.1f} s, peak RSS {rss:.0f} MiB", flush=True)
    recorded = Manifest.read(cfg.out)
    scoring = json.loads(cfg.paths.score_stats(0, 1).read_text())
    embed, train = recorded.get("embed").result, recorded.get("train").result
    rates = {
        "scoring_tokens_per_s": {m: r["tokens_per_s"] for m, r in scoring.items() if r.get("tokens")},
        "embed_words_per_s": embed.get("words_per_s"),
        "sae_rows_per_s": train.get("rows_per_s"),
        "sae_device": train.get("device"),
    }
    for model, rate in rates["scoring_tokens_per_s"].items():
        print(f"scoring {model}: {rate:,.0f} tokens/s")
    print(f"embedding: {rates['embed_words_per_s']:,.0f} words/s; SAE: {rates['sae_rows_per_s']:,.0f} rows/s on {rates['sae_device']}")
    payload = {
        **results_header(args, NAME, args.threads, args.device),
        "config": str(config),
        "overrides": sets,
        "words": recorded.get("ingest").result.get("words"),
        "stages": stages,
        "total_s": round(sum(s["seconds"] for s in stages.values()), 2),
        **rates,
        "load_before": load_before,
        "load_after": load_snapshot(),
    }
    write_results(args, NAME, payload)


if __name__ == "__main__":
    main()
