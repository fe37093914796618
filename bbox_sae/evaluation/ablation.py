"""Ablations: the same extraction on the same rows, with a part of the method taken out.

The full method; `output_feature_weight=0` (no performance signal: its own build and SAE in
`ablation-w0/`, sharing the run's scored words); an untrained SAE and k-means of the same width
(`baselines/`, from the run's own matrix).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from bbox_sae.artifacts import atomic_write_json
from bbox_sae.config import Config
from bbox_sae.evaluation.printing import fmt, print_table
from bbox_sae.labeling.table import labeled_features
from bbox_sae.layout import RunLayout
from bbox_sae.stages import EMBED, INGEST, SCORE
from bbox_sae.variants import BASELINES, baseline_config, extract, run_baseline, share_outputs


def ablation_variants(cfg: Config) -> dict[str, tuple[Path, Path, str]]:
    """Run the variants; returns name -> (run dir with the build, features dir, source)."""
    variants: dict[str, tuple[Path, Path, str]] = {"full": (cfg.out, cfg.out, "sae")}
    w0 = cfg.model_copy(update={"output_dir": str(cfg.paths.ablation_w0.root), "build": cfg.build.model_copy(update={"output_feature_weight": 0.0})})
    extract(w0, share_outputs(cfg, w0, (INGEST, SCORE, EMBED)))
    variants["no-performance (w=0)"] = (w0.out, w0.out, "sae")
    for baseline in BASELINES:
        run_baseline(cfg, baseline, label=True)
        out = baseline_config(cfg, baseline).out
        variants[f"{baseline} baseline"] = (out, out, baseline)
    return variants


def run_ablation(cfg: Config) -> dict:
    """`bbox eval ablation`: the ablation table on an existing run (no ground truth: kept counts and label scores)."""
    results = {}
    for name, (_, feat_dir, _) in ablation_variants(cfg).items():
        features = labeled_features(RunLayout(feat_dir))
        kept = features.filter(pc.field("kept")).to_pylist() if features.num_rows else []
        scores = [f.get("label_score") for f in kept if f.get("label_score") is not None]
        results[name] = {
            "live_latent_rows": features.num_rows,
            "kept": len(kept),
            "mean_label_score": float(np.mean(scores)) if scores else None,
            "mean_abs_median_dlogp_kept": float(np.mean([abs(f["median_dlogp"]) for f in kept])) if kept else None,
        }
    atomic_write_json(cfg.paths.ablation_results, results)
    print_table(
        "Ablations",
        ["variant", "kept", "mean label score", "mean |median Δ| (kept)"],
        [[n, r["kept"], fmt(r["mean_label_score"]), fmt(r["mean_abs_median_dlogp_kept"])] for n, r in results.items()],
    )
    return results
