"""Feature extraction: latents become findings ("model A beats B on this group of words").

For every latent: its top-N activations on the train split and, apart, on the holdout split
(streamed); on the top words after the paper's percentile rule, Δ = log p_A − log p_B
statistics (median, mean, median Δp, sign consistency, bootstrap CI, Wilcoxon p), BH q-values
across latents, density and context coherence; held-out validity on the holdout top words.
A latent is `kept` when the paper's rule, significance and held-out validity all hold.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import torch
from tqdm.auto import tqdm

from bbox_sae.artifacts import atomic_write_json, atomic_write_table, read_table, resolve_files
from bbox_sae.config import Config, FeaturesConfig
from bbox_sae.dataset import open_matrix
from bbox_sae.stats import StreamingTopN, bh_qvalues, coherence, delta_stats, generalizes, percentile_rule

log = logging.getLogger(__name__)

Encoder = Callable[[torch.Tensor], torch.Tensor]


def normalize_word(word: str) -> str:
    stripped = word.strip()
    if not stripped:
        return "\\n" * word.count("\n") if "\n" in word else "␣"
    return stripped.lower()


# ---------------------------------------------------------------- encoders

def sae_encoder(sae) -> Encoder:
    device = next(sae.parameters()).device

    @torch.no_grad()
    def encode(x: torch.Tensor) -> torch.Tensor:
        return sae.encode(x.to(device)).float().cpu()

    return encode


def random_sae_encoder(cfg: Config, d_in: int, mean: np.ndarray) -> Encoder:
    """An untrained TopK SAE of the trained one's shape (per-row top-k, so it can encode any row)."""
    from bbox_sae.sae import make_training_sae

    torch.manual_seed(cfg.sae.seed)
    random_cfg = cfg.sae.model_copy(update={"architecture": "topk"})
    sae = make_training_sae(random_cfg, d_in, "cpu")
    with torch.no_grad():
        sae.b_dec.data = torch.from_numpy(mean).to(sae.b_dec)
    sae.eval()
    return sae_encoder(sae)


def kmeans_encoder(cfg: Config, matrix: np.ndarray, train_rows: np.ndarray) -> Encoder:
    """k-means with k = d_sae over training rows; a cluster's 'activation' is 1 / (1 + distance) on its members."""
    from sklearn.cluster import MiniBatchKMeans

    n_clusters = min(cfg.sae.d_sae, len(train_rows))
    sample = np.sort(np.random.default_rng(cfg.seed).choice(train_rows, size=min(len(train_rows), 200_000), replace=False))
    km = MiniBatchKMeans(n_clusters=n_clusters, random_state=cfg.seed, batch_size=4096, n_init=3).fit(np.asarray(matrix[sample]))
    centers = torch.from_numpy(km.cluster_centers_.astype(np.float32))

    def encode(x: torch.Tensor) -> torch.Tensor:
        dist = torch.cdist(x.float(), centers)
        nearest = dist.argmin(1)
        acts = torch.zeros((len(x), cfg.sae.d_sae))
        acts[torch.arange(len(x)), nearest] = 1.0 / (1.0 + dist[torch.arange(len(x)), nearest])
        return acts

    return encode


# ---------------------------------------------------------------- streaming pass

@dataclass
class TopActivations:
    values: dict[str, np.ndarray]  # split -> (d_sae, N), -inf for empty slots
    rows: dict[str, np.ndarray]
    fire_counts: np.ndarray  # (d_sae,) rows with activation > 0, all splits
    n_rows: int


def top_activations(encode: Encoder, matrix: np.ndarray, rows_by_split: dict[str, np.ndarray], d_sae: int, top_n: int, chunk_rows: int) -> TopActivations:
    fire = torch.zeros(d_sae, dtype=torch.long)
    values, rows = {}, {}
    total = sum(len(r) for r in rows_by_split.values())
    with tqdm(total=total, desc="features: encode", unit="row", leave=False) as bar:
        for split, split_rows in rows_by_split.items():
            top = StreamingTopN(d_sae, top_n)
            for s in range(0, len(split_rows), chunk_rows):
                idx = split_rows[s : s + chunk_rows]
                acts = encode(torch.from_numpy(np.asarray(matrix[idx], dtype=np.float32)))
                fire += (acts > 0).sum(0)
                top.update(acts, torch.from_numpy(idx))
                bar.update(len(idx))
            values[split], rows[split] = top.result()
    return TopActivations(values, rows, fire.numpy(), total)


