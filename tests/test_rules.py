"""Context rules, Δ-blind ranking and findings: the pieces that make kept features nameable and honest."""

import re
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bbox_sae.build.matrix import performance_columns
from bbox_sae.corpus.words import split_words
from bbox_sae.features import blind_rows
from bbox_sae.features.findings import group_latents
from bbox_sae.features.rules import Rule, any_mask, best_rule, cover_outside, fit_rule, normalize_form, ranked_rules, word_attributes
from bbox_sae.labeling import Context, context_matches

TEXT = "I do not know. Not I.\n\nROMEO.\nIs it not so? I will not go.\n\nJULIET.\nNot now; not here. They did not.\n"


def attrs_of(texts):
    docs = [split_words(t) for t in texts]
    return docs, word_attributes(docs)


def test_attributes_see_only_the_left_context():
    docs, attrs = attrs_of([TEXT])
    words = docs[0]
    after_aux = Rule("form", "f:not", "class", "c:auxiliary").mask(attrs)
    hits = [(words[i - 1].strip().lower(), words[i].strip()) for i in np.flatnonzero(after_aux)]
    assert hits == [("do", "not"), ("will", "not"), ("did", "not")]
    speakers = Rule("class", "c:allcaps", "layout", "after_blank").mask(attrs)
    assert [words[i] for i in np.flatnonzero(speakers)] == ["ROMEO", "JULIET"]
    # Changing what follows a word never changes its attributes (a causal LM cannot see it).
    _, other = attrs_of([TEXT.replace("I do not know.", "I do not care!")])
    k = words.index(" not")
    assert (attrs.form[k], attrs.left_form[k], attrs.line_start[k]) == (other.form[k], other.left_form[k], other.line_start[k])


def test_best_rule_recovers_a_conjunction():
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(300):
        aux = rng.choice([" is", " was", " do", " will"])
        other = rng.choice([" it", " they", " we", " and"])
        docs.append(split_words(f"They{aux} not here.{other} not there."))
    attrs = word_attributes(docs)
    truth = Rule("form", "f:not", "class", "c:auxiliary").mask(attrs)
    fires = truth.copy()
    top = np.flatnonzero(truth)[:50]
    fit = best_rule(attrs, top, fires, np.arange(len(fires)))
    assert fit.rule == Rule("form", "f:not", "class", "c:auxiliary")
    assert fit.precision == 1.0 and fit.recall == 1.0
    assert fit.rule.describe() == "'not' right after an auxiliary verb"
    # The word alone is only half right: its F1 is lower.
    assert fit_rule(Rule("form", "f:not"), attrs, top, fires, np.arange(len(fires))).f1 < 0.7


