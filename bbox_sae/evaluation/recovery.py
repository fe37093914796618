"""Recovery of the planted rules and the false-discovery rate of a run's findings.

- A rule is **recovered** when some kept finding's top words are >= 80% that rule's words and
  its better model is the one the planted Δ favours. Per rule, the finding matched to it: of the
  findings that recover it, the one covering most of the rule's *holdout* words (its recall), else
  the one with the best precision (share of a finding's top words from the rule); and `splits`
  (right-signed findings whose top words are at least half that rule). A rule split in two (the
  thou-forms as "'thou' or 'thy' or 'thee'", 384 held-out words, and "'thine'", 18) is matched to
  the part a reader finds it by, and the split is counted.
- **FDR**: share of kept findings whose top words are < 50% planted (any rule).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import read_table
from bbox_sae.config import Config
from bbox_sae.evaluation.planting import PlantedRule
from bbox_sae.labeling.table import labeled_features
from bbox_sae.layout import RunLayout
from bbox_sae.schemas import latent_ids

RECOVERED_SHARE = 0.8
SPURIOUS_SHARE = 0.5


def match_rank(precision: float, recall: float) -> tuple[bool, float]:
    """How well a finding matches a planted rule, to take the best: one that recovers it (precision
    >= `RECOVERED_SHARE`) before one that does not; among those that do, the higher recall; among
    the rest, the higher precision."""
    recovers = precision >= RECOVERED_SHARE
    return recovers, recall if recovers else precision


def rows_to_words(words: pa.Table, run_dir: Path) -> np.ndarray:
    """Position in `words` of every row of the build index in `run_dir`."""
    index = read_table(RunLayout(run_dir).index, columns=["row", "doc_id", "word_idx"])
    position = {k: i for i, k in enumerate(zip(words["doc_id"].to_pylist(), words["word_idx"].to_pylist()))}
    return np.array([position[k] for k in zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist())], dtype=np.int64)


def row_attributes(cfg: Config):
    """Rule attributes of every row of `cfg.out`'s build index."""
    from bbox_sae.features import feature_source

    return feature_source(cfg).attrs


def _firing(cfg: Config, latents: list[int], source: str) -> tuple[np.ndarray, np.ndarray]:
    """Where each latent fires (the features stage's ranking encoder) over every row, and the holdout mask."""
    from bbox_sae.features import feature_source

    src = feature_source(cfg, source)
    split = src.matrix.index["split"].to_numpy(zero_copy_only=False)
    return src.fires(latents), split == "holdout"


def _group_rows(top: pa.Table) -> dict[int, np.ndarray]:
    """latent -> its top rows in rank order."""
    t = top.sort_by([("latent", "ascending"), ("rank", "ascending")])
    latents, rows = t["latent"].to_numpy(), t["row"].to_numpy()
    bounds = np.flatnonzero(np.r_[True, latents[1:] != latents[:-1], True])
    return {int(latents[s]): rows[s:e] for s, e in zip(bounds[:-1], bounds[1:])}


def _carrying_latent(top_rows_of: dict[int, np.ndarray], rule_mask: np.ndarray, holdout: np.ndarray) -> dict:
    """Whether the SAE sees a planted rule at all, whatever the findings say: the latent whose
    train top words are most that rule's (`latent_precision`), and the share of the rule's train
    words among them (`latent_recall`)."""
    train_words = int((rule_mask & ~holdout).sum())
    best = {"latent": None, "latent_precision": 0.0, "latent_recall": 0.0}
    for latent, rows in top_rows_of.items():
        if not len(rows):
            continue
        precision = float(rule_mask[rows].mean())
        if precision > best["latent_precision"]:
            recall = float(rule_mask[rows].sum() / train_words) if train_words else 0.0
            best = {"latent": latent, "latent_precision": precision, "latent_recall": recall}
    return best


