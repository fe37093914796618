"""Per-feature views for the browser: contexts, the Δlog p histogram and the per-domain table.

A feature that is kept or part of a finding carries `report.examples_per_feature` contexts per
split; any other carries `report.examples_per_other_feature`; each carries how many it has. So a
report over thousands of latents stays a few MB and still self-contained.
"""

from __future__ import annotations

import numpy as np

from bbox_sae.config import ReportConfig
from bbox_sae.features.domains import NO_DOMAIN
from bbox_sae.layout import logprob_column
from bbox_sae.report.inputs import ReportInputs
from bbox_sae.report.markup import num

HIST_BINS = 20
SPLITS = ("train", "holdout")
# Rounding of per-context numbers: they are shown at three significant digits, and at full
# float precision they would be a fifth of the page.
LOGPROB_DIGITS, ACTIVATION_DIGITS = 4, 3


def acted_on(feature: dict) -> bool:
    """Kept, or a member of a finding: a feature a reader acts on, shown first and in full."""
    return feature["kept"] or feature.get("finding") is not None


def display_order(features: list[dict]) -> list[dict]:
    """Kept features (and any other finding member) first, then the largest |median Δlog p|."""
    return sorted(features, key=lambda f: (not acted_on(f), -abs(f["median_dlogp"] or 0.0), f["latent"]))


def delta(ctx: dict, a: str, b: str) -> float | None:
    la, lb = ctx.get(logprob_column(a)), ctx.get(logprob_column(b))
    return None if la is None or lb is None else num(la - lb)


def top_deltas(feature: dict, contexts: dict) -> list[float]:
    """Δlog p over the feature's top words: train contexts that survived the percentile rule."""
    train = contexts.get(feature["latent"], {}).get("train", [])
    deltas = (delta(c, feature["model_a"], feature["model_b"]) for c in train if c["in_top"])
    return [d for d in deltas if d is not None]


def delta_histogram(deltas: list[float]) -> dict | None:
    if not deltas:
        return None
    # Rounded first: deltas equal but for float noise span a range too small for HIST_BINS
    # distinct edges, which numpy refuses; equal values get a unit-wide range instead.
    counts, edges = np.histogram(np.round(np.asarray(deltas, dtype=np.float64), 6), bins=HIST_BINS)
    return {"counts": counts.tolist(), "edges": [round(float(e), 4) for e in edges]}


def context_view(ctx: dict, a: str, b: str, domains: dict[str, str]) -> dict:
    return {
        "left": ctx["left"],
        "word": ctx["word"],
        "right": ctx["right"],
        "doc_id": ctx["doc_id"],
        "word_idx": ctx["word_idx"],
        "rank": ctx["rank"],
        "activation": num(ctx.get("activation"), ACTIVATION_DIGITS),
        "in_top": bool(ctx["in_top"]),
        "domain": domains.get(ctx["doc_id"]),
        "logprob": [num(ctx.get(logprob_column(m)), LOGPROB_DIGITS) for m in (a, b)],
    }


def examples_for(feature: dict, report: ReportConfig) -> int:
    """Contexts per split embedded for this feature: `examples_per_feature` for what a reader acts on, fewer otherwise."""
    if acted_on(feature):
        return report.examples_per_feature
    return min(report.examples_per_feature, report.examples_per_other_feature)


def feature_view(feature: dict, inputs: ReportInputs, report: ReportConfig) -> dict:
    a, b = feature["model_a"], feature["model_b"]
    splits = inputs.contexts.get(feature["latent"], {})
    examples = examples_for(feature, report)
    view = dict(feature)
    view["hist"] = delta_histogram(top_deltas(feature, inputs.contexts))
    view["contexts"] = {s: [context_view(c, a, b, inputs.domains) for c in splits.get(s, [])[:examples]] for s in SPLITS}
    view["context_counts"] = {s: len(splits.get(s, [])) for s in SPLITS}
    view["domains"] = domain_rows(feature, inputs.contexts, inputs.domains, report.domain_min_words)
    return view


def domain_rows(feature: dict, contexts: dict, domains: dict[str, str], min_words: int) -> list[dict]:
    """In which domains a feature's top words occur, and whether its difference holds in each.

    Over the top words of both splits (contexts that survived the percentile rule), grouped by
    their document's domain: the count, the median Δlog p, the share of words on which the
    feature's better model wins, and `holds`: the domain's median has the feature's sign (None
    when the domain has fewer than `min_words` of them: too few to say). Most words first.
    """
    if not domains:
        return []
    a, b = feature["model_a"], feature["model_b"]
    sign = np.sign(feature["median_dlogp"] or 0.0)
    groups: dict[str, list[float]] = {}
    for split in SPLITS:
        for ctx in contexts.get(feature["latent"], {}).get(split, []):
            d = delta(ctx, a, b) if ctx["in_top"] else None
            if d is not None:
                groups.setdefault(domains.get(ctx["doc_id"], NO_DOMAIN), []).append(d)
    rows = []
    for name, deltas in groups.items():
        d = np.asarray(deltas, dtype=np.float64)
        median = float(np.median(d))
        rows.append(
            {
                "domain": name,
                "n": len(d),
                "median_dlogp": num(median, LOGPROB_DIGITS),
                "wins": num(float((np.sign(d) == sign).mean()), LOGPROB_DIGITS) if sign else None,
                "holds": bool(sign and np.sign(median) == sign) if len(d) >= min_words else None,
            }
        )
    return sorted(rows, key=lambda r: (-r["n"], r["domain"]))