@given(seed=st.integers(0, 10**6), n_top=st.integers(1, 40), share=st.sampled_from([0.05, 0.2, 0.5]), chunk=st.sampled_from([7, 1 << 16]))
@settings(max_examples=40, deadline=None)
@example(seed=65536, n_top=17, share=0.5, chunk=7)  # no condition common to half the top words
def test_ranked_rules_fit_every_rule_as_fit_rule_does(seed, n_top, share, chunk):
    """The counts of every (word, left) pair come from one product of condition masks; each fit,
    and so the order, is `fit_rule`'s exactly (chunked sums included)."""
    import bbox_sae.features.rules as rules

    rng = np.random.default_rng(seed)
    vocab = [" the", " not", " is", " was", ",", " king", "\n", " And", " of", " it"]
    docs = [split_words("".join(rng.choice(vocab, size=int(rng.integers(5, 30))))) for _ in range(30)]
    attrs = word_attributes(docs)
    n = len(attrs.form)
    scope = np.sort(rng.choice(n, size=max(1, n // 2), replace=False))
    top = rng.choice(scope, size=min(n_top, len(scope)), replace=False)
    fires = rng.random(n) < 0.3
    original = rules._pair_counts
    rules._pair_counts = lambda *a, **k: original(*a, **{**k, "chunk": chunk})
    try:
        ranked = ranked_rules(attrs, top, fires, scope, share)
    finally:
        rules._pair_counts = original
    if not ranked:
        # Nothing is common to `share` of the top words (17 random words, half of them: seen).
        for column in (attrs.form, attrs.cls, attrs.left_form, attrs.left_cls):
            assert max(Counter(column[top].tolist()).values()) < share * len(top)
    for fit in ranked:
        assert fit == fit_rule(fit.rule, attrs, top, fires, scope)
    keys = [
        (round(f.f1, 4), f.rule.word_kind == "form", f.rule.word_kind is not None, -(f.rule.left_kind is not None), f.rule.left_kind == "form") for f in ranked
    ]
    assert keys == sorted(keys, reverse=True)


def test_what_else_a_latent_fires_on_is_said_only_where_it_mostly_fires():
    """A latent carries the 'st' finding and also fires on every 'Denmark', on 'the' only at a line
    start, on 2 of the 22 'of' and on one 'Moor': the rules outside 'st' are 'denmark' and "'the'
    right after a line break"; 'of' (precision 0.1) and 'Moor' (a single word) are not claimed."""
    docs = [split_words(f"Good St Anne of Denmark and the king,\nthe {w} of it.") for w in ["queen"] * 10 + ["Moor"]]
    attrs = word_attributes(docs)
    words = [w for d in docs for w in d]
    starts = np.cumsum([0] + [len(d) for d in docs])[:-1]
    the_at_start = [s + d.index("the") for s, d in zip(starts, docs)]
    fires = np.array([w.strip() in ("St", "Denmark", "Moor") for w in words])
    fires[the_at_start] = True
    firing_of = [s + d.index(" of") for s, d in zip(starts[:2], docs)]
    fires[firing_of] = True
    top = np.flatnonzero(fires)
    scope = np.arange(len(words))
    found = cover_outside([Rule("form", "f:st")], attrs, top, fires, scope)
    assert [f.rule.describe() for f in found] == ["'denmark'", "'the' right after a line break"]
    assert all(f.precision == 1.0 for f in found)
    assert cover_outside([Rule("form", "f:st")], attrs, top[np.isin(top, np.flatnonzero(attrs.form == attrs.code["f:st"]))], fires, scope) == []
    # Without the precision floor the rare 'of' would be claimed too (by some rule).
    loose = cover_outside([Rule("form", "f:st")], attrs, top, fires, scope, min_precision=0.0, max_rules=5)
    assert any_mask([f.rule for f in loose], attrs, np.array(firing_of)).all()
    assert not any_mask([f.rule for f in found], attrs, np.array(firing_of)).any()


def test_a_mixture_has_no_good_rule():
    docs, attrs = attrs_of([TEXT * 5])
    rng = np.random.default_rng(1)
    fires = rng.random(len(attrs.form)) < 0.3
    fit = best_rule(attrs, np.flatnonzero(fires)[:40], fires, np.arange(len(fires)))
    assert fit is None or fit.f1 < 0.5


def test_rule_labels_match_contexts_like_the_miner():
    rule = Rule("form", "f:not", "class", "c:auxiliary")
    assert context_matches(rule, Context("I do", " not", " know"))
    assert not context_matches(rule, Context("Not now;", " not", " here"))
    two_back = Rule("form", "f:were", "form2", "f:if")
    assert two_back.describe() == "'were' two words after 'if'"
    assert context_matches(two_back, Context("If you", " were", " here")) and not context_matches(two_back, Context("They", " were", " here"))
    layout = Rule("class", "c:allcaps", "layout", "after_blank")
    assert context_matches(layout, Context("not so?\n\n", "ROMEO", "."))
    assert not context_matches(layout, Context("said", " ROMEO", "."))


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["probs", "logprobs", "delta", "delta_context"]), st.sampled_from([(1.0,), (1.0, 0.25)]), st.integers(2, 3))
def test_blind_rows_do_not_depend_on_which_model_won(seed, mode, powers, n_models):
    rng = np.random.default_rng(seed)
    lp = np.log(rng.uniform(0.01, 1, size=(20, n_models)))
    emb = rng.normal(size=(20, 8))
    other_order = rng.permutation(n_models)

    perf = performance_columns(lp, mode, emb, powers)
    swapped = performance_columns(lp[:, other_order], mode, emb, powers)
    x = torch.tensor(np.hstack([emb, perf]), dtype=torch.float32)
    y = torch.tensor(np.hstack([emb, swapped]), dtype=torch.float32)
    assert torch.allclose(blind_rows(x, 8, mode, n_models), blind_rows(y, 8, mode, n_models), atol=1e-6)
    assert torch.equal(blind_rows(x, 8, mode, n_models)[:, :8], x[:, :8])
    if mode == "probs" and len(powers) > 1:  # each power's columns keep their own level
        blind = blind_rows(x, 8, mode, n_models)[:, 8:]
        assert torch.allclose(blind[:, n_models], torch.tensor(np.exp(0.25 * lp).mean(axis=1), dtype=torch.float32), atol=1e-6)


def test_latents_that_share_a_rule_or_their_words_form_one_finding():
    fires = np.zeros((100, 4), dtype=bool)
    fires[0:10, 0] = fires[0:10, 1] = True  # 0 and 1 fire on the same words
    fires[50:60, 2] = fires[70:80, 3] = True  # 2 and 3 share nothing
    keys = [("A", "B", "A")] * 3 + [("A", "B", "B")]
    tops = [np.arange(0, 10), np.arange(0, 10), np.arange(50, 60), np.arange(70, 80)]
    assert group_latents(keys, [None, None, "r", "r"], tops, fires, 0.5) == [[0, 1], [2], [3]]
    # Same rule and the same winner: one finding even without shared words.
    keys[3] = ("A", "B", "A")
    assert group_latents(keys, [None, None, "r", "r"], tops, fires, 0.5) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("rule", [Rule(None, None, "layout", "line_start"), Rule("class", "c:number", None, None)])
def test_rules_describe_themselves_in_words(rule):
    text = rule.describe()
    assert text and "None" not in text and "c:" not in text and "f:" not in text


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" \t\u00a0\n.,ab'")), min_size=1, max_size=12))
def test_no_rule_shows_a_form_a_reader_cannot_see(text):
    """Whitespace forms are said in words ("a run of spaces right after '.' (full stop)"), never quoted blanks."""
    for word in split_words(text):
        form = "f:" + normalize_form(word)
        for rule in (Rule("form", form, None, None), Rule(None, None, "form", form), Rule("form", "f:a", "form", form)):
            assert not re.search(r"'\s+'", rule.describe()), rule.describe()
    assert Rule("form", "f: ", "form", "f:.").describe() == "a run of spaces right after '.' (full stop)"