def score_recovery(cfg: Config, features_dir: Path, rules: list[PlantedRule], masks_by_row: dict[str, np.ndarray], source: str) -> dict:
    """Recovery per rule and FDR for the findings in `features_dir` (rows aligned to `cfg.out`'s build index)."""
    from bbox_sae.labeling.finding_statements import labeled_findings

    tables = RunLayout(features_dir)
    findings = labeled_findings(tables)
    features = labeled_features(tables)
    n_top = dict(zip(features["latent"].to_pylist(), features["n_top"].to_pylist()))
    detection = {latent: score for latent, score in zip(features["latent"].to_pylist(), features["label_score"].to_pylist()) if score is not None}
    top = read_table(tables.top_activations).filter(pc.field("split") == "train")
    top_rows_of = {}
    for latent, group in _group_rows(top).items():
        top_rows_of[latent] = group[: n_top.get(latent, 0)]
    any_rule = np.zeros(len(next(iter(masks_by_row.values()))), dtype=bool)
    for m in masks_by_row.values():
        any_rule |= m
    members = [latent_ids(f["latents"]) for f in findings]
    latents = sorted({m for ms in members for m in ms})
    fires, holdout = _firing(cfg, latents, source) if latents else (np.zeros((len(any_rule), 0), bool), np.zeros(len(any_rule), bool))
    column = {latent: j for j, latent in enumerate(latents)}
    # A rule-tested finding's words are every held-out word it was tested on (finding_words.parquet).
    by_rule = cfg.features.test == "rule"
    tested_words = read_table(tables.finding_words).filter(pc.field("split") == "holdout") if by_rule else None
    words_of = []
    for f, ms in zip(findings, members):
        if by_rule:
            words_of.append(tested_words.filter(pc.field("finding") == f["finding"])["row"].to_numpy())
        else:
            words_of.append(np.unique(np.concatenate([top_rows_of[m] for m in ms])))
    shares = []
    for rows in words_of:
        share = {r.name: float(masks_by_row[r.name][rows].mean()) for r in rules}
        share["_planted"] = float(any_rule[rows].mean())
        shares.append(share)
    per_rule = {}
    for r in rules:
        winner = cfg.compare[0][1] if r.delta > 0 else cfg.compare[0][0]
        rule_holdout = masks_by_row[r.name] & holdout
        carrier = _carrying_latent(top_rows_of, masks_by_row[r.name], holdout)
        best = {
            "recovered": False,
            "precision": 0.0,
            "recall": 0.0,
            "finding": None,
            "splits": 0,
            "occurrences": int(masks_by_row[r.name].sum()),
            "train_occurrences": int((masks_by_row[r.name] & ~holdout).sum()),
        }
        for f, ms, share in zip(findings, members, shares):
            if f["better_model"] != winner:
                continue
            best["splits"] += share[r.name] >= SPURIOUS_SHARE
            if by_rule:
                recall = float(np.isin(np.flatnonzero(rule_holdout), words_of[findings.index(f)]).mean()) if rule_holdout.any() else 0.0
            else:
                recall = float(fires[np.ix_(rule_holdout, [column[m] for m in ms])].any(axis=1).mean()) if rule_holdout.any() else 0.0
            recovers = share[r.name] >= RECOVERED_SHARE
            if match_rank(share[r.name], recall) > match_rank(best["precision"], best["recall"]):
                scores = [detection[m] for m in ms if m in detection]
                best.update(
                    precision=share[r.name],
                    recall=recall,
                    finding=f["finding"],
                    recovered=recovers,
                    label=f["statement"],
                    kind=f.get("kind"),
                    statement_source=f.get("statement_source"),
                    # The finding's own statement, judged on its held-out words; `test: top` has
                    # no statement of its own: the median of its latents' label detections.
                    detection=f["detection"] if by_rule else float(np.median(scores)) if scores else None,
                )
        per_rule[r.name] = {**best, **carrier}
    spurious = [f["finding"] for f, share in zip(findings, shares) if share["_planted"] < SPURIOUS_SHARE]
    recovered = [v for v in per_rule.values() if v["recovered"]]
    return {
        "kept_findings": len(findings),
        "kept_latents": sum(len(ms) for ms in members),
        "rules_recovered": len(recovered),
        "rules": len(rules),
        "mean_recall": float(np.mean([v["recall"] for v in per_rule.values()])),
        "max_splits": max((v["splits"] for v in per_rule.values()), default=0),
        "fdr": len(spurious) / len(findings) if findings else 0.0,
        "spurious": len(spurious),
        "spurious_findings": [
            {"finding": f["finding"], "statement": f["statement"], "top_words": f["top_words"], "median_dlogp": f["median_dlogp"]}
            for f in findings
            if f["finding"] in spurious
        ],
        "per_rule": per_rule,
    }
