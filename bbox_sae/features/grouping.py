"""Findings from latents, two strategies with one signature: each takes the feature rows and a
frozen `FindingInputs`, and returns `FindingTables` (the feature rows with their rule, `kept`
and findings filled in, as new rows). `features.test: top` mines one rule per latent that passes
the Δ tests and groups kept latents (`top_tested_findings`, here); `test: rule` tests what latents
propose, context rules and their own groups of words, and groups what passes
(`tested_findings.rule_tested_findings`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from bbox_sae.config import FeaturesConfig
from bbox_sae.features.activations import Firing, TopActivations, top_words
from bbox_sae.features.feature_table import pair_stats
from bbox_sae.features.findings import LatentRule, group_latents, mine_rule, top_forms
from bbox_sae.features.rules import WordAttributes, rules_to_json
from bbox_sae.schemas import TestedRuleRecord

# The version of how findings are found and grouped, part of the features stage's key: bump it when
# this code (or that of tested_findings, latent_sets, rules) changes what it writes for the same
# settings. 2: a nested group is said by its broadest rule only when the words it adds differ too,
# and listed words after one listed word are one finding. 3: a run of spaces is said in words.
# 4: latents' groups of words; findings join only what nests, never by embedding similarity.
# 5: ending sets; same-context units that share a proposing latent join. 6: a latent's carrying words
# above latent_sets.FIT_WORDS are clustered by a k-means fitted on a sample of them. 7: every rule of
# the grammar is a candidate (features.rule_search); rules of one place that a latent carries join;
# the rule-search baseline is recorded. 8: a finding said by a member's word set keeps that set's
# exclusions. 9: a left word joins like a layout; a latent's group that rules hold and that mixes
# punctuation and words is not kept. 10: a place joins one kind of token. 29: cue words earlier in
# the sentence or the text (`context.CUE_SCOPES`); one word part after several cues of one scope joins.
# 33: a unit inside two groups that do not nest joins one of them (`findings.nested_trees`); a
# topic's scope is its most specific cues, a phrase of one of them is no topic's word, and a form
# that joins it is said in its texts when it differs nowhere else; an ending
# narrowed to its left forms is judged there. 37: a finding only latents of a minority of its
# words proposed says so.
FINDINGS_VERSION = 37


def rule_columns(fit: LatentRule | None) -> dict:
    if fit is None:
        return {"rule": None, "rule_json": None, "rule_precision": None, "rule_recall": None, "rule_f1": None}
    return {
        "rule": fit.train.rule.describe(),
        "rule_json": rules_to_json([fit.train.rule]),
        "rule_precision": fit.holdout.precision,
        "rule_recall": fit.holdout.recall,
        "rule_f1": fit.holdout.f1,
    }


@dataclass(frozen=True)
class FindingInputs:
    """What a findings strategy reads; none of it is changed."""

    top: TopActivations
    fires_of: Callable[[list[int]], Firing]  # latents -> where each fires, (rows, latents)
    attrs: WordAttributes  # by matrix row
    rows_by_split: Mapping[str, np.ndarray]
    lp_by_row: Mapping[str, np.ndarray]
    words_by_row: np.ndarray
    context: np.ndarray  # the context part of every row (latent word sets group by it)
    fcfg: FeaturesConfig
    seed: int
    pairs: tuple[tuple[str, str], ...] = ()  # the compared pairs (`compare`): the rule search runs per pair
    # Each row's document (codes): a finding's interval resamples documents and counts the ones it spans.
    doc_by_row: np.ndarray | None = None


@dataclass(frozen=True)
class FindingTables:
    """A strategy's result: the feature rows completed, the findings, every tested candidate, and
    each finding's words as (finding, split, rows)."""

    features: list[dict]
    findings: list[dict]
    tested_rules: list[TestedRuleRecord]
    finding_words: list[tuple[int, str, np.ndarray]]
    baseline: pa.Table | None = None  # `test: rule`: the rule search's distinct differences (`features.baseline`)


# A finding's Δ statistics, on its train words (shown) and held out (the test).
FINDING_STATS = (
    "median_dlogp", "mean_dlogp", "median_dp", "ci_low", "ci_high", "consistency",
    "holdout_median_dlogp", "holdout_ci_low", "holdout_ci_high", "holdout_p_value", "holdout_docs",
)  # fmt: skip


def finding_stats(stats: dict) -> dict:
    return {k: stats.get(k) for k in FINDING_STATS}


