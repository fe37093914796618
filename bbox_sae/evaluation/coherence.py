"""Measures that need no ground truth: how nameable a run's findings are, and how stable across SAE seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import atomic_write_json, read_table
from bbox_sae.config import Config
from bbox_sae.evaluation.printing import fmt, print_table
from bbox_sae.labeling.table import labeled_features
from bbox_sae.layout import RunLayout
from bbox_sae.schemas import latent_ids


def coherence_summary(features: pa.Table, findings: pa.Table) -> dict:
    """Label-free and label-based coherence of a run's kept latents and findings."""
    kept = features.filter(pc.field("kept")).to_pylist() if features.num_rows else []
    rule_f1 = [f["rule_f1"] for f in kept if f.get("rule_f1") is not None]
    scores = [f["label_score"] for f in kept if f.get("label_score") is not None]
    return {
        "kept_latents": len(kept),
        "findings": findings.num_rows,
        "median_rule_f1": float(np.median(rule_f1)) if rule_f1 else None,
        "share_rule_f1_at_least_0.5": float(np.mean(np.array(rule_f1) >= 0.5)) if rule_f1 else None,
        "median_label_score": float(np.median(scores)) if scores else None,
        "share_label_score_at_least_0.75": float(np.mean(np.array(scores) >= 0.75)) if scores else None,
        "mixture_labels": sum(1 for f in kept if (f.get("label") or "").startswith("mixed words")),
        # Latents that also fire on forms outside their findings' rules (said in the label).
        "broader_than_finding": sum(1 for f in kept if f.get("label_source") == "rule" and f.get("label_coherent") is False),
    }


def run_coherence(cfg: Config) -> dict:
    """`bbox eval coherence`: how nameable a finished run's findings are (no ground truth needed)."""
    summary = coherence_summary(labeled_features(cfg.paths), read_table(cfg.paths.findings))
    atomic_write_json(cfg.paths.coherence, summary)
    print_table("Coherence of kept latents", ["measure", "value"], [[k, fmt(v)] for k, v in summary.items()])
    return summary


def _finding_rows(run_dir: Path) -> list[tuple[str, str | None, set[tuple[str, int]]]]:
    """Per finding of a run: its winner, its rule, and its train top words as (doc_id, word_idx)."""
    tables = RunLayout(run_dir)
    findings = read_table(tables.findings).to_pylist()
    features = read_table(tables.features)
    n_top = dict(zip(features["latent"].to_pylist(), features["n_top"].to_pylist()))
    top = read_table(tables.top_activations).filter(pc.field("split") == "train")
    keys = list(zip(top["doc_id"].to_pylist(), top["word_idx"].to_pylist()))
    by_latent: dict[int, list] = {}
    for latent, rank, key in zip(top["latent"].to_pylist(), top["rank"].to_pylist(), keys):
        by_latent.setdefault(latent, []).append((rank, key))
    out = []
    for f in findings:
        words = set()
        for m in latent_ids(f["latents"]):
            words |= {k for _, k in sorted(by_latent.get(m, []))[: n_top.get(m, 0)]}
        out.append((f["better_model"], f["statement"], words))
    return out


def stability(run_dirs: list[Path], min_overlap: float = 0.3) -> dict:
    """Share of the first run's findings that reappear in at least half of the other runs (other SAE
    seeds): same winner and the same rule, or top words overlapping (Jaccard) by `min_overlap`."""
    runs = [_finding_rows(d) for d in run_dirs]
    first, others = runs[0], runs[1:]

    def found(f, run) -> bool:
        return any(g[0] == f[0] and ((f[1] and f[1] == g[1]) or len(f[2] & g[2]) / max(len(f[2] | g[2]), 1) >= min_overlap) for g in run)

    stable = [sum(found(f, run) for run in others) >= max(1, len(others) / 2) for f in first]
    return {
        "findings": len(first),
        "stable": int(sum(stable)),
        "stable_share": float(np.mean(stable)) if stable else None,
        "findings_per_seed": [len(r) for r in runs],
    }