def _speech_corpus(n_docs: int = 200, seed: int = 0):
    """Speeches whose first word (after a blank line) B predicts 2 nats worse; elsewhere A = B + noise."""
    rng = np.random.default_rng(seed)
    names = ["ROMEO", "JULIET", "NURSE", "PETER", "TYBALT"]
    docs = []
    for _ in range(n_docs):
        # Names also occur mid-line, where nothing differs: only the layout singles out speech starts.
        text = "\n\n".join(f"{rng.choice(names)}. Good night, good night! Parting is such sweet sorrow, {rng.choice(names)}." for _ in range(3))
        docs.append(split_words(text))
    attrs = word_attributes(docs)
    words = [w for d in docs for w in d]
    truth = np.array([i == 0 or words[i - 1].count("\n") > 1 for i in range(len(words))])
    # Each document starts a new speech too.
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
    truth[starts] = True
    lp_a = np.log(rng.uniform(0.05, 0.5, size=len(words)))
    lp_b = lp_a + rng.normal(0, 0.1, size=len(words)) - 2.0 * truth
    return attrs, words, truth, np.minimum(lp_a, 0), np.minimum(lp_b, 0)


def test_a_latent_mixing_groups_proposes_a_rule_per_group_and_generalizes_it():
    from bbox_sae.features.findings import propose_rules

    attrs, words, truth, lp_a, lp_b = _speech_corpus()
    n = len(words)
    scope = np.arange(n)
    # The latent fires on 'ROMEO' speech starts (A wins there) and on '!' (no difference).
    romeo = np.flatnonzero(truth & (attrs.form == attrs.vocab.index("f:romeo")))
    bang = np.flatnonzero(attrs.form == attrs.vocab.index("f:!"))
    fires = np.zeros(n, dtype=bool)
    fires[romeo] = fires[bang] = True
    top = np.concatenate([romeo[:25], bang[:25]])
    rules = propose_rules(attrs, top, fires, scope, lp_a, lp_b, 1, 0.2, 3, 1.0, 0.1)
    assert len(rules) == 1  # '!' carries no difference, so it proposes nothing
    rule, _ = rules[0]
    # 'romeo' after a blank line generalizes to every speech start, and no further.
    assert rule.word_kind != "form" and rule.left_kind == "layout"
    assert truth[rule.mask(attrs)].mean() == 1.0 and rule.mask(attrs)[truth].mean() == 1.0
    assert propose_rules(attrs, top, fires, scope, lp_a, lp_b, -1, 0.2, 3, 1.0, 0.1) == []


