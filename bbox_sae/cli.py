"""The `bbox` command line: one subcommand per pipeline stage, plus `run`, `sweep`, `merge`, `eval`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from bbox_sae.errors import BBoxError

STAGES = ["score", "embed", "build", "train", "features", "label", "report"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="YAML config (see configs/)")
    p.add_argument("--output-dir", "-o", default=None, help="overrides the config's output_dir")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config field, e.g. sae.k=32 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bbox", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("score", help="ingest the corpus and score every word with every model")
    _common(p)
    p.add_argument("--shard", default=None, help="i/n: score a deterministic 1/n of the documents")
    p.add_argument("--model", action="append", default=None, help="only this model (repeatable)")

    p = sub.add_parser("merge", help="check that all scoring shards are complete and intact")
    _common(p)

    for name, help_text in [
        ("embed", "contextual word embeddings"),
        ("build", "performance-aware embedding matrix"),
        ("label", "label kept features (LLM endpoint or heuristic)"),
        ("report", "W&B tables, report.html and report.md"),
    ]:
        p = sub.add_parser(name, help=help_text)
        _common(p)

    p = sub.add_parser("train", help="train the sparse autoencoder with sae-lens")
    _common(p)
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")

    p = sub.add_parser("sweep", help="train one SAE per combination of list-valued sae.* fields")
    _common(p)
    p.add_argument("--wandb-sweep-yaml", default=None, help="also write an equivalent W&B sweep YAML here")

    p = sub.add_parser("features", help="top activations, statistics, held-out validity, filtering")
    _common(p)
    p.add_argument("--baseline", choices=["random", "kmeans"], default=None, help="extract from a baseline instead of the trained SAE")

    p = sub.add_parser("run", help="every stage in order, skipping those already up to date")
    _common(p)
    p.add_argument("--force", action="append", default=[], choices=STAGES, help="redo this stage (and those after it)")

    p = sub.add_parser("eval", help="evidence: planted-difference recovery and the null pair, ablations, coherence of a run")
    p.add_argument("what", choices=["planted", "ablation", "coherence"])
    _common(p)
    p.add_argument("--rules", default=None, help="YAML file of planted rules (default configs/planted-rules-shakespeare.yaml)")
    p.add_argument("--null-seeds", type=int, default=3, help="eval planted: null-pair runs (seeds 0..N-1); 0 skips them")
    p.add_argument("--ablations", action="store_true", help="eval planted: also the w=0, untrained-SAE and k-means variants")
    return parser


def _load(args):
    from bbox_sae.config import load_config, save_resolved

    cfg = load_config(args.config, args.overrides, args.output_dir)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    save_resolved(cfg)
    return cfg


def _print(result) -> None:
    if result is not None:
        print(json.dumps(result, indent=2, default=str))


def dispatch(args) -> int:
    cmd = args.command
    if cmd == "sweep":
        from bbox_sae.sweep import run_sweep

        run_sweep(args.config, args.overrides, args.output_dir, wandb_sweep_yaml=args.wandb_sweep_yaml)
        return 0
    cfg = _load(args)
    if cmd == "score":
        from bbox_sae.scoring.stage import run_score

        _print(run_score(cfg, args.model, args.shard))
    elif cmd == "merge":
        from bbox_sae.scoring.stage import merge

        merge(cfg)
        print("all shards complete and intact")
    elif cmd == "embed":
        from bbox_sae.embedding import run_embed

        _print(run_embed(cfg))
    elif cmd == "build":
        from bbox_sae.dataset import run_build

        _print(run_build(cfg))
    elif cmd == "train":
        from bbox_sae.sae import run_train

        _print(run_train(cfg, resume=args.resume))
    elif cmd == "features":
        from bbox_sae.features import run_features

        _print(run_features(cfg, baseline=args.baseline))
    elif cmd == "label":
        from bbox_sae.labeling import run_label

        _print(run_label(cfg))
    elif cmd == "report":
        from bbox_sae.report import run_report

        _print(run_report(cfg))
    elif cmd == "run":
        from bbox_sae.pipeline import run_all

        run_all(cfg, force=args.force)
    elif cmd == "eval" and args.what == "planted":
        from bbox_sae.evaluation import run_planted

        run_planted(cfg, rules_path=args.rules, null_seeds=tuple(range(args.null_seeds)), ablations=args.ablations)
    elif cmd == "eval" and args.what == "coherence":
        from bbox_sae.evaluation import run_coherence

        run_coherence(cfg)
    elif cmd == "eval":
        from bbox_sae.evaluation import run_ablation

        run_ablation(cfg)
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return dispatch(args)
    except BBoxError as err:
        print(f"bbox: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bbox: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