# ---------------------------------------------------------------- statistics per latent

def _latent_examples(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positive = values > 0
    return values[positive], rows[positive]


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
        acts, rows = _latent_examples(top.values["train"][latent], top.rows["train"][latent])
        if len(acts) == 0:
            continue
        keep = percentile_rule(acts)
        kept_rows = rows[keep]
        h_acts, h_rows = _latent_examples(top.values["holdout"][latent], top.rows["holdout"][latent])
        h_rows = h_rows[percentile_rule(h_acts)]
        forms = Counter(normalize_word(w) for w in words_by_row[kept_rows])
        common = {
            "latent": latent,
            "n_top": int(len(kept_rows)),
            "density": float(top.fire_counts[latent] / max(top.n_rows, 1)),
            "max_activation": float(acts.max()),
            "coherence": coherence(embedding_of(kept_rows)),
            "holdout_n": int(len(h_rows)),
            "top_words": " | ".join(f"{w} ({c})" for w, c in forms.most_common(5)),
            "source": source,
        }
        for a, b in pairs:
            d = lp_by_row[a][kept_rows] - lp_by_row[b][kept_rows]
            dp = np.exp(lp_by_row[a][kept_rows]) - np.exp(lp_by_row[b][kept_rows])
            stats = delta_stats(d, dp, fcfg.bootstrap_samples, seed + latent)
            hd = lp_by_row[a][h_rows] - lp_by_row[b][h_rows]
            hdp = np.exp(lp_by_row[a][h_rows]) - np.exp(lp_by_row[b][h_rows])
            h_med = float(np.median(hd)) if len(hd) else float("nan")
            out.append(
                {
                    **common,
                    "model_a": a,
                    "model_b": b,
                    **stats,
                    "holdout_median_dlogp": h_med,
                    "holdout_mean_dlogp": float(np.mean(hd)) if len(hd) else float("nan"),
                    "holdout_median_dp": float(np.median(hdp)) if len(hdp) else float("nan"),
                    "generalizes": generalizes(stats["median_dlogp"], h_med),
                }
            )
    return out


def apply_filters(rows: list[dict], fcfg: FeaturesConfig) -> None:
    """Adds q_value, paper_rule, kept and better_model (q-values are per pair, across latents)."""
    pairs = sorted({(r["model_a"], r["model_b"]) for r in rows})
    for pair in pairs:
        mine = [r for r in rows if (r["model_a"], r["model_b"]) == pair]
        q = bh_qvalues(np.array([r["p_value"] for r in mine], dtype=np.float64))
        for r, qv in zip(mine, q):
            r["q_value"] = float(qv)
    for r in rows:
        med, mdp = r["median_dlogp"], r["median_dp"]
        r["paper_rule"] = bool(abs(med) > fcfg.min_abs_median_dlogp or abs(mdp) > fcfg.min_abs_median_dp)
        significant = (not fcfg.require_significance) or (np.isfinite(r["q_value"]) and r["q_value"] < fcfg.q_threshold)
        valid = (not fcfg.require_generalize) or r["generalizes"]
        r["kept"] = bool(r["paper_rule"] and significant and valid and r["n_top"] >= fcfg.min_activations)
        r["better_model"] = r["model_a"] if med > 0 else r["model_b"] if med < 0 else None


FEATURE_SCHEMA = pa.schema(
    [
        ("latent", pa.int32()),
        ("model_a", pa.string()),
        ("model_b", pa.string()),
        ("n_top", pa.int32()),
        ("density", pa.float64()),
        ("max_activation", pa.float64()),
        ("median_dlogp", pa.float64()),
        ("mean_dlogp", pa.float64()),
        ("median_dp", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("consistency", pa.float64()),
        ("p_value", pa.float64()),
        ("q_value", pa.float64()),
        ("coherence", pa.float64()),
        ("holdout_n", pa.int32()),
        ("holdout_median_dlogp", pa.float64()),
        ("holdout_mean_dlogp", pa.float64()),
        ("holdout_median_dp", pa.float64()),
        ("generalizes", pa.bool_()),
        ("paper_rule", pa.bool_()),
        ("kept", pa.bool_()),
        ("better_model", pa.string()),
        ("top_words", pa.string()),
        ("source", pa.string()),
    ]
)


# ---------------------------------------------------------------- contexts

def cut_context(text: str, start: int, end: int, chars: int) -> tuple[str, str, str]:
    """Left context, word, right context; contexts cut at whitespace so no word is split."""
    left_start = max(0, start - chars)
    left = text[left_start:start]
    if left_start > 0:
        cut = min((i for i in (left.find(" "), left.find("\n")) if i >= 0), default=-1)
        left = left[cut + 1 :] if cut >= 0 else ""
    right = text[end : end + chars]
    if end + chars < len(text):
        cut = max(right.rfind(" "), right.rfind("\n"))
        right = right[:cut] if cut >= 0 else ""
    return left, text[start:end], right


def _negative_rows(encode: Encoder, matrix: np.ndarray, latent_forms: dict[int, set[str]], holdout_rows: np.ndarray, holdout_forms: np.ndarray, n: int, seed: int) -> dict[int, np.ndarray]:
    """Per latent: holdout rows where it is inactive, half with its top word forms, half random."""
    rng = np.random.default_rng(seed)
    candidates: dict[int, np.ndarray] = {}
    for latent, forms in latent_forms.items():
        same = holdout_rows[np.isin(holdout_forms, list(forms))]
        same = rng.choice(same, size=min(len(same), 4 * n), replace=False) if len(same) else same
        rand = rng.choice(holdout_rows, size=min(len(holdout_rows), 4 * n), replace=False)
        candidates[latent] = np.unique(np.concatenate([same, rand]).astype(np.int64))
    if not candidates:
        return {}
    all_rows = np.unique(np.concatenate(list(candidates.values())))
    acts = torch.cat([encode(torch.from_numpy(np.asarray(matrix[all_rows[s : s + 8192]], dtype=np.float32))) for s in range(0, len(all_rows), 8192)])
    position = {r: i for i, r in enumerate(all_rows.tolist())}
    out = {}
    for latent, rows in candidates.items():
        inactive = rows[[acts[position[r], latent].item() <= 0 for r in rows.tolist()]]
        forms = latent_forms[latent]
        is_same = np.isin(holdout_forms[np.searchsorted(holdout_rows, inactive)], list(forms))
        same, other = inactive[is_same], inactive[~is_same]
        half = n // 2
        pick_same = rng.permutation(same)[:half]
        pick_other = rng.permutation(other)[: n - len(pick_same)]
        out[latent] = np.concatenate([pick_same, pick_other])
    return out


def contexts_table(cfg: Config, examples: list[tuple[int, str, int, int, float, bool]], index: pa.Table, models: list[str]) -> pa.Table:
    """examples: (latent, split, rank, row, activation, in_top)."""
    rows = np.array([e[3] for e in examples], dtype=np.int64)
    doc_ids = index["doc_id"].take(pa.array(rows)) if len(rows) else pa.array([], pa.string())
    word_idx = index["word_idx"].take(pa.array(rows)) if len(rows) else pa.array([], pa.int32())
    needed = pa.table({"doc_id": doc_ids, "word_idx": word_idx, "_pos": pa.array(np.arange(len(rows)))})
    docs_needed = pc.unique(doc_ids) if len(rows) else pa.array([], pa.string())
    files = [str(f) for f in resolve_files(cfg.out / "words")]
    words = pads.dataset(files, format="parquet").to_table(
        columns=["doc_id", "word_idx", "char_start", "char_end"], filter=pc.field("doc_id").isin(docs_needed)
    )
    joined = needed.join(words, keys=["doc_id", "word_idx"]).sort_by("_pos")
    documents = read_table(cfg.out / "documents.parquet", columns=["doc_id", "text"]).filter(pc.is_in(pc.field("doc_id"), value_set=docs_needed))
    text_of = dict(zip(documents["doc_id"].to_pylist(), documents["text"].to_pylist()))
    lefts, words_col, rights = [], [], []
    for doc, s, e in zip(joined["doc_id"].to_pylist(), joined["char_start"].to_pylist(), joined["char_end"].to_pylist()):
        left, word, right = cut_context(text_of[doc], s, e, cfg.features.context_chars)
        lefts.append(left)
        words_col.append(word)
        rights.append(right)
    cols = {
        "latent": pa.array([e[0] for e in examples], pa.int32()),
        "split": pa.array([e[1] for e in examples], pa.string()),
        "rank": pa.array([e[2] for e in examples], pa.int32()),
        "doc_id": doc_ids,
        "word_idx": word_idx,
        "activation": pa.array([e[4] for e in examples], pa.float32()),
        "in_top": pa.array([e[5] for e in examples], pa.bool_()),
        "left": pa.array(lefts, pa.string()),
        "word": pa.array(words_col, pa.string()),
        "right": pa.array(rights, pa.string()),
    }
    for m in models:
        cols[f"logprob__{m}"] = index[f"logprob__{m}"].take(pa.array(rows)) if len(rows) else pa.array([], pa.float64())
    return pa.table(cols)


# ---------------------------------------------------------------- corpus-level comparison

def corpus_stats(index: pa.Table, models: list[str], pairs: list[tuple[str, str]], n_docs: int) -> dict:
    out = {"documents": n_docs, "words": index.num_rows, "models": {}, "pairs": [list(p) for p in pairs], "pair_stats": {}}
    for m in models:
        lp = index[f"logprob__{m}"].to_numpy()
        out["models"][m] = {"mean_logprob": float(lp.mean()), "perplexity": float(np.exp(-lp.mean())), "words": int(len(lp))}
    for a, b in pairs:
        d = index[f"logprob__{a}"].to_numpy() - index[f"logprob__{b}"].to_numpy()
        out["pair_stats"][f"{a} vs {b}"] = {"mean_dlogp": float(d.mean()), "median_dlogp": float(np.median(d)), "share_a_better": float((d > 0).mean())}
    return out


def print_summary(features: pa.Table, stats: dict, limit: int = 25) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    header = Table(title="Corpus-level comparison (same words)")
    for col in ("model", "mean log p", "perplexity", "words"):
        header.add_column(col)
    for m, s in stats["models"].items():
        header.add_row(m, f"{s['mean_logprob']:.3f}", f"{s['perplexity']:.2f}", str(s["words"]))
    console.print(header)
    kept = features.filter(pc.field("kept")).to_pylist()
    kept.sort(key=lambda r: -abs(r["median_dlogp"]))
    table = Table(title=f"Kept features: {len(kept)} (of {features.num_rows} live latent rows)")
    for col in ("latent", "better", "median Δlog p [95% CI]", "q", "holdout Δ", "top words", "label"):
        table.add_column(col)
    for r in kept[:limit]:
        table.add_row(
            str(r["latent"]),
            str(r["better_model"]),
            f"{r['median_dlogp']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]",
            f"{r['q_value']:.1e}",
            f"{r['holdout_median_dlogp']:+.2f}",
            (r["top_words"] or "")[:50],
            (r.get("label") or "")[:60],
        )
    console.print(table)


# ---------------------------------------------------------------- stage

def run_features(cfg: Config, baseline: str | None = None) -> dict:
    from bbox_sae.sae import load_sae, run_dir_for

    fcfg = cfg.features
    baseline = baseline or (fcfg.baseline if fcfg.baseline != "none" else None)
    matrix, index, info = open_matrix(cfg)
    models = info["models"]
    pairs = [tuple(p) for p in cfg.compare]
    split = index["split"].to_numpy(zero_copy_only=False)
    rows = index["row"].to_numpy()
    rows_by_split = {"train": rows[split == "train"], "holdout": rows[split == "holdout"]}
    d_emb = info["d_embedding"]
    if baseline == "random":
        from bbox_sae.sae import sample_mean

        encode, d_sae = random_sae_encoder(cfg, matrix.shape[1], sample_mean(matrix, rows_by_split["train"], cfg.sae.seed)), cfg.sae.d_sae
    elif baseline == "kmeans":
        encode, d_sae = kmeans_encoder(cfg, matrix, rows_by_split["train"]), cfg.sae.d_sae
    else:
        sae = load_sae(run_dir_for(cfg))
        encode, d_sae = sae_encoder(sae), sae.cfg.d_sae
    top = top_activations(encode, matrix, rows_by_split, d_sae, fcfg.top_n, fcfg.chunk_rows)

    words_of_row = _words_by_row(cfg, index)
    lp_by_row = {m: index[f"logprob__{m}"].to_numpy() for m in models}

    def embedding_of(r: np.ndarray) -> np.ndarray:
        return np.asarray(matrix[np.sort(r), :d_emb], dtype=np.float64)

    feats = feature_rows(top, lp_by_row, words_of_row, embedding_of, pairs, fcfg, cfg.seed, baseline or "sae")
    apply_filters(feats, fcfg)
    features = pa.Table.from_pylist(feats, schema=FEATURE_SCHEMA) if feats else FEATURE_SCHEMA.empty_table()

    # Top activations table and the example contexts.
    top_records, examples = [], []
    for split_name in ("train", "holdout"):
        for latent in range(d_sae):
            acts, rws = _latent_examples(top.values[split_name][latent], top.rows[split_name][latent])
            in_top = percentile_rule(acts)
            for rank, (a, r, t) in enumerate(zip(acts, rws, in_top)):
                top_records.append((latent, split_name, rank, int(r), float(a)))
                examples.append((latent, split_name, rank, int(r), float(a), bool(t)))
    labeled = {r["latent"] for r in feats if r["kept"] or not cfg.label.only_kept}
    holdout_rows = rows_by_split["holdout"]
    if len(holdout_rows) and labeled:
        holdout_forms = np.array([normalize_word(w) for w in words_of_row[holdout_rows]], dtype=object)
        latent_forms = {}
        for latent in sorted(labeled):
            acts, rws = _latent_examples(top.values["train"][latent], top.rows["train"][latent])
            latent_forms[latent] = {normalize_word(w) for w in words_of_row[rws[percentile_rule(acts)]]}
        negatives = _negative_rows(encode, matrix, latent_forms, holdout_rows, holdout_forms, cfg.label.validation_examples, cfg.seed)
        for latent, neg in negatives.items():
            examples.extend((latent, "negative", rank, int(r), 0.0, False) for rank, r in enumerate(neg))
    top_tbl = pa.table(
        {
            "latent": pa.array([t[0] for t in top_records], pa.int32()),
            "split": pa.array([t[1] for t in top_records], pa.string()),
            "rank": pa.array([t[2] for t in top_records], pa.int32()),
            "doc_id": index["doc_id"].take(pa.array([t[3] for t in top_records], pa.int64())),
            "word_idx": index["word_idx"].take(pa.array([t[3] for t in top_records], pa.int64())),
            "row": pa.array([t[3] for t in top_records], pa.int64()),
            "activation": pa.array([t[4] for t in top_records], pa.float32()),
        }
    )
    contexts = contexts_table(cfg, examples, index, models)
    n_docs = read_table(cfg.out / "documents.parquet", columns=["doc_id"]).num_rows
    stats = corpus_stats(index, models, pairs, n_docs)
    dest = features_dir(cfg, baseline)
    # features.parquet is the table later stages start from: withdraw the old one before writing
    # the new companions and write it last, so a run killed in between never pairs an old
    # features.parquet with new contexts (label and report would trust the mix).
    (dest / "features.parquet").unlink(missing_ok=True)
    atomic_write_table(dest / "top_activations.parquet", top_tbl)
    atomic_write_table(dest / "contexts.parquet", contexts)
    atomic_write_json(dest / "corpus_stats.json", stats)
    atomic_write_table(dest / "features.parquet", features)
    print_summary(features, stats)
    n_kept = int(pc.sum(features["kept"]).as_py() or 0) if features.num_rows else 0
    return {"live_latents": len({r["latent"] for r in feats}), "feature_rows": features.num_rows, "kept": n_kept, "source": baseline or "sae"}


def features_dir(cfg: Config, baseline: str | None = None):
    """Where a run's feature tables go: the output dir, or `baselines/<name>/` for a baseline."""
    return cfg.out / "baselines" / baseline if baseline else cfg.out


def _words_by_row(cfg: Config, index: pa.Table) -> np.ndarray:
    """The word string of every matrix row (object array)."""
    words = read_table(cfg.out / "words", columns=["doc_id", "word_idx", "word"])
    keyed = index.select(["row", "doc_id", "word_idx"]).join(words, keys=["doc_id", "word_idx"]).sort_by("row")
    out = np.empty(index.num_rows, dtype=object)
    out[keyed["row"].to_numpy()] = np.array(keyed["word"].to_pylist(), dtype=object)
    return out


def read_features(cfg: Config) -> pa.Table:
    return read_table(cfg.out / "features.parquet")


def load_corpus_stats(cfg: Config) -> dict:
    return json.loads((cfg.out / "corpus_stats.json").read_text())
