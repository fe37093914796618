"""Candidate findings for `features.test: rule`: what latents propose (context rules, and their own
word sets), and the one test they all take together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bbox_sae.config import FeaturesConfig
from bbox_sae.features.activations import top_words
from bbox_sae.features.findings import propose_rules, rule_words
from bbox_sae.features.grouping import FindingInputs
from bbox_sae.features.latent_sets import latent_sets
from bbox_sae.features.rule_search import search_rules
from bbox_sae.features.rules import Rule, RuleFit, any_mask, rules_to_json
from bbox_sae.features.significance import bh_qvalues, bootstrap_median_ci, wilcoxon_p
from bbox_sae.features.word_sets import WordSet
from bbox_sae.schemas import TestedRuleRecord


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
    searched: bool = False  # proposed by the exhaustive rule search (`rule_search`), latents or not
    # A unit of one difference: the kept rules it joins (its head first), the latents whose train
    # top words hold it though they did not propose it, and the place (left context) its rules
    # share (`places.unit_place`).
    members: tuple[Rule, ...] = ()
    carriers: list[int] = field(default_factory=list)
    place: tuple[str, str] | None = None
    token_kind: str | None = None  # what most of its words are: punctuation, number, layout or word
    # The narrower rules a unit is said by when its head's class says more than differs
    # (`findings.narrower_left_forms`); empty: its head rule says it.
    said_by: tuple[Rule, ...] = ()

    @property
    def stating_rules(self) -> tuple[Rule, ...]:
        return self.said_by or ((self.rule,) if self.rule is not None else ())

    @property
    def key(self) -> tuple:
        return self.pair, self.sign

    @property
    def proposer(self) -> str:
        return proposer_text(self.searched, self.latents)


def proposer_text(searched: bool, latents: Sequence[int], minority: Sequence[int] = ()) -> str:
    """Who proposed a candidate or finding: "rule search", "latents 3, 17", or "rule search + latent 3".
    `minority`: latents that proposed it from a few of their top words only, said when no one else
    did, so that a finding never shows no proposer ("latent 274, from a minority of its top words")."""
    named = _latents_text(latents)
    if not searched and not latents and minority:
        return f"{_latents_text(minority)}, from a minority of {'their' if len(minority) > 1 else 'its'} top words"
    return " + ".join(p for p in ("rule search" if searched else "", named) if p)


def _latents_text(latents: Sequence[int]) -> str:
    return f"latent{'s' if len(latents) > 1 else ''} {', '.join(map(str, sorted(latents)))}" if latents else ""


def rule_candidates(feats: Sequence[dict], inputs: FindingInputs, fires: np.ndarray, column: dict[int, int]) -> tuple[list[Tested], dict[int, RuleFit]]:
    """Every rule the exhaustive search proposes (`features.rule_search`) and every rule a latent
    proposes from its train top words (`findings.propose_rules`), once per (pair, sign, rule) with
    all its proposers; and each latent's first proposal (its label when it is in no finding)."""
    top, attrs, lp_by_row, fcfg = inputs.top, inputs.attrs, inputs.lp_by_row, inputs.fcfg
    train, holdout = inputs.rows_by_split["train"], inputs.rows_by_split["holdout"]
    candidates: dict[tuple, Tested] = {}
    first_rule: dict[int, RuleFit] = {}
    if fcfg.rule_search:
        for a, b in inputs.pairs:
            for found in search_rules(
                attrs, train, holdout, lp_by_row[a], lp_by_row[b], fcfg.min_activations, fcfg.min_abs_median_dlogp, fcfg.min_abs_median_dp
            ):
                candidates[(a, b, found.sign, found.rule)] = Tested(
                    "rule", (a, b), found.sign, [], found.train_rows, found.holdout_rows, rule=found.rule, searched=True
                )
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


def latent_candidates(feats: Sequence[dict], inputs: FindingInputs, fires: np.ndarray, column: dict[int, int], rules: list[Tested]) -> list[Tested]:
    """The word sets (`latent_sets.latent_sets`) of every latent whose own train top words show a
    difference (the effect rule on their median)."""
    top, attrs, lp_by_row, fcfg = inputs.top, inputs.attrs, inputs.lp_by_row, inputs.fcfg
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
        inputs.context,
        attrs,
        inputs.rows_by_split["train"],
        inputs.rows_by_split["holdout"],
        dlogp_of,
        in_context_rule,
        fcfg.min_abs_median_dlogp,
        fcfg.min_activations,
        inputs.seed,
    )
    return [Tested("latent", s.pair, s.sign, [s.latent], s.train_rows, s.holdout_rows, word_set=s.word_set) for s in sets]


