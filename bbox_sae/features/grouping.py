"""Context rules for the latents that pass the Δ tests, and their grouping into findings
(`features.test`: `latent` mines one rule per latent; `rule` tests proposed rules themselves)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from bbox_sae.config import FeaturesConfig
from bbox_sae.features.activations import TopActivations, top_words
from bbox_sae.features.statistics import pair_stats
from bbox_sae.findings import (
    LatentRule, RuleCandidate, expresses, group_head, group_latents, group_similar, mine_rule, nested_groups, propose_rules, rule_words, top_forms,
)
from bbox_sae.rules import RuleFit, WordAttributes, describe_rules, fit_rule, fit_rules, rules_to_json
from bbox_sae.stats import bh_qvalues

# Part of the features stage's key: findings made by an older grouping are made again.
# 2: a nested group is said by its broadest rule only when the words it adds differ too, and
# listed words after one listed word are one finding. 3: a run of spaces is said in words.
FINDINGS_VERSION = 3


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
    # Each nested group is said by its broadest rule that adds no words where nothing differs
    # (`group_head`); sibling groups whose words sit in similar contexts ('thy', 'thou', 'thee') are
    # one finding said by several rules.
    words_train_of = [k[1] for k in kept]
    heads = []
    for g in groups:
        cand = kept[g[0]][0]
        heads.append(group_head(g, words_train_of, lp_by_row[cand.pair[0]], lp_by_row[cand.pair[1]], cand.sign))
    siblings = group_similar(
        [embedding_of(kept[h][1][np.random.default_rng(seed).permutation(len(kept[h][1]))[:256]]) for h in heads],
        [(kept[h][0].pair, kept[h][0].sign) for h in heads], fcfg.finding_similarity, [kept[h][0].rule for h in heads],
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