def test_generalizing_stops_where_the_difference_thins_out():
    from bbox_sae.features.findings import Difference, generalize

    attrs, words, truth, lp_a, lp_b = _speech_corpus()
    scope = np.arange(len(words))
    # Only 'good' right after a capitalised word... is not where A wins: nothing to generalize from.
    good = Rule("form", "f:good", "class", "c:punctuation")
    assert generalize(good, Difference(attrs, scope, lp_a, lp_b, 1), np.flatnonzero(good.mask(attrs)), 1.0, 0.1) is None
    romeo = Rule("form", "f:romeo", "layout", "after_blank")
    covered = np.flatnonzero(romeo.mask(attrs))
    broad = generalize(romeo, Difference(attrs, scope, lp_a, lp_b, 1), covered, 1.0, 0.1)
    # 'romeo' alone, or any all-capitals word, would take in the names mid-line: the layout stays.
    assert broad.left_kind == "layout" and broad.mask(attrs)[truth].mean() == 1.0


def test_nested_rules_are_one_finding():
    from bbox_sae.features.findings import nested_groups

    numbers, fours, brackets = np.arange(0, 100), np.arange(0, 20), np.arange(200, 240)
    pair = (("A", "B"), 1)
    assert nested_groups([numbers, fours, brackets], [pair, pair, pair], 0.5) == [[0, 1], [2]]
    assert nested_groups([numbers, fours], [pair, (("A", "B"), -1)], 0.5) == [[0], [1]]


def test_a_small_unit_inside_two_groups_does_not_join_them():
    """Planted number words (rows 0-99) and body words (100-199): a latent's group of body words
    that also lists 'hundred' (rows 0-5) holds every 'hundred', as do two groups of number words.
    Chained nesting made the two classes one finding; 'hundred' joins the numbers, held by two."""
    from bbox_sae.features.findings import nested_groups, nested_trees

    numbers, body_and_hundred, hundred, heart, big_numbers = np.arange(0, 100), np.r_[0:6, 100:200], np.arange(0, 6), np.arange(100, 130), np.arange(0, 20)
    key = (("A", "B"), -1)
    sets, keys = [numbers, body_and_hundred, hundred, heart, big_numbers], [key] * 5
    assert nested_groups(sets, keys, 0.8) == [[0, 1, 2, 3, 4]]
    assert nested_trees(sets, keys, 0.8) == [[0, 2, 4], [1, 3]]
    assert nested_trees(sets, [key, key, key, key, (("A", "B"), 1)], 0.8) == [
        [0],
        [1, 2, 3],
        [4],
    ]  # held by one group of each: the larger share, then the larger group


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.integers(0, 40), min_size=1, max_size=25), min_size=1, max_size=8), st.lists(st.sampled_from([1, -1]), min_size=8, max_size=8))
def test_nested_trees_put_each_unit_with_a_larger_unit_that_holds_it(word_sets, signs):
    from bbox_sae.features.findings import nested_trees

    sets = [np.array(sorted(s)) for s in word_sets]
    keys = [(("A", "B"), sign) for sign in signs[: len(sets)]]
    groups = nested_trees(sets, keys, 0.8)
    assert sorted(i for g in groups for i in g) == list(range(len(sets)))
    for g in groups:
        opener = max(g, key=lambda i: (len(sets[i]), -i))
        assert len({keys[i] for i in g}) == 1
        for i in g:
            if i != opener:  # held (>= 80%) by a member at least as large
                assert any(len(sets[j]) >= len(sets[i]) and np.isin(sets[i], sets[j]).sum() >= 0.8 * len(sets[i]) for j in g if j != i)
    openers = [max(g, key=lambda i: (len(sets[i]), -i)) for g in groups]
    for a in openers:  # an opener is held by no larger unit of its key, else it had joined that unit's group
        for b in range(len(sets)):
            if b != a and keys[a] == keys[b] and (len(sets[b]), -b) > (len(sets[a]), -a):
                assert np.isin(sets[a], sets[b]).sum() < 0.8 * len(sets[a])


