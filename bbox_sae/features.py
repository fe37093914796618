"""Feature extraction: latents become findings ("model A beats B on this group of words").

For every latent: its top-N activations on the train split and, apart, on the holdout split
(streamed), ranked by the activation on *Δ-blind* rows (`features.ranking: blind`: the models'
performance columns made equal, so the ranking never sees which model won). On the top words
after the paper's percentile rule, Δ = log p_A − log p_B statistics on train (median, mean,
median Δp, sign consistency, bootstrap CI) select; the same statistics on the holdout top words
test (Wilcoxon p, BH q across latents, same sign and at least half the size). A latent passing
both gets its best context rule (`rules.py`), whose held-out F1 measures coherence; `kept`
latents (optionally with `min_rule_f1`) are grouped into findings (`findings.py`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import torch
from tqdm.auto import tqdm

from bbox_sae.artifacts import atomic_write_json, atomic_write_table, read_table, resolve_files
from bbox_sae.config import Config, FeaturesConfig
from bbox_sae.dataset import open_matrix
from bbox_sae.domains import domain_stats
from bbox_sae.findings import LatentRule, RuleCandidate, expresses, group_latents, group_similar, mine_rule, nested_groups, propose_rules, rule_words, top_forms
from bbox_sae.rules import RuleFit, WordAttributes, describe_rules, fit_rule, fit_rules, normalize_form, rules_to_json, word_attributes
from bbox_sae.stats import StreamingTopN, bh_qvalues, coherence, delta_stats, generalizes, percentile_rule

log = logging.getLogger(__name__)

Encoder = Callable[[torch.Tensor], torch.Tensor]


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


# ---------------------------------------------------------------- Δ-blind ranking

def blind_rows(x: torch.Tensor, d_embedding: int, performance: str) -> torch.Tensor:
    """The rows with the models made indistinguishable: each model's performance column replaced by
    the models' mean (`delta` columns by 0), the context part unchanged.

    A latent's activation on such a row depends on the context and on how predictable the word is
    overall, never on which model predicted it better; so rows ranked by it can be tested on their
    Δ without circularity (swapping A and B on any word leaves the ranking unchanged, so under
    the null of exchangeable models the selected Δ are symmetric about 0)."""
    out = x.clone()
    perf = out[:, d_embedding:]
    if performance in ("delta", "delta_context"):
        perf.zero_()
    else:
        perf.copy_(perf.mean(dim=1, keepdim=True).expand_as(perf))
    return out


def ranking_encoder(encode: Encoder, d_embedding: int, performance: str, ranking: str) -> Encoder:
    """The encoder whose activations choose a latent's examples (`features.ranking`)."""
    if ranking == "full":
        return encode
    return lambda x: encode(blind_rows(x, d_embedding, performance))


def encode_rows(encode: Encoder, matrix: np.ndarray, rows: np.ndarray, chunk_rows: int, desc: str | None = None) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """(row ids, activations) chunk by chunk: the one loop every pass over the matrix uses."""
    bar = tqdm(total=len(rows), desc=desc, unit="row", leave=False, disable=desc is None)
    for s in range(0, len(rows), chunk_rows):
        idx = rows[s : s + chunk_rows]
        yield idx, encode(torch.from_numpy(np.asarray(matrix[idx], dtype=np.float32)))
        bar.update(len(idx))
    bar.close()


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
    for split, split_rows in rows_by_split.items():
        top = StreamingTopN(d_sae, top_n)
        for idx, acts in encode_rows(encode, matrix, split_rows, chunk_rows, desc=f"features: encode {split}"):
            fire += (acts > 0).sum(0)
            top.update(acts, torch.from_numpy(idx))
        values[split], rows[split] = top.result()
    return TopActivations(values, rows, fire.numpy(), sum(len(r) for r in rows_by_split.values()))


def firing(encode: Encoder, matrix: np.ndarray, latents: list[int], chunk_rows: int) -> np.ndarray:
    """(all rows, len(latents)) bool: where each of the given latents fires."""
    out = np.zeros((matrix.shape[0], len(latents)), dtype=bool)
    if latents:
        for idx, acts in encode_rows(encode, matrix, np.arange(matrix.shape[0]), chunk_rows, desc="features: firing"):
            out[idx] = (acts[:, latents] > 0).numpy()
    return out


# ---------------------------------------------------------------- statistics per latent