def number_by_effect(
    findings: list[dict], finding_words: list[tuple[int, str, np.ndarray]]
) -> tuple[list[dict], list[tuple[int, str, np.ndarray]], dict[int, int]]:
    """Findings numbered by effect size, finding 0 the largest difference, their words renumbered
    alike, and the map from old numbers to new."""
    order = sorted(range(len(findings)), key=lambda i: -abs(findings[i]["holdout_median_dlogp"]))
    renumber = {old: new for new, old in enumerate(order)}
    numbered = [dict(findings[old], finding=new) for new, old in enumerate(order)]
    return numbered, [(renumber[f], split, rows) for f, split, rows in finding_words], renumber


def top_tested_findings(feats: Sequence[dict], inputs: FindingInputs) -> FindingTables:
    """Mine a rule for every latent that passes the Δ tests, apply the coherence requirement, group
    kept latents into findings; a finding's words are its members' top words."""
    top, attrs, fcfg, rows_by_split = inputs.top, inputs.attrs, inputs.fcfg, inputs.rows_by_split
    candidates = sorted({r["latent"] for r in feats if r["passes_delta"]})
    fires = inputs.fires_of(candidates)
    column = {latent: j for j, latent in enumerate(candidates)}
    rules: dict[int, LatentRule | None] = {}
    for latent in candidates:
        rules[latent] = mine_rule(
            attrs,
            top_words(top, "train", latent),
            top_words(top, "holdout", latent),
            fires[:, column[latent]],
            rows_by_split["train"],
            rows_by_split["holdout"],
            fcfg.rule_min_share,
        )
    features = []
    for r in feats:
        r = {**r, **rule_columns(rules.get(r["latent"]))}
        coherent = r["rule_f1"] is not None and r["rule_f1"] >= fcfg.min_rule_f1
        features.append({**r, "kept": bool(r["passes_delta"] and coherent), "finding": None})
    kept = [i for i, r in enumerate(features) if r["kept"]]
    groups = group_latents(
        [(features[i]["model_a"], features[i]["model_b"], features[i]["better_model"]) for i in kept],
        [features[i]["rule"] for i in kept],
        [top_words(top, "holdout", features[i]["latent"]) for i in kept],
        fires[:, [column[features[i]["latent"]] for i in kept]] if kept else np.zeros((0, 0), bool),
        fcfg.finding_overlap,
    )
    findings: list[dict] = []
    finding_words: list[tuple[int, str, np.ndarray]] = []
    for g in groups:
        members = [features[kept[i]] for i in g]
        latents = [m["latent"] for m in members]
        train_rows = np.unique(np.concatenate([top_words(top, "train", m) for m in latents]))
        holdout_rows = np.unique(np.concatenate([top_words(top, "holdout", m) for m in latents]))
        a, b = members[0]["model_a"], members[0]["model_b"]
        stats = pair_stats(train_rows, holdout_rows, inputs.lp_by_row[a], inputs.lp_by_row[b], fcfg.bootstrap_samples, inputs.seed, inputs.doc_by_row)
        union_fires = fires[:, [column[m] for m in latents]].any(axis=1)
        fit = mine_rule(attrs, train_rows, holdout_rows, union_fires, rows_by_split["train"], rows_by_split["holdout"], fcfg.rule_min_share)
        fid = len(findings)
        for i in g:
            features[kept[i]] = {**features[kept[i]], "finding": fid}
        findings.append(
            {
                "finding": fid,
                "model_a": a,
                "model_b": b,
                "better_model": members[0]["better_model"],
                "latents": ",".join(str(x) for x in sorted(latents)),
                "n_latents": len(latents),
                "n_top": int(len(train_rows)),
                "holdout_n": int(len(holdout_rows)),
                **finding_stats(stats),
                **rule_columns(fit),
                "kind": "rule",
                "statement": fit.train.rule.describe() if fit else None,
                "word_set_json": None,
                "top_words": top_forms(inputs.words_by_row[train_rows]),
            }
        )
        finding_words += [(fid, "train", train_rows), (fid, "holdout", holdout_rows)]
    findings, finding_words, renumber = number_by_effect(findings, finding_words)
    features = [
        dict(r, finding=None if r["finding"] is None else renumber[r["finding"]], findings=None if r["finding"] is None else str(renumber[r["finding"]]))
        for r in features
    ]
    return FindingTables(features, findings, [], finding_words)