def test_a_nested_group_is_said_by_the_broadest_rule_that_adds_only_differing_words():
    """Speech starts (rows 0-99) differ by 2 nats; "an all-capitals word" takes them in with 40
    capitals mid-line (rows 100-139) that differ in nothing, yet still passes on its median. The group
    is said by "a word after a blank line"; a broader rule whose extra words differ too ('?' over
    "'?' after a comma") stays the head, by its log-prob difference even when its Δp is smaller."""
    from bbox_sae.features.findings import group_head

    rng = np.random.default_rng(0)
    lp_a = np.log(rng.uniform(0.05, 0.3, size=300))
    lp_b = lp_a.copy()
    lp_b[:100] -= 2.0
    after_blank, capitals, mid_capitals = np.arange(0, 100), np.arange(0, 140), np.arange(100, 140)
    assert np.median((lp_a - lp_b)[capitals]) > 1.0  # the broad rule passes the effect rule by itself
    assert group_head([0, 1], [capitals, after_blank], lp_a, lp_b, 1) == 1
    assert group_head([0, 1], [after_blank, capitals[:60]], lp_a, lp_b, 1) == 0  # nothing added: broadest
    assert group_head([1], [capitals, mid_capitals], lp_a, lp_b, 1) == 1

    questions, after_comma = np.arange(200, 300), np.arange(200, 220)
    lp_a[200:220] = np.log(0.5)  # likelier after a comma: the same 2 nats move more probability there
    lp_b[200:300] = lp_a[200:300] - 2.0
    assert group_head([0, 1], [questions, after_comma], lp_a, lp_b, 1) == 0


def test_a_latent_group_is_one_finding_with_the_rules_inside_it_and_nothing_else():
    """A latent's group of body words holds the fragment rules 'heart' and 'eyes': one finding. '?'
    (same winner) lies outside it and stays a finding of its own, and a rule of the other winner
    never joins, however the words overlap."""
    from bbox_sae.features.findings import nested_groups

    body, heart, eyes, question = np.arange(0, 100), np.arange(0, 20), np.arange(20, 40), np.arange(200, 240)
    key, other = (("A", "B"), 1), (("A", "B"), -1)
    assert nested_groups([body, heart, eyes, question], [key] * 4, 0.5) == [[0, 1, 2], [3]]
    assert nested_groups([body, heart, eyes, question], [key, other, key, key], 0.5) == [[0, 2], [1], [3]]
    assert nested_groups([heart, eyes], [key, key], 0.5) == [[0], [1]]  # disjoint fragments alone stay apart


def test_a_rule_states_a_word_set_only_when_both_mostly_coincide():
    from bbox_sae.features.findings import states

    words = np.arange(100)
    assert states(np.arange(5, 100), words) and states(np.arange(0, 110), words)
    assert not states(np.arange(0, 60), words)  # says only part of the set
    assert not states(np.arange(0, 200), words)  # says much more than the set
    assert not states(np.zeros(0, np.int64), words)


def test_rules_after_one_word_are_said_once():
    from bbox_sae.features.rule_statements import describe_rules

    mother, brother = Rule("form", "f:mother", "form", "f:my"), Rule("form", "f:brother", "form", "f:my")
    lord = Rule("form", "f:lord", "form", "f:my")
    assert describe_rules([lord, mother, brother]) == "'lord', 'mother' or 'brother', each right after 'my'"
    assert describe_rules([mother, Rule("form", "f:?"), brother]) == "'mother' or 'brother', each right after 'my'; or '?' (question mark)"
    assert describe_rules([Rule("form", "f:thou"), Rule("form", "f:thy")]) == "'thou' or 'thy'"


def test_a_rule_broader_than_the_difference_gives_way_to_the_next_best():
    """The latent fires on every word after 'configuration', but B wins only on 'file(s)': the best-fitting
    rule ("a lower-case word right after 'configuration'") is not a difference, so the rules that are
    come out instead of nothing."""
    from bbox_sae.features.findings import propose_rules

    rng = np.random.default_rng(0)
    nouns = [" file", " files", " of", " is", " management", " of", " is", " management"]
    docs = [split_words(f"The configuration{rng.choice(nouns)} was changed.") for _ in range(400)]
    attrs = word_attributes(docs)
    n = len(attrs.form)
    scope = np.arange(n)
    after = Rule(None, None, "form", "f:configuration").mask(attrs)
    planted = after & np.isin(attrs.form, [attrs.vocab.index("f:file"), attrs.vocab.index("f:files")])
    lp_a = np.log(rng.uniform(0.01, 0.04, size=n))
    lp_b = np.minimum(lp_a + 3.0 * planted + rng.normal(0, 0.05, size=n), 0.0)
    fires = after.copy()
    top = np.flatnonzero(after)[:60]
    broad = Rule("class", "c:word", "form", "f:configuration")
    assert fit_rule(broad, attrs, top[planted[top]], fires, scope).f1 == 1.0  # the best fit, yet no difference
    rules = {rule for rule, _ in propose_rules(attrs, top, fires, scope, lp_a, lp_b, -1, 0.2, 3, 1.0, 0.1)}
    assert rules and all(planted[r.mask(attrs)].mean() == 1.0 for r in rules)
    assert planted[np.logical_or.reduce([r.mask(attrs) for r in rules])].mean() == 1.0