def _latent_examples(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positive = values > 0
    return values[positive], rows[positive]


def top_words(top: TopActivations, split: str, latent: int) -> np.ndarray:
    """A latent's top rows on a split after the paper's percentile rule."""
    acts, rows = _latent_examples(top.values[split][latent], top.rows[split][latent])
    return rows[percentile_rule(acts)]


def pair_stats(rows: np.ndarray, holdout_rows: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, n_boot: int, seed: int) -> dict:
    """Δ statistics on the train top words (selection, shown) and on the holdout top words (the test)."""
    d = lp_a[rows] - lp_b[rows]
    dp = np.exp(lp_a[rows]) - np.exp(lp_b[rows])
    stats = delta_stats(d, dp, n_boot, seed)
    hd = lp_a[holdout_rows] - lp_b[holdout_rows]
    hdp = np.exp(lp_a[holdout_rows]) - np.exp(lp_b[holdout_rows])
    held = delta_stats(hd, hdp, n_boot, seed + 1)
    return {
        **stats,
        "holdout_median_dlogp": held["median_dlogp"],
        "holdout_mean_dlogp": held["mean_dlogp"],
        "holdout_median_dp": held["median_dp"],
        "holdout_ci_low": held["ci_low"],
        "holdout_ci_high": held["ci_high"],
        "holdout_p_value": held["p_value"],
        "generalizes": generalizes(stats["median_dlogp"], held["median_dlogp"]),
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


def apply_filters(rows: list[dict], fcfg: FeaturesConfig) -> None:
    """Adds q_value, paper_rule, kept and better_model.

    q-values (BH, per pair, across latents) come from the holdout test, so significance is never
    computed on the words whose Δ chose them."""
    pairs = sorted({(r["model_a"], r["model_b"]) for r in rows})
    for pair in pairs:
        mine = [r for r in rows if (r["model_a"], r["model_b"]) == pair]
        q = bh_qvalues(np.array([r["holdout_p_value"] for r in mine], dtype=np.float64))
        for r, qv in zip(mine, q):
            r["q_value"] = float(qv)
    for r in rows:
        med, mdp = r["median_dlogp"], r["median_dp"]
        r["paper_rule"] = bool(abs(med) > fcfg.min_abs_median_dlogp or abs(mdp) > fcfg.min_abs_median_dp)
        significant = (not fcfg.require_significance) or (np.isfinite(r["q_value"]) and r["q_value"] < fcfg.q_threshold)
        valid = (not fcfg.require_generalize) or r["generalizes"]
        enough = r["n_top"] >= fcfg.min_activations and r["holdout_n"] >= fcfg.min_activations
        r["passes_delta"] = bool(r["paper_rule"] and significant and valid and enough)
        r["kept"] = r["passes_delta"]
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
        ("holdout_ci_low", pa.float64()),
        ("holdout_ci_high", pa.float64()),
        ("holdout_p_value", pa.float64()),
        ("generalizes", pa.bool_()),
        ("paper_rule", pa.bool_()),
        ("passes_delta", pa.bool_()),
        ("rule", pa.string()),
        ("rule_json", pa.string()),
        ("rule_precision", pa.float64()),
        ("rule_recall", pa.float64()),
        ("rule_f1", pa.float64()),
        ("kept", pa.bool_()),
        ("finding", pa.int32()),
        ("findings", pa.string()),
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


def _negative_rows(encode: Encoder, matrix: np.ndarray, latent_forms: dict[int, set[str]], holdout_rows: np.ndarray, holdout_forms: np.ndarray, n: int, seed: int, chunk_rows: int) -> dict[int, np.ndarray]:
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
    acts = torch.cat([a for _, a in encode_rows(encode, matrix, all_rows, chunk_rows)])
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


def print_summary(findings: pa.Table, features: pa.Table, stats: dict, limit: int = 25) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    header = Table(title="Corpus-level comparison (same words)")
    for col in ("model", "mean log p", "perplexity", "words"):
        header.add_column(col)
    for m, s in stats["models"].items():
        header.add_row(m, f"{s['mean_logprob']:.3f}", f"{s['perplexity']:.2f}", str(s["words"]))
    console.print(header)
    n_kept = int(pc.sum(features["kept"]).as_py() or 0) if features.num_rows else 0
    table = Table(title=f"Findings: {findings.num_rows} ({n_kept} kept latents of {features.num_rows} live latent rows)")
    for col in ("finding", "better", "holdout Δlog p [95% CI]", "rule (held-out F1)", "latents", "top words"):
        table.add_column(col)
    for r in findings.to_pylist()[:limit]:
        table.add_row(
            str(r["finding"]),
            str(r["better_model"]),
            f"{r['holdout_median_dlogp']:+.2f} [{r['holdout_ci_low']:+.2f}, {r['holdout_ci_high']:+.2f}]",
            f"{r['rule']} ({r['rule_f1']:.2f})" if r["rule"] else "-",
            str(r["latents"]),
            (r["top_words"] or "")[:50],
        )
    console.print(table)


# ---------------------------------------------------------------- rules and findings

def _rule_columns(fit: LatentRule | None) -> dict:
    if fit is None:
        return {"rule": None, "rule_json": None, "rule_precision": None, "rule_recall": None, "rule_f1": None}
    return {
        "rule": fit.train.rule.describe(),
        "rule_json": rules_to_json([fit.train.rule]),
        "rule_precision": fit.holdout.precision,
        "rule_recall": fit.holdout.recall,
        "rule_f1": fit.holdout.f1,
    }


def add_rules_and_findings(
    feats: list[dict], top: TopActivations, fires_of: Callable[[list[int]], np.ndarray], attrs: WordAttributes,
    rows_by_split: dict[str, np.ndarray], lp_by_row: dict[str, np.ndarray], words_by_row: np.ndarray, fcfg: FeaturesConfig, seed: int,
    tested_rules: list[dict], embedding_of: Callable[[np.ndarray], np.ndarray],
) -> list[dict]:
    """Mine a rule for every latent that passes the Δ tests, apply the coherence requirement, group
    kept latents into findings; returns the findings' rows."""
    candidates = sorted({r["latent"] for r in feats if r["passes_delta"]})
    fires = fires_of(candidates)
    column = {latent: j for j, latent in enumerate(candidates)}
    rules: dict[int, LatentRule | None] = {}
    for latent in candidates:
        rules[latent] = mine_rule(
            attrs, top_words(top, "train", latent), top_words(top, "holdout", latent), fires[:, column[latent]],
            rows_by_split["train"], rows_by_split["holdout"], fcfg.rule_min_share,
        )
    for r in feats:
        r.update(_rule_columns(rules.get(r["latent"])))
        coherent = r["rule_f1"] is not None and r["rule_f1"] >= fcfg.min_rule_f1
        r["kept"] = bool(r["passes_delta"] and coherent)
        r["finding"] = None
    kept = [r for r in feats if r["kept"]]
    groups = group_latents(
        [(r["model_a"], r["model_b"], r["better_model"]) for r in kept],
        [r["rule"] for r in kept],
        [top_words(top, "holdout", r["latent"]) for r in kept],
        fires[:, [column[r["latent"]] for r in kept]] if kept else np.zeros((0, 0), bool),
        fcfg.finding_overlap,
    )
    findings = []
    for g in groups:
        members = [kept[i] for i in g]
        latents = [m["latent"] for m in members]
        train_rows = np.unique(np.concatenate([top_words(top, "train", m) for m in latents]))
        holdout_rows = np.unique(np.concatenate([top_words(top, "holdout", m) for m in latents]))
        a, b = members[0]["model_a"], members[0]["model_b"]
        stats = pair_stats(train_rows, holdout_rows, lp_by_row[a], lp_by_row[b], fcfg.bootstrap_samples, seed)
        union_fires = fires[:, [column[m] for m in latents]].any(axis=1)
        fit = mine_rule(attrs, train_rows, holdout_rows, union_fires, rows_by_split["train"], rows_by_split["holdout"], fcfg.rule_min_share)
        fid = len(findings)
        for m in members:
            m["finding"] = fid
        findings.append({
            "finding": fid,
            "model_a": a,
            "model_b": b,
            "better_model": members[0]["better_model"],
            "latents": ",".join(str(x) for x in sorted(latents)),
            "n_latents": len(latents),
            "n_top": int(len(train_rows)),
            "holdout_n": int(len(holdout_rows)),
            **{k: stats[k] for k in ("median_dlogp", "mean_dlogp", "median_dp", "ci_low", "ci_high", "consistency",
                                      "holdout_median_dlogp", "holdout_ci_low", "holdout_ci_high", "holdout_p_value")},
            **_rule_columns(fit),
            "top_words": top_forms(words_by_row[train_rows]),
        })
    # Findings are numbered by effect size so that finding 0 is the largest difference.
    order = sorted(range(len(findings)), key=lambda i: -abs(findings[i]["holdout_median_dlogp"]))
    renumber = {old: new for new, old in enumerate(order)}
    for r in feats:
        if r["finding"] is not None:
            r["finding"] = renumber[r["finding"]]
        r["findings"] = None if r["finding"] is None else str(r["finding"])
    findings = [dict(findings[old], finding=new) for new, old in enumerate(order)]
    return findings


def rule_tested_findings(
    feats: list[dict], top: TopActivations, fires_of: Callable[[list[int]], np.ndarray], attrs: WordAttributes,
    rows_by_split: dict[str, np.ndarray], lp_by_row: dict[str, np.ndarray], words_by_row: np.ndarray, fcfg: FeaturesConfig, seed: int,
    tested_rules: list[dict], embedding_of: Callable[[np.ndarray], np.ndarray],
) -> list[dict]:
    """`features.test: rule`: findings are context rules, proposed by latents and tested on held-out text.

    Every latent whose train top words pass the paper's effect rule proposes up to
    `max_rules_per_latent` rules (`findings.propose_rules`, chosen on train only). A rule is then
    tested on *all* holdout words it matches, a set chosen without looking at any holdout Δ:
    Wilcoxon p, BH q across the distinct rules, the effect-size rule on the holdout median and
    the proposing sign. Kept rules whose words nest (one inside another) form one finding."""
    train, holdout = rows_by_split["train"], rows_by_split["holdout"]
    # Any latent may propose: one that mixes words where a model wins with words where nothing
    # differs does not pass the effect rule on its top words, yet its winning words may form a group.
    proposers = sorted({r["latent"] for r in feats if r["n_top"] >= fcfg.min_activations})
    fires = fires_of(proposers)
    column = {latent: j for j, latent in enumerate(proposers)}
    candidates: dict[tuple, RuleCandidate] = {}
    first_rule: dict[int, RuleFit] = {}
    for r in feats:
        if r["latent"] not in column:
            continue
        a, b = r["model_a"], r["model_b"]
        proposals = [
            (rule, sign, fit)
            for sign in (1, -1)
            for rule, fit in propose_rules(
                attrs, top_words(top, "train", r["latent"]), fires[:, column[r["latent"]]], train, lp_by_row[a], lp_by_row[b],
                sign, fcfg.rule_min_share, fcfg.max_rules_per_latent, fcfg.min_abs_median_dlogp, fcfg.min_abs_median_dp,
            )
        ]
        for rule, sign, fit in proposals:
            first_rule.setdefault(r["latent"], fit)
            key = (a, b, sign, rule)
            if key in candidates:
                candidates[key].latents.append(r["latent"])
            else:
                candidates[key] = RuleCandidate(rule, (a, b), sign, [r["latent"]], fit)
    tested, tested_rows = [], []
    for (a, b, sign, rule), cand in candidates.items():
        words_train, words_holdout = rule_words(rule, attrs, train), rule_words(rule, attrs, holdout)
        stats = pair_stats(words_train, words_holdout, lp_by_row[a], lp_by_row[b], fcfg.bootstrap_samples, seed)
        tested.append((cand, words_train, words_holdout, stats))
    # Independent filtering (Bourgon et al., PNAS 2010): a rule needs `min_activations` words on
    # each side, train (where it was proposed: fewer is too thin to propose anything) and holdout
    # (fewer can never be kept). Word counts say nothing about the holdout Δ, so rules failing them
    # leave the multiple-testing family instead of diluting the q-values of those that can pass.
    testable = np.array([min(len(t[1]), len(t[2])) >= fcfg.min_activations for t in tested], dtype=bool)
    q = np.full(len(tested), np.nan)
    q[testable] = bh_qvalues(np.array([t[3]["holdout_p_value"] for t in tested], dtype=np.float64)[testable])
    kept = []
    for (cand, words_train, words_holdout, stats), qv in zip(tested, q):
        med, mdp = stats["holdout_median_dlogp"], stats["holdout_median_dp"]
        large = abs(med) > fcfg.min_abs_median_dlogp or abs(mdp) > fcfg.min_abs_median_dp
        passed = bool(np.isfinite(qv) and qv < fcfg.q_threshold and large and np.sign(med) == cand.sign and len(words_holdout) >= fcfg.min_activations)
        tested_rows.append({
            "model_a": cand.pair[0], "model_b": cand.pair[1], "better_model": cand.pair[0] if cand.sign > 0 else cand.pair[1],
            "rule": cand.rule.describe(), "rule_json": rules_to_json([cand.rule]), "latents": ",".join(map(str, sorted(cand.latents))),
            "n_train": int(len(words_train)), "median_dlogp": stats["median_dlogp"], "holdout_n": int(len(words_holdout)),
            "holdout_median_dlogp": med, "holdout_median_dp": mdp, "holdout_p_value": stats["holdout_p_value"], "q_value": float(qv), "passed": passed,
        })
        if not passed:
            continue
        union_fires = fires[:, [column[m] for m in cand.latents]].any(axis=1)
        member_top = np.unique(np.concatenate([top_words(top, "holdout", m) for m in cand.latents]))
        fit = fit_rule(cand.rule, attrs, member_top, union_fires, holdout)
        if fit.f1 < fcfg.min_rule_f1:
            continue
        kept.append((cand, words_train, words_holdout, {**stats, "q_value": float(qv)}, fit))
    groups = nested_groups([k[2] for k in kept], [(k[0].pair, k[0].sign) for k in kept], fcfg.finding_overlap)
    # Each nested group is said by its broadest rule; sibling groups whose words sit in similar
    # contexts ('thy', 'thou', 'thee') are one finding said by several rules.
    heads = [max(g, key=lambda i: len(kept[i][2])) for g in groups]
    siblings = group_similar(
        [embedding_of(kept[h][1][np.random.default_rng(seed).permutation(len(kept[h][1]))[:256]]) for h in heads],
        [(kept[h][0].pair, kept[h][0].sign) for h in heads], fcfg.finding_similarity,
    )
    findings = []
    latent_findings: dict[int, list[tuple[int, list]]] = {}
    for family in siblings:
        members = [i for f in family for i in groups[f]]
        rules = [kept[heads[f]][0].rule for f in sorted(family, key=lambda f: -len(kept[heads[f]][2]))]
        cand = kept[heads[family[0]]][0]
        words_train = np.unique(np.concatenate([kept[heads[f]][1] for f in family]))
        words_holdout = np.unique(np.concatenate([kept[heads[f]][2] for f in family]))
        latents = sorted({m for i in members for m in kept[i][0].latents})
        a, b = cand.pair
        stats = pair_stats(words_train, words_holdout, lp_by_row[a], lp_by_row[b], fcfg.bootstrap_samples, seed)
        union_fires = fires[:, [column[m] for m in latents]].any(axis=1)
        member_top = np.unique(np.concatenate([top_words(top, "holdout", m) for m in latents]))
        fit = fit_rules(rules, attrs, member_top, union_fires, holdout)
        fid = len(findings)
        for m in latents:
            latent_findings.setdefault(m, []).append((fid, rules))
        findings.append({
            "finding": fid, "model_a": a, "model_b": b, "better_model": a if cand.sign > 0 else b,
            "latents": ",".join(str(x) for x in latents), "n_latents": len(latents),
            "n_top": int(len(words_train)), "holdout_n": int(len(words_holdout)),
            **{k: stats[k] for k in ("median_dlogp", "mean_dlogp", "median_dp", "ci_low", "ci_high", "consistency",
                                      "holdout_median_dlogp", "holdout_ci_low", "holdout_ci_high", "holdout_p_value")},
            "rule": describe_rules(rules), "rule_json": rules_to_json(rules),
            "rule_precision": fit.precision, "rule_recall": fit.recall, "rule_f1": fit.f1,
            "top_words": top_forms(words_by_row[words_train]),
        })
    order = sorted(range(len(findings)), key=lambda i: -abs(findings[i]["holdout_median_dlogp"]))
    renumber = {old: new for new, old in enumerate(order)}
    findings = [dict(findings[old], finding=new) for new, old in enumerate(order)]
    for r in feats:
        mine = sorted(((renumber[f], rules) for f, rules in latent_findings.get(r["latent"], [])), key=lambda fr: fr[0])
        # A kept latent is described by the rules of its findings, others by their first proposal.
        rules = [rule for _, rs in mine for rule in rs] or ([first_rule[r["latent"]].rule] if r["latent"] in first_rule else [])
        if not rules:
            r.update(_rule_columns(None))
        else:
            held = fit_rules(rules, attrs, top_words(top, "holdout", r["latent"]), fires[:, column[r["latent"]]], holdout)
            r.update(_rule_columns(LatentRule(held, held)), rule=describe_rules(rules), rule_json=rules_to_json(rules))
        r["kept"] = bool(mine) and expresses(rules, attrs, top_words(top, "train", r["latent"]), fcfg.member_min_share)
        r["finding"] = mine[0][0] if mine else None
        r["findings"] = ",".join(str(f) for f, _ in mine) or None
    tested_rules.extend(tested_rows)
    return findings


TESTED_RULE_SCHEMA = pa.schema(
    [
        ("model_a", pa.string()), ("model_b", pa.string()), ("better_model", pa.string()), ("rule", pa.string()),
        ("rule_json", pa.string()), ("latents", pa.string()), ("n_train", pa.int32()), ("median_dlogp", pa.float64()),
        ("holdout_n", pa.int32()), ("holdout_median_dlogp", pa.float64()), ("holdout_median_dp", pa.float64()),
        ("holdout_p_value", pa.float64()), ("q_value", pa.float64()), ("passed", pa.bool_()),
    ]
)

FINDING_SCHEMA = pa.schema(
    [
        ("finding", pa.int32()), ("model_a", pa.string()), ("model_b", pa.string()), ("better_model", pa.string()),
        ("latents", pa.string()), ("n_latents", pa.int32()), ("n_top", pa.int32()), ("holdout_n", pa.int32()),
        ("median_dlogp", pa.float64()), ("mean_dlogp", pa.float64()), ("median_dp", pa.float64()),
        ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("consistency", pa.float64()),
        ("holdout_median_dlogp", pa.float64()), ("holdout_ci_low", pa.float64()), ("holdout_ci_high", pa.float64()),
        ("holdout_p_value", pa.float64()), ("rule", pa.string()), ("rule_json", pa.string()),
        ("rule_precision", pa.float64()), ("rule_recall", pa.float64()), ("rule_f1", pa.float64()), ("top_words", pa.string()),
    ]
)


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
    encode = ranking_encoder(encode, d_emb, info["performance"], fcfg.ranking)
    top = top_activations(encode, matrix, rows_by_split, d_sae, fcfg.top_n, fcfg.chunk_rows)

    words_of_row, word_position = _words_by_row(cfg, index)
    attrs = _word_attributes(cfg).take(word_position)
    lp_by_row = {m: index[f"logprob__{m}"].to_numpy() for m in models}

    def embedding_of(r: np.ndarray) -> np.ndarray:
        return np.asarray(matrix[np.sort(r), :d_emb], dtype=np.float64)

    feats = feature_rows(top, lp_by_row, words_of_row, embedding_of, pairs, fcfg, cfg.seed, baseline or "sae")
    apply_filters(feats, fcfg)
    make_findings = rule_tested_findings if fcfg.test == "rule" else add_rules_and_findings
    tested_rules: list[dict] = []
    findings = make_findings(
        feats, top, lambda latents: firing(encode, matrix, latents, fcfg.chunk_rows), attrs, rows_by_split, lp_by_row, words_of_row, fcfg, cfg.seed,
        tested_rules, embedding_of,
    )
    features = pa.Table.from_pylist(feats, schema=FEATURE_SCHEMA) if feats else FEATURE_SCHEMA.empty_table()
    findings_tbl = pa.Table.from_pylist(findings, schema=FINDING_SCHEMA) if findings else FINDING_SCHEMA.empty_table()

    top_tbl, examples = _top_records(top, d_sae, index)
    labeled = {r["latent"] for r in feats if r["kept"] or not cfg.label.only_kept}
    examples.extend(_negative_examples(cfg, encode, matrix, top, labeled, rows_by_split["holdout"], words_of_row))
    contexts = contexts_table(cfg, examples, index, models)
    documents = read_table(cfg.out / "documents.parquet", columns=["doc_id", "domain"])
    stats = corpus_stats(index, models, pairs, documents.num_rows)
    stats["domains"] = domain_stats(index, documents, models, pairs)
    dest = features_dir(cfg, baseline)
    # features.parquet is the table later stages start from: withdraw the old one before writing
    # the new companions and write it last, so a run killed in between never pairs an old
    # features.parquet with new contexts (label and report would trust the mix).
    (dest / "features.parquet").unlink(missing_ok=True)
    atomic_write_table(dest / "top_activations.parquet", top_tbl)
    atomic_write_table(dest / "contexts.parquet", contexts)
    atomic_write_table(dest / "rules.parquet", pa.Table.from_pylist(tested_rules, schema=TESTED_RULE_SCHEMA))
    atomic_write_table(dest / "findings.parquet", findings_tbl)
    atomic_write_json(dest / "corpus_stats.json", stats)
    atomic_write_table(dest / "features.parquet", features)
    print_summary(findings_tbl, features, stats)
    n_kept = int(pc.sum(features["kept"]).as_py() or 0) if features.num_rows else 0
    return {
        "live_latents": len({r["latent"] for r in feats}), "feature_rows": features.num_rows, "kept": n_kept,
        "findings": findings_tbl.num_rows, "source": baseline or "sae",
    }


def _top_records(top: TopActivations, d_sae: int, index: pa.Table) -> tuple[pa.Table, list]:
    """The top activations table and the (latent, split, rank, row, activation, in_top) examples."""
    records, examples = [], []
    for split_name in ("train", "holdout"):
        for latent in range(d_sae):
            acts, rws = _latent_examples(top.values[split_name][latent], top.rows[split_name][latent])
            in_top = percentile_rule(acts)
            for rank, (a, r, t) in enumerate(zip(acts, rws, in_top)):
                records.append((latent, split_name, rank, int(r), float(a)))
                examples.append((latent, split_name, rank, int(r), float(a), bool(t)))
    row_ids = pa.array([t[3] for t in records], pa.int64())
    table = pa.table(
        {
            "latent": pa.array([t[0] for t in records], pa.int32()),
            "split": pa.array([t[1] for t in records], pa.string()),
            "rank": pa.array([t[2] for t in records], pa.int32()),
            "doc_id": index["doc_id"].take(row_ids),
            "word_idx": index["word_idx"].take(row_ids),
            "row": row_ids,
            "activation": pa.array([t[4] for t in records], pa.float32()),
        }
    )
    return table, examples


def _negative_examples(cfg: Config, encode: Encoder, matrix: np.ndarray, top: TopActivations, latents: set[int], holdout_rows: np.ndarray, words_of_row: np.ndarray) -> list:
    if not (len(holdout_rows) and latents):
        return []
    holdout_forms = np.array([normalize_form(w) for w in words_of_row[holdout_rows]], dtype=object)
    latent_forms = {latent: {normalize_form(w) for w in words_of_row[top_words(top, "train", latent)]} for latent in sorted(latents)}
    negatives = _negative_rows(encode, matrix, latent_forms, holdout_rows, holdout_forms, cfg.label.validation_examples, cfg.seed, cfg.features.chunk_rows)
    return [(latent, "negative", rank, int(r), 0.0, False) for latent, neg in negatives.items() for rank, r in enumerate(neg)]


def features_dir(cfg: Config, baseline: str | None = None):
    """Where a run's feature tables go: the output dir, or `baselines/<name>/` for a baseline."""
    return cfg.out / "baselines" / baseline if baseline else cfg.out


def _words_by_row(cfg: Config, index: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The word string of every matrix row (object array), and its position in `words/` order."""
    words = read_table(cfg.out / "words", columns=["doc_id", "word_idx", "word"])
    words = words.append_column("position", pa.array(np.arange(words.num_rows)))
    keyed = index.select(["row", "doc_id", "word_idx"]).join(words, keys=["doc_id", "word_idx"]).sort_by("row")
    out = np.empty(index.num_rows, dtype=object)
    rows = keyed["row"].to_numpy()
    out[rows] = np.array(keyed["word"].to_pylist(), dtype=object)
    position = np.empty(index.num_rows, dtype=np.int64)
    position[rows] = keyed["position"].to_numpy()
    return out, position


def _word_attributes(cfg: Config) -> WordAttributes:
    """Rule attributes of every word in `words/` order (documents are contiguous there)."""
    words = read_table(cfg.out / "words", columns=["doc_id", "word"])
    doc_ids = words["doc_id"].to_numpy(zero_copy_only=False)
    word_list = words["word"].to_pylist()
    bounds = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1], True])
    return word_attributes([word_list[s:e] for s, e in zip(bounds[:-1], bounds[1:])])
