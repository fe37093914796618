"""Per-latent Δ statistics (selection on train top words, test on holdout top words), the
filters that keep a latent, and the corpus-level comparison."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from bbox_sae.config import FeaturesConfig
from bbox_sae.features.activations import TopActivations, top_words
from bbox_sae.features.findings import top_forms
from bbox_sae.features.significance import bh_qvalues, coherence, delta_stats, generalizes
from bbox_sae.layout import logprob_column


def pair_stats(
    rows: np.ndarray, holdout_rows: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, n_boot: int, seed: int, doc_by_row: np.ndarray | None = None
) -> dict:
    """Δ statistics on the train top words (selection, shown) and on the holdout top words (the test);
    with `doc_by_row`, the held-out CI resamples documents (`significance.bootstrap_median_ci`) and
    `holdout_docs` counts the documents the held-out words span."""
    d = lp_a[rows] - lp_b[rows]
    dp = np.exp(lp_a[rows]) - np.exp(lp_b[rows])
    stats = delta_stats(d, dp, n_boot, seed)
    hd = lp_a[holdout_rows] - lp_b[holdout_rows]
    hdp = np.exp(lp_a[holdout_rows]) - np.exp(lp_b[holdout_rows])
    held = delta_stats(hd, hdp, n_boot, seed + 1, groups=None if doc_by_row is None else doc_by_row[holdout_rows])
    return {
        **stats,
        "holdout_median_dlogp": held["median_dlogp"],
        "holdout_mean_dlogp": held["mean_dlogp"],
        "holdout_median_dp": held["median_dp"],
        "holdout_ci_low": held["ci_low"],
        "holdout_ci_high": held["ci_high"],
        "holdout_p_value": held["p_value"],
        "generalizes": generalizes(stats["median_dlogp"], held["median_dlogp"]),
        **({} if doc_by_row is None else {"holdout_docs": int(len(np.unique(doc_by_row[holdout_rows])))}),
    }


def feature_rows(
    top: TopActivations,
    lp_by_row: dict[str, np.ndarray],
    words_by_row: np.ndarray,
    embedding_of: Callable[[np.ndarray], np.ndarray],
    pairs: list[tuple[str, str]],
    fcfg: FeaturesConfig,
    seed: int,
    source: str,
) -> list[dict]:
    out = []
    n_latents = top.values["train"].shape[0]
    for latent in tqdm(range(n_latents), desc="features: statistics", unit="latent", leave=False):
        kept_rows = top_words(top, "train", latent)
        if len(kept_rows) == 0:
            continue
        h_rows = top_words(top, "holdout", latent)
        common = {
            "latent": latent,
            "n_top": int(len(kept_rows)),
            "density": float(top.fire_counts[latent] / max(top.n_rows, 1)),
            "max_activation": float(top.values["train"][latent].max()),
            "coherence": coherence(embedding_of(kept_rows)),
            "holdout_n": int(len(h_rows)),
            "top_words": top_forms(words_by_row[kept_rows]),
            "source": source,
        }
        for a, b in pairs:
            stats = pair_stats(kept_rows, h_rows, lp_by_row[a], lp_by_row[b], fcfg.bootstrap_samples, seed + latent)
            out.append({**common, "model_a": a, "model_b": b, **stats})
    return out


def apply_filters(rows: list[dict], fcfg: FeaturesConfig) -> list[dict]:
    """The rows with q_value, paper_rule, passes_delta, kept and better_model added.

    q-values (BH, per pair, across latents) come from the holdout test, so significance is never
    computed on the words whose Δ chose them."""
    q_of: dict[int, float] = {}
    for pair in sorted({(r["model_a"], r["model_b"]) for r in rows}):
        mine = [i for i, r in enumerate(rows) if (r["model_a"], r["model_b"]) == pair]
        q = bh_qvalues(np.array([rows[i]["holdout_p_value"] for i in mine], dtype=np.float64))
        q_of.update({i: float(qv) for i, qv in zip(mine, q)})
    out = []
    for i, r in enumerate(rows):
        med, mdp, q_value = r["median_dlogp"], r["median_dp"], q_of[i]
        paper_rule = bool(abs(med) > fcfg.min_abs_median_dlogp or abs(mdp) > fcfg.min_abs_median_dp)
        significant = (not fcfg.require_significance) or (np.isfinite(q_value) and q_value < fcfg.q_threshold)
        valid = (not fcfg.require_generalize) or r["generalizes"]
        enough = r["n_top"] >= fcfg.min_activations and r["holdout_n"] >= fcfg.min_activations
        passes = bool(paper_rule and significant and valid and enough)
        better = r["model_a"] if med > 0 else r["model_b"] if med < 0 else None
        out.append({**r, "q_value": q_value, "paper_rule": paper_rule, "passes_delta": passes, "kept": passes, "better_model": better})
    return out


def corpus_stats(index: pa.Table, models: list[str], pairs: list[tuple[str, str]], n_docs: int) -> dict:
    out = {"documents": n_docs, "words": index.num_rows, "models": {}, "pairs": [list(p) for p in pairs], "pair_stats": {}}
    for m in models:
        lp = index[logprob_column(m)].to_numpy()
        out["models"][m] = {"mean_logprob": float(lp.mean()), "perplexity": float(np.exp(-lp.mean())), "words": int(len(lp))}
    for a, b in pairs:
        d = index[logprob_column(a)].to_numpy() - index[logprob_column(b)].to_numpy()
        out["pair_stats"][f"{a} vs {b}"] = {"mean_dlogp": float(d.mean()), "median_dlogp": float(np.median(d)), "share_a_better": float((d > 0).mean())}
    return out


def print_summary(findings: pa.Table, features: pa.Table, stats: dict, limit: int = 25) -> None:
    from rich.console import Console
    from rich.table import Table

    # Piped to a log, a table at 80 columns breaks statements mid-word: give it the width it needs.
    console = Console() if sys.stdout.isatty() else Console(width=240)
    header = Table(title="Corpus-level comparison (same words)")
    for col in ("model", "mean log p", "perplexity", "words"):
        header.add_column(col)
    for m, s in stats["models"].items():
        header.add_row(m, f"{s['mean_logprob']:.3f}", f"{s['perplexity']:.2f}", str(s["words"]))
    console.print(header)
    n_kept = int(pc.sum(features["kept"]).as_py() or 0) if features.num_rows else 0
    table = Table(title=f"Findings: {findings.num_rows} ({n_kept} kept latents of {features.num_rows} live latent rows)")
    for col in ("finding", "better", "holdout Δlog p [95% CI]", "n (documents)", "statement (kind)", "latents", "top words"):
        table.add_column(col)
    for r in findings.to_pylist()[:limit]:
        rests_on = f"; rests on {r['artifact']}" if r.get("artifact") else ""
        table.add_row(
            str(r["finding"]),
            str(r["better_model"]),
            f"{r['holdout_median_dlogp']:+.2f} [{r['holdout_ci_low']:+.2f}, {r['holdout_ci_high']:+.2f}]",
            f"{r['holdout_n']} ({r['holdout_docs']})" if r.get("holdout_docs") is not None else str(r["holdout_n"]),
            f"{r['statement']} ({r['kind']}{rests_on})" if r["statement"] else "-",
            str(r["latents"]),
            (r["top_words"] or "")[:50],
        )
    console.print(table)
