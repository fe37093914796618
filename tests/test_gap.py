"""The gap account's math (`bbox_sae.report.gap`): shares that add up, CIs that resample documents,
breakdowns that partition the words, and the word kinds, places and frequency bands they use."""

from __future__ import annotations

import numpy as np
import pytest

from bbox_sae.report.gap import KINDS, PLACES, finding_domains, frequency_bands, gap_account, group_means, place_codes, sentence_starts, slices, word_kind

RNG = np.random.default_rng(7)
N_DOCS, PER_DOC = 30, 40
DOC = np.repeat(np.arange(N_DOCS), PER_DOC)
DELTA = RNG.normal(-0.2, 1.0, N_DOCS * PER_DOC) + np.repeat(RNG.normal(0, 0.5, N_DOCS), PER_DOC)
LP_A = RNG.normal(-3.0, 1.0, len(DELTA))
LP_B = LP_A - DELTA


def test_mean_ci_contains_the_mean_and_resamples_documents_not_words():
    count, documents, mean, low, high = group_means(DELTA, DOC, np.zeros(len(DELTA), dtype=np.int64), 1, N_DOCS)
    assert count[0] == len(DELTA) and documents[0] == N_DOCS and mean[0] == pytest.approx(DELTA.mean())
    assert low[0] < mean[0] < high[0]
    # Every document with the same mean: resampling documents cannot move it, however much its words vary.
    same = np.tile(np.linspace(-3, 3, PER_DOC), N_DOCS)
    _, _, mean, low, high = group_means(same, DOC, np.zeros(len(same), dtype=np.int64), 1, N_DOCS)
    assert high[0] - low[0] == pytest.approx(0.0, abs=1e-12) and mean[0] == pytest.approx(0.0, abs=1e-12)
    # Documents that differ give an interval that a word-level bootstrap would make far too narrow.
    doc_level = np.repeat(np.linspace(-1, 1, N_DOCS), PER_DOC)
    _, _, _, low, high = group_means(doc_level, DOC, np.zeros(len(doc_level), dtype=np.int64), 1, N_DOCS)
    assert high[0] - low[0] > 0.3


def test_a_group_within_one_document_has_no_interval():
    """Resampling one document always returns its mean: a zero-width interval would claim certainty."""
    group = (DOC == 0).astype(np.int64)  # group 1: the words of document 0 alone
    count, documents, mean, low, high = group_means(DELTA, DOC, group, 2, N_DOCS)
    assert (count[1], documents[1]) == (PER_DOC, 1) and mean[1] == pytest.approx(DELTA[:PER_DOC].mean())
    assert np.isnan(low[1]) and np.isnan(high[1]) and low[0] < mean[0] < high[0]
    (alone,) = [s for s in slices(DELTA, DOC, N_DOCS, {"domain": (group, ["rest", "one play"])}) if s.name == "one play"]
    assert (alone.documents, alone.ci_low, alone.ci_high) == (1, None, None)


def test_perplexities_and_the_mean_are_those_of_the_held_out_words():
    acc = gap_account(LP_A, LP_B, DOC, N_DOCS, "a", "b", [])
    assert acc.perplexity == {"a": pytest.approx(np.exp(-LP_A.mean())), "b": pytest.approx(np.exp(-LP_B.mean()))}
    assert acc.mean_dlogp == pytest.approx(DELTA.mean()) and acc.ci_low < acc.mean_dlogp < acc.ci_high
    assert acc.overall_winner == "b" and acc.share_a_better == pytest.approx((DELTA > 0).mean())
    # The net gap is the first model's advantage less the second's.
    (wa, wb) = acc.winners
    assert wa.advantage - wb.advantage == pytest.approx(acc.net) == pytest.approx(DELTA.sum())
    assert wa.words_better + wb.words_better == (DELTA != 0).sum()


def _positions(sign: int, start: int, n: int) -> np.ndarray:
    """n positions from `start` on where the model of `sign` is better."""
    return np.flatnonzero(sign * DELTA > 0)[start : start + n]


def test_disjoint_findings_shares_add_up_to_their_union_and_with_what_is_left_to_100_percent():
    findings = [(0, "a", _positions(1, 0, 20)), (1, "a", _positions(1, 20, 30)), (2, "b", _positions(-1, 0, 25))]
    acc = gap_account(LP_A, LP_B, DOC, N_DOCS, "a", "b", findings)
    shares = {s.finding: s.share for s in acc.findings}
    wa, wb = acc.winners
    assert shares[0] == pytest.approx(DELTA[findings[0][2]].sum() / DELTA[DELTA > 0].sum())
    assert shares[2] == pytest.approx(DELTA[findings[2][2]].sum() / DELTA[DELTA < 0].sum())  # towards b: both sums negative
    assert wa.union_share == pytest.approx(shares[0] + shares[1]) and wb.union_share == pytest.approx(shares[2])
    assert wa.union_share + wa.left == pytest.approx(1.0) and shares[0] + shares[1] + wa.left == pytest.approx(1.0)
    assert (wa.findings, wa.union_words, wb.findings, wb.union_words) == (2, 50, 1, 25)
    every = np.concatenate([p for *_, p in findings])
    assert acc.findings_words == 75 and acc.findings_net_share == pytest.approx(DELTA[every].sum() / DELTA.sum())