def test_a_latent_is_a_feature_of_a_finding_only_when_the_finding_covers_it():
    from bbox_sae.features.findings import expresses

    docs, attrs = attrs_of([TEXT * 3])
    nots = np.flatnonzero(Rule("form", "f:not").mask(attrs))
    others = np.flatnonzero(~Rule("form", "f:not").mask(attrs))
    assert expresses(nots, nots, 0.2)
    # 'not' is 1 of 10 top words: the latent proposed the finding, but it is about something else.
    assert not expresses(nots, np.concatenate([nots[:1], others[:9]]), 0.2)
    assert expresses(nots, np.concatenate([nots[:2], others[:8]]), 0.2)
    assert not expresses(nots, np.array([], dtype=int), 0.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=40), st.lists(st.integers(0, 60), max_size=40))
def test_shared_count_is_the_size_of_the_intersection(a, b):
    from bbox_sae.features.findings import shared_count

    a, b = np.unique(a), np.unique(b)
    assert shared_count(a, b) == shared_count(b, a) == len(set(a.tolist()) & set(b.tolist()))


def test_rules_saying_the_same_words_are_said_by_the_one_naming_the_form_without_a_context_attribute():
    """ "'you'" and "'you' in a sentence that did not begin with a wh-word" hold the same words: the
    broad one adds nothing, and it is the one said; "punctuation right after 'marry'" and "','
    right after 'marry'" too, said by the comma. A narrower rule inside a broad one whose extra
    words differ in nothing is still the head ('you' after a conjunction inside 'you')."""
    from bbox_sae.features.findings import group_head, saying_order

    rng = np.random.default_rng(0)
    lp_a = np.log(rng.uniform(0.05, 0.3, size=200))
    lp_b = lp_a - 2.0
    you, you_not_wh = np.arange(0, 100), np.arange(0, 96)
    rules = [Rule("form", "f:you", "context", "sentence_other"), Rule("form", "f:you")]
    prefer = [saying_order(r) for r in rules]
    assert group_head([0, 1], [you_not_wh, you], lp_a, lp_b, 1, prefer=prefer) == 1
    marks = [Rule("class", "c:punctuation", "form", "f:marry"), Rule("form", "f:,", "form", "f:marry")]
    assert group_head([0, 1], [you, you_not_wh], lp_a, lp_b, 1, prefer=[saying_order(r) for r in marks]) == 1
    lp_b[20:100] = lp_a[20:100]  # only the first 20 differ: 'you' after a conjunction
    after_conjunction = np.arange(0, 20)
    two = [Rule("form", "f:you"), Rule("form", "f:you", "class", "c:conjunction")]
    assert group_head([0, 1], [you, after_conjunction], lp_a, lp_b, 1, prefer=[saying_order(r) for r in two]) == 1


def test_a_chain_of_nesting_is_cut_at_its_head_and_what_the_head_does_not_hold_stays_a_difference():
    """X and Y share no word; L, half inside each, chains them into one nested group. The head says
    X (and L, mostly inside it); Y, which X does not hold, is a unit of its own, not lost."""
    from bbox_sae.features.findings import headed_groups, nested_groups

    lp_a = np.full(300, np.log(0.2))
    lp_b = lp_a - 2.0
    x, y, link = np.arange(0, 100), np.arange(100, 200), np.arange(80, 120)
    rows = [x, y, link]
    keys = [("a", "b", 1)] * 3
    [chain] = nested_groups(rows, keys, 0.5)
    assert sorted(chain) == [0, 1, 2]
    cut = headed_groups(chain, rows, rows, keys, lp_a, lp_b, 1, [(0,), (0,), (1,)], 0.5)
    assert sorted((sorted(members), head) for members, head in cut) == [([0, 2], 0), ([1], 1)]
