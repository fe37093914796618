"""Candidate findings for `features.test: rule`: what latents propose (context rules, and their own
word sets), and the one test they all take together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bbox_sae.config import FeaturesConfig
from bbox_sae.features.activations import TopActivations, top_words
from bbox_sae.features.feature_table import pair_stats
from bbox_sae.features.findings import propose_rules, rule_words
from bbox_sae.features.grouping import FindingInputs
from bbox_sae.features.latent_sets import latent_sets
from bbox_sae.features.rules import Rule, RuleFit, WordAttributes, any_mask, rules_to_json
from bbox_sae.features.significance import bh_qvalues
from bbox_sae.features.word_sets import WordSet


@dataclass
class Tested:
    """A candidate finding tested on held-out text: a context rule, or a latent's context-defined
    word set (`latent_sets.py`)."""

    kind: str  # "rule" or "latent"
    pair: tuple[str, str]
    sign: int  # +1: model_a better on the train words that proposed it, -1: model_b
    latents: list[int]  # the latents that proposed it
    # Row ids, ascending (a split's rows masked): `findings.shared_count` compares units by them.
    train_rows: np.ndarray
    holdout_rows: np.ndarray  # every held-out word it covers: what is tested
    rule: Rule | None = None
    word_set: WordSet | None = None
    stats: dict = field(default_factory=dict)
    q_value: float = float("nan")
    passed: bool = False

    @property
    def key(self) -> tuple:
        return self.pair, self.sign


def rule_candidates(
    feats: list[dict],
    top: TopActivations,
    fires: np.ndarray,
    column: dict[int, int],
    attrs: WordAttributes,
    train: np.ndarray,
    holdout: np.ndarray,
    lp_by_row: dict[str, np.ndarray],
    fcfg: FeaturesConfig,
) -> tuple[list[Tested], dict[int, RuleFit]]:
    """Every rule a latent proposes from its train top words (`findings.propose_rules`), once per
    (pair, sign, rule) with all its proposers; and each latent's first proposal (its label when it
    is in no finding)."""
    candidates: dict[tuple, Tested] = {}
    first_rule: dict[int, RuleFit] = {}
    for r in feats:
        if r["latent"] not in column:
            continue
        a, b = r["model_a"], r["model_b"]
        for sign in (1, -1):
            proposals = propose_rules(
                attrs,
                top_words(top, "train", r["latent"]),
                fires[:, column[r["latent"]]],
                train,
                lp_by_row[a],
                lp_by_row[b],
                sign,
                fcfg.rule_min_share,
                fcfg.max_rules_per_latent,
                fcfg.min_abs_median_dlogp,
                fcfg.min_abs_median_dp,
            )
            for rule, fit in proposals:
                first_rule.setdefault(r["latent"], fit)
                key = (a, b, sign, rule)
                if key in candidates:
                    candidates[key].latents.append(r["latent"])
                else:
                    candidates[key] = Tested("rule", (a, b), sign, [r["latent"]], rule_words(rule, attrs, train), rule_words(rule, attrs, holdout), rule=rule)
    return list(candidates.values()), first_rule


def latent_candidates(
    feats: list[dict],
    top: TopActivations,
    fires: np.ndarray,
    column: dict[int, int],
    context: np.ndarray,
    attrs: WordAttributes,
    train: np.ndarray,
    holdout: np.ndarray,
    lp_by_row: dict[str, np.ndarray],
    rules: list[Tested],
    fcfg: FeaturesConfig,
    seed: int,
) -> list[Tested]:
    """The word sets (`latent_sets.latent_sets`) of every latent whose own train top words show a
    difference (the effect rule on their median)."""
    proposals = []
    for r in feats:
        if r["latent"] not in column:
            continue
        top_train = top_words(top, "train", r["latent"])
        d = lp_by_row[r["model_a"]][top_train] - lp_by_row[r["model_b"]][top_train]
        for sign in (1, -1):
            if np.median(sign * d) > fcfg.min_abs_median_dlogp:
                proposals.append((r["latent"], (r["model_a"], r["model_b"]), sign))
    dlogp_of = {pair: lp_by_row[pair[0]] - lp_by_row[pair[1]] for _, pair, _ in proposals}
    # Rules that say a place (any word, or a class, after something) carve out words by their
    # context, not by what they are: left to those rules, their words would drag every name that
    # opens a speech into a group of nouns.
    in_context_rule = {
        key: any_mask([t.rule for t in rules if t.key == key and t.rule.left_kind is not None and t.rule.word_kind != "form"], attrs)
        for key in {(p, s) for _, p, s in proposals}
    }
    sets = latent_sets(
        proposals,
        lambda latent: fires[:, column[latent]],
        context,
        attrs,
        train,
        holdout,
        dlogp_of,
        in_context_rule,
        fcfg.min_abs_median_dlogp,
        fcfg.min_activations,
        seed,
    )
    return [Tested("latent", s.pair, s.sign, [s.latent], s.train_rows, s.holdout_rows, word_set=s.word_set) for s in sets]


def test_candidates(tested: list[Tested], lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig, seed: int) -> None:
    """Statistics on train (shown) and held out (the test), one BH family over every candidate of
    either kind, then the effect-size rule and the proposing sign on the held-out median."""
    for t in tested:
        t.stats = pair_stats(t.train_rows, t.holdout_rows, lp_by_row[t.pair[0]], lp_by_row[t.pair[1]], fcfg.bootstrap_samples, seed)
    # Independent filtering (Bourgon et al., PNAS 2010): a candidate needs `min_activations` words on
    # each side, train (fewer is too thin to propose anything) and holdout (fewer can never be kept).
    # Word counts say nothing about the holdout Δ, so candidates failing them leave the
    # multiple-testing family instead of diluting the q-values of those that can pass.
    testable = np.array([min(len(t.train_rows), len(t.holdout_rows)) >= fcfg.min_activations for t in tested], dtype=bool)
    q = np.full(len(tested), np.nan)
    q[testable] = bh_qvalues(np.array([t.stats["holdout_p_value"] for t in tested], dtype=np.float64)[testable])
    for t, qv in zip(tested, q):
        med, mdp = t.stats["holdout_median_dlogp"], t.stats["holdout_median_dp"]
        large = abs(med) > fcfg.min_abs_median_dlogp or abs(mdp) > fcfg.min_abs_median_dp
        t.q_value = float(qv)
        t.passed = bool(np.isfinite(qv) and qv < fcfg.q_threshold and large and np.sign(med) == t.sign)


def tested_row(t: Tested) -> dict:
    statement = t.rule.describe() if t.rule else t.word_set.describe()
    return {
        "model_a": t.pair[0],
        "model_b": t.pair[1],
        "better_model": t.pair[0] if t.sign > 0 else t.pair[1],
        "kind": t.kind,
        "rule": t.rule.describe() if t.rule else None,
        "rule_json": rules_to_json([t.rule]) if t.rule else None,
        "statement": statement,
        "latents": ",".join(map(str, sorted(t.latents))),
        "n_train": int(len(t.train_rows)),
        "median_dlogp": t.stats["median_dlogp"],
        "holdout_n": int(len(t.holdout_rows)),
        "holdout_median_dlogp": t.stats["holdout_median_dlogp"],
        "holdout_median_dp": t.stats["holdout_median_dp"],
        "holdout_p_value": t.stats["holdout_p_value"],
        "q_value": t.q_value,
        "passed": t.passed,
    }


def propose_candidates(feats: Sequence[dict], inputs: FindingInputs, fires: np.ndarray, column: dict[int, int]) -> tuple[list[Tested], dict[int, RuleFit]]:
    """Every candidate the proposers offer, rules then (with `features.latent_sets`) word sets, and
    each latent's first proposed rule."""
    train, holdout = inputs.rows_by_split["train"], inputs.rows_by_split["holdout"]
    fcfg = inputs.fcfg
    tested, first_rule = rule_candidates(feats, inputs.top, fires, column, inputs.attrs, train, holdout, inputs.lp_by_row, fcfg)
    if fcfg.latent_sets:
        tested += latent_candidates(feats, inputs.top, fires, column, inputs.context, inputs.attrs, train, holdout, inputs.lp_by_row, tested, fcfg, inputs.seed)
    return tested, first_rule
