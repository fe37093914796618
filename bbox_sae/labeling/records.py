"""What a labeler reads (a feature's contexts and comparisons) and what it returns."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.features.rules import Rule, rules_from_json
from bbox_sae.features.word_sets import WordSet
from bbox_sae.layout import logprob_column
from bbox_sae.schemas import latent_ids

FEATURE_COLUMNS = ["latent", "model_a", "model_b", "kept", "better_model", "median_dlogp"]
CONTEXT_COLUMNS = ["latent", "split", "rank", "left", "word", "right"]


@dataclass(frozen=True)
class Context:
    left: str
    word: str
    right: str
    probs: tuple[tuple[str, float], ...] = ()  # (model, probability of the word), compared models only


@dataclass(frozen=True)
class Comparison:
    model_a: str
    model_b: str
    better_model: str | None
    median_dlogp: float | None


@dataclass(frozen=True)
class FeatureExamples:
    latent: int
    train: tuple[Context, ...]
    holdout: tuple[Context, ...]
    negative: tuple[Context, ...]
    comparisons: tuple[Comparison, ...]
    rules: tuple[Rule, ...] = ()  # the context rules of the latent's findings (or its own best rule)
    contrast: tuple[Context, ...] = ()  # train words of the same forms where the latent is inactive
    broader: tuple[Rule, ...] = ()  # what else the latent fires on, outside `rules` (`broader.py`)
    word_sets: tuple[WordSet, ...] = ()  # the word sets of the latent's latent findings


@dataclass(frozen=True)
class LabelResult:
    label: str | None
    source: str
    reason: str | None = None
    coherent: bool | None = None
    score: float | None = None
    precision: float | None = None
    recall: float | None = None
    fuzz: float | None = None


def select_latents(features: pa.Table, only_kept: bool) -> list[int]:
    latents = features["latent"]
    if only_kept:
        latents = pc.filter(latents, pc.fill_null(features["kept"], False))
    return sorted(set(latents.to_pylist()))


def train_top_contexts(contexts: pa.Table) -> pa.Table:
    """The rows of contexts.parquet that are latents' train top words (`in_top`)."""
    return contexts.filter(pc.and_(pc.equal(contexts["split"], "train"), pc.fill_null(contexts["in_top"], False)))


def latent_rules(features: pa.Table, findings: pa.Table | None) -> dict[int, list[Rule]]:
    """A latent's rules: those of its rule findings; for a latent in no finding, its own best rule
    (one in a latent finding is said by that finding's word set, `latent_word_sets`)."""
    rows = findings.to_pylist() if findings is not None else []
    finding_rules = {f["finding"]: rules_from_json(f["rule_json"]) for f in rows if f["rule_json"]}
    rules: dict[int, list[Rule]] = defaultdict(list)
    columns = ["latent"] + [c for c in ("rule_json", "findings") if c in features.column_names]
    for r in features.select(columns).to_pylist():
        ids = [int(f) for f in (r.get("findings") or "").split(",") if f]
        mine = [rule for f in ids if f in finding_rules for rule in finding_rules[f]]
        if not ids and r.get("rule_json"):
            mine = rules_from_json(r["rule_json"])
        rules[r["latent"]].extend(m for m in mine if m not in rules[r["latent"]])
    return rules


def latent_word_sets(findings: pa.Table | None) -> dict[int, list[WordSet]]:
    """Each latent's latent findings' word sets (`findings.parquet` word_set_json)."""
    out: dict[int, list[WordSet]] = defaultdict(list)
    for f in findings.to_pylist() if findings is not None else []:
        if f.get("word_set_json"):
            for latent in latent_ids(f["latents"]):
                out[latent].append(WordSet.from_json(f["word_set_json"]))
    return out


def _probs(row: dict, models: Sequence[str]) -> tuple[tuple[str, float], ...]:
    lps = [(m, row.get(logprob_column(m))) for m in models]
    return tuple((m, math.exp(lp)) for m, lp in lps if lp is not None and math.isfinite(lp))


def context_of(row: dict, models: Sequence[str]) -> Context:
    """A contexts.parquet row as shown to a labeler, with the compared models' probabilities."""
    return Context(row["left"] or "", row["word"] or "", row["right"] or "", _probs(row, models))


def feature_examples(
    features: pa.Table,
    contexts: pa.Table,
    latents: Sequence[int],
    n_train: int,
    n_validation: int,
    rules: dict[int, list[Rule]] | None = None,
    n_contrast: int = 0,
    broader: dict[int, tuple[Rule, ...]] | None = None,
    word_sets: dict[int, list[WordSet]] | None = None,
) -> list[FeatureExamples]:
    """Group the contexts (rank order, capped per split) and the pair comparisons of each latent,
    with its rules (`latent_rules`) and what else it fires on (`broader.broader_rules`)."""
    wanted = pa.array(latents, pa.int64())
    mine = features.filter(pc.is_in(pc.cast(features["latent"], pa.int64()), value_set=wanted))
    compared = sorted(set(mine["model_a"].to_pylist()) | set(mine["model_b"].to_pylist()))
    models = [m for m in compared if logprob_column(m) in contexts.column_names]
    rows = contexts.filter(pc.is_in(pc.cast(contexts["latent"], pa.int64()), value_set=wanted))
    by_split: dict[tuple[int, str], list[tuple[int, Context]]] = defaultdict(list)
    for r in rows.select(CONTEXT_COLUMNS + [logprob_column(m) for m in models]).to_pylist():
        by_split[(r["latent"], r["split"])].append((r["rank"], context_of(r, models)))
    comparisons: dict[int, list[Comparison]] = defaultdict(list)
    for r in mine.select(FEATURE_COLUMNS).to_pylist():
        comparisons[r["latent"]].append(Comparison(r["model_a"], r["model_b"], r["better_model"], r["median_dlogp"]))
    rules, broader, word_sets = rules or {}, broader or {}, word_sets or {}

    def top(latent: int, split: str, n: int) -> tuple[Context, ...]:
        return tuple(c for _, c in sorted(by_split[(latent, split)], key=lambda rc: rc[0])[:n])

    return [
        FeatureExamples(
            latent=latent,
            train=top(latent, "train", n_train),
            holdout=top(latent, "holdout", n_validation),
            negative=top(latent, "negative", n_validation),
            comparisons=tuple(comparisons[latent]),
            rules=tuple(rules.get(latent, ())),
            contrast=top(latent, "contrast", n_contrast),
            broader=broader.get(latent, ()),
            word_sets=tuple(word_sets.get(latent, ())),
        )
        for latent in latents
    ]


def validation_set(feature: FeatureExamples, seed: int) -> tuple[list[Context], list[bool]]:
    """Holdout positives and negatives, shuffled the same way on every run (stable cache keys)."""
    labelled = [(c, True) for c in feature.holdout] + [(c, False) for c in feature.negative]
    random.Random(f"{seed}:{feature.latent}").shuffle(labelled)
    return [c for c, _ in labelled], [t for _, t in labelled]