def test_overlapping_findings_count_each_word_once():
    shared = _positions(1, 0, 10)
    findings = [(0, "a", np.concatenate([shared, _positions(1, 10, 10)])), (1, "a", np.concatenate([shared, _positions(1, 20, 10)]))]
    acc = gap_account(LP_A, LP_B, DOC, N_DOCS, "a", "b", findings)
    s0, s1 = (s.share for s in acc.findings)
    wa = acc.winners[0]
    overlap = DELTA[shared].sum() / DELTA[DELTA > 0].sum()
    assert wa.union_words == 30 and wa.union_share == pytest.approx(s0 + s1 - overlap)  # inclusion-exclusion
    assert wa.union_share <= s0 + s1 and wa.union_share + wa.left == pytest.approx(1.0)


def test_each_breakdown_partitions_the_words_and_its_shares_add_to_the_net_gap():
    groups = {"kind": (RNG.integers(0, 3, len(DELTA)), ["x", "y", "z"]), "place": (np.zeros(len(DELTA), dtype=np.int64), ["all", "never"])}
    out = slices(DELTA, DOC, N_DOCS, groups)
    for axis in groups:
        rows = [s for s in out if s.axis == axis]
        assert sum(s.words for s in rows) == len(DELTA)
        assert sum(s.gap_share for s in rows) == pytest.approx(1.0)
        for s in rows:
            assert s.ci_low <= s.mean_dlogp <= s.ci_high
    assert [s.name for s in out if s.axis == "place"] == ["all"]  # an empty slice is left out
    y = next(s for s in out if s.name == "y")
    assert y.mean_dlogp == pytest.approx(DELTA[groups["kind"][0] == 1].mean())


def test_frequency_bands_run_from_rare_forms_to_the_commonest():
    codes, names = frequency_bands(np.array([1, 2, 3, 10, 11, 100, 101, 4000]))
    assert codes.tolist() == [0, 0, 1, 1, 2, 2, 3, 4]
    assert names == ["seen 1–2 times", "seen 3–10 times", "seen 11–100 times", "seen 101–1,000 times", "seen 1,001–10,000 times"]


@pytest.mark.parametrize(
    "word, kind",
    [(" the", "function"), ("The", "function"), (" hath", "function"), (" king", "content"), (" King", "capitalised"), ("FOOL", "capitalised"),
     (",", "punctuation"), (".--", "punctuation"), (" 12", "number"), ("\n\n", "layout"), ("\n", "layout")],
)  # fmt: skip
def test_word_kinds_reuse_the_rule_grammars_classes(word, kind):
    assert word_kind(word) == kind and kind in KINDS


def test_sentences_start_after_a_full_stop_a_question_or_a_blank_line():
    words = ["[", "Enter", " the", " king", ".]", "\n", "What", " news", "?", "\n", "None", " at", "\n\n", "all", " now"]
    starts = sentence_starts(words)
    assert [w for w, s in zip(words, starts) if s] == ["Enter", "What", "None", "all"]


def test_places_partition_the_words_by_the_first_that_holds():
    opening = np.array([1, 0, 0, 0, 0], dtype=bool)
    blank = np.array([1, 1, 0, 0, 0], dtype=bool)
    line = np.array([1, 1, 1, 0, 0], dtype=bool)
    sentence = np.array([1, 1, 1, 1, 0], dtype=bool)
    assert [PLACES[c] for c in place_codes(opening, blank, line, sentence)] == list(PLACES)


def test_a_finding_carried_by_one_domain_is_flagged_and_one_spread_over_many_is_not():
    delta = np.array([2.0] * 8 + [0.5] * 4 + [-0.2] * 2)
    domains = np.array(["hamlet"] * 8 + ["lear"] * 4 + ["tempest"] * 2, dtype=object)
    d = finding_domains(0, delta, domains, 1, 3, n_corpus_domains=3)
    assert d.carried_by == "hamlet" and d.carried_share == pytest.approx(16.0 / delta.sum())
    assert [(r.domain, r.words, r.holds) for r in d.shown] == [("hamlet", 8, True), ("lear", 4, True)] and d.other_domains == 1
    assert sum(r.share for r in d.shown) + (-0.4 / delta.sum()) == pytest.approx(1.0)
    spread = finding_domains(1, np.ones(9), np.array(["a", "b", "c"] * 3, dtype=object), 1, 3, n_corpus_domains=3)
    assert spread.carried_by is None and all(r.share == pytest.approx(1 / 3) for r in spread.shown)
    # Towards the second model: shares are of its summed Δ, which is negative.
    towards_b = finding_domains(2, -np.array([3.0, 1.0, 1.0]), np.array(["a", "b", "c"], dtype=object), -1, 1, n_corpus_domains=3)
    assert towards_b.carried_by == "a" and towards_b.carried_share == pytest.approx(0.6)
    assert finding_domains(3, delta, domains, 1, 3, n_corpus_domains=1) is None  # one domain: nothing to compare