def candidate_stats(train_rows: np.ndarray, holdout_rows: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray) -> dict:
    """What a candidate's test needs: the train median (shown) and the held-out median, median Δp
    and Wilcoxon p. No bootstrap: a CI is drawn for findings only (`pair_stats`), and the rule
    search makes candidates many."""
    held, held_p = lp_a[holdout_rows] - lp_b[holdout_rows], np.exp(lp_a[holdout_rows]) - np.exp(lp_b[holdout_rows])
    median = lambda x: float(np.median(x)) if len(x) else float("nan")  # noqa: E731
    return {
        "median_dlogp": median(lp_a[train_rows] - lp_b[train_rows]),
        "holdout_median_dlogp": median(held),
        "holdout_median_dp": median(held_p),
        "holdout_p_value": wilcoxon_p(held) if len(held) else float("nan"),
    }


def test_candidates(tested: list[Tested], lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig, seed: int, doc_by_row: np.ndarray | None = None) -> None:
    """Statistics on train (shown) and held out (the test), one BH family over every candidate of
    either kind, then the effect-size rule, the proposing sign and its CI on the held-out median."""
    for t in tested:
        t.stats = candidate_stats(t.train_rows, t.holdout_rows, lp_by_row[t.pair[0]], lp_by_row[t.pair[1]])
    # Independent filtering (Bourgon et al., PNAS 2010): a candidate needs `min_activations` words on
    # each side, train (fewer is too thin to propose anything) and holdout (fewer can never be kept).
    # Word counts say nothing about the holdout Δ, so candidates failing them leave the
    # multiple-testing family instead of diluting the q-values of those that can pass.
    for t, (q, passed) in zip(tested, one_family(tested, lp_by_row, fcfg, seed, doc_by_row)):
        t.q_value, t.passed = q, passed


def one_family(
    tested: Sequence[Tested], lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig, seed: int, doc_by_row: np.ndarray | None = None
) -> list[tuple[float, bool]]:
    """Per candidate (its `stats` computed), its BH q over the testable ones and whether it passes:
    q below `q_threshold`, the effect rule on the held-out median, the proposing sign, and the
    bootstrap 95% CI of that median on the proposing side of 0, resampling documents (`doc_by_row`)
    where they are known: the Wilcoxon test counts words as independent, the interval does not. The CI is the one a finding shows
    (`pair_stats`, same samples and seed): on the demo 'indeed' passed the rest (Wilcoxon on 18
    skewed values) with a median CI of [-0.16, +1.68], a finding that contradicted its own interval."""
    testable = np.array([min(len(t.train_rows), len(t.holdout_rows)) >= fcfg.min_activations for t in tested], dtype=bool)
    q = np.full(len(tested), np.nan)
    q[testable] = bh_qvalues(np.array([t.stats["holdout_p_value"] for t in tested], dtype=np.float64)[testable])
    out = []
    for t, qv in zip(tested, q):
        med, mdp = t.stats["holdout_median_dlogp"], t.stats["holdout_median_dp"]
        large = abs(med) > fcfg.min_abs_median_dlogp or abs(mdp) > fcfg.min_abs_median_dp
        passed = bool(np.isfinite(qv) and qv < fcfg.q_threshold and large and np.sign(med) == t.sign)
        if passed:
            held = lp_by_row[t.pair[0]][t.holdout_rows] - lp_by_row[t.pair[1]][t.holdout_rows]
            groups = None if doc_by_row is None else doc_by_row[t.holdout_rows]
            low, high = bootstrap_median_ci(held, fcfg.bootstrap_samples, seed + 1, groups=groups)
            passed = low > 0 if t.sign > 0 else high < 0
        out.append((float(qv), passed))
    return out


def tested_row(t: Tested) -> TestedRuleRecord:
    return TestedRuleRecord(
        model_a=t.pair[0],
        model_b=t.pair[1],
        better_model=t.pair[0] if t.sign > 0 else t.pair[1],
        kind=t.kind,
        rule=t.rule.describe() if t.rule else None,
        rule_json=rules_to_json([t.rule]) if t.rule else None,
        statement=t.rule.describe() if t.rule else t.word_set.describe(),
        latents=",".join(map(str, sorted(t.latents))),
        proposer=t.proposer,
        n_train=int(len(t.train_rows)),
        median_dlogp=t.stats["median_dlogp"],
        holdout_n=int(len(t.holdout_rows)),
        holdout_median_dlogp=t.stats["holdout_median_dlogp"],
        holdout_median_dp=t.stats["holdout_median_dp"],
        holdout_p_value=t.stats["holdout_p_value"],
        q_value=t.q_value,
        passed=t.passed,
    )


def propose_candidates(feats: Sequence[dict], inputs: FindingInputs, fires: np.ndarray, column: dict[int, int]) -> tuple[list[Tested], dict[int, RuleFit]]:
    """Every candidate the proposers offer, rules then (with `features.latent_sets`) word sets, and
    each latent's first proposed rule."""
    tested, first_rule = rule_candidates(feats, inputs, fires, column)
    if inputs.fcfg.latent_sets:
        tested += latent_candidates(feats, inputs, fires, column, tested)
    return tested, first_rule
