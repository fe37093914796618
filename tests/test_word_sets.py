"""Word sets: what a latent's group of words shares, said in words and judged by that statement;
and how a latent's carrying words become groups."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.features import context, latent_sets
from bbox_sae.features.latent_sets import context_groups, group_forms
from bbox_sae.features.rules import Rule, word_attributes
from bbox_sae.features.significance import coherence
from bbox_sae.features.word_sets import WordSet, describe_word_set, suffix_parts, suffix_word_set

WORDS = [" is", " installed", " used", " the", " disk", " heart", " my", " lord", " stored", ".", "\n\n", " truly", " was"]


@given(st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12), min_size=1, max_size=6), st.integers(0, 2**31 - 1))
@settings(max_examples=120, deadline=None)
def test_a_word_set_judges_a_shown_word_as_it_judges_that_row(docs, seed):
    """The statement's judge on a context (the word and the words to its left, as a labeler sees
    them) agrees with the set's own rows: a reader checking the statement by hand checks the set."""
    attrs = word_attributes(docs)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(attrs.form), size=max(1, len(attrs.form) // 2), replace=False))
    word_set = describe_word_set(attrs, rows)
    mask = word_set.mask(attrs, np.arange(len(attrs.form)))
    assert mask[rows].all() or word_set.left is not None or word_set.suffix is not None
    if word_set.left is not None and word_set.left.left_value in context.BEYOND_SHOWN:
        # What a shown context cannot tell (the text's opening, a repeat from far back) is taken as holding.
        mask = replace(word_set, left=None).mask(attrs, np.arange(len(attrs.form)))
    flat = [(doc, i) for doc in docs for i in range(len(doc))]
    for (doc, i), expected in zip(flat, mask):
        assert word_set.matches(list(doc[:i]), doc[i]) == expected
    assert WordSet.from_json(word_set.to_json()) == word_set


def test_a_word_set_says_its_forms_its_ending_and_its_left_context():
    forms = ("used", "installed", "stored", "created", "configured", "required")
    subjects = (" it", " they", " this", " files", " that", " he")
    doc = [w for form, aux, subject in zip(forms, (" is", " are", " was") * 2, subjects) for w in (subject, aux, f" {form}", ".")]
    attrs = word_attributes([doc])
    participles = np.arange(2, len(doc), 4)
    word_set = describe_word_set(attrs, participles)
    assert word_set.suffix == "ed" and word_set.left == Rule(None, None, "class", "c:auxiliary")
    assert word_set.describe() == "a word ending in '-ed' (6 forms, most often 'configured', 'created', 'installed') right after an auxiliary verb"
    # The ending reaches forms the train words never had, the left context keeps other uses out.
    assert word_set.matches([" it", " is"], " removed") and not word_set.matches([" I"], " used")
    few = describe_word_set(attrs, participles[:2])
    assert few.suffix is None and few.describe() == "a group of 2 word forms, most often 'installed', 'used' right after an auxiliary verb"


def test_a_stray_form_or_one_the_model_rarely_wins_on_is_not_the_groups():
    """One stray 'three' in a group of body words would bring every 'three' into its set, and
    'first' carries only where it opens a speech: neither is the group's."""
    doc = [" heart"] * 10 + [" eyes"] * 10 + [" three"] * 30 + [" first"] * 10
    attrs = word_attributes([doc])
    train = np.arange(len(doc))
    dlogp = np.full(len(doc), 2.0)
    dlogp[52:] = 0.0  # 'first' wins on 2 of its 10 occurrences
    total = np.bincount(attrs.form[train], minlength=len(attrs.vocab))
    wins = np.bincount(attrs.form[train], weights=(dlogp[train] > 1.0).astype(float), minlength=len(attrs.vocab))
    members = np.r_[0:10, 10:20, 20, 50, 51]  # the body words, one 'three', the two winning 'first'
    kept = group_forms(attrs, members, total, wins)
    assert sorted({doc[i] for i in kept}) == [" eyes", " heart"]


@pytest.mark.parametrize("fit_words", [50_000, 50], ids=["every row", "fitted on a sample"])
def test_context_groups_keep_a_class_whole_and_unrelated_words_apart(fit_words, monkeypatch):
    monkeypatch.setattr(latent_sets, "FIT_WORDS", fit_words)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=64), rng.normal(size=64)
    body = a + 0.3 * rng.normal(size=(120, 64))  # one class, loosely spread: k-means cuts it, the join restores it
    numbers = b + 0.3 * rng.normal(size=(80, 64))
    rows = np.arange(10, 210)  # rows of a larger matrix, as a latent's carrying words are
    context = np.vstack([rng.normal(size=(10, 64)), body, numbers])
    labels = context_groups(context, rows, seed=0)
    assert len(set(labels[:120])) == 1 and len(set(labels[120:])) == 1 and labels[0] != labels[120]


def test_context_groups_of_contexts_without_direction_are_groups_not_a_scipy_error():
    """Issue 41 item 14: `build.output_feature_weight: 1` makes every context vector zero, and
    scipy's cosine linkage failed on the NaN distances; repeated contexts leave k-means clusters
    empty, whose centroids had no direction either."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    rows = np.arange(40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert set(context_groups(np.zeros((40, 8)), rows, seed=0)) <= set(range(40))
        repeated = np.repeat(np.eye(8)[:2], 20, axis=0)  # two distinct contexts, more clusters asked for
        labels = context_groups(repeated, rows, seed=0)
    assert len(set(labels[:20])) == 1 and len(set(labels[20:])) == 1 and labels[0] != labels[20]


@given(st.integers(1, 300), st.integers(1, 40), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_coherence_read_in_parts_is_the_coherence_of_all_rows(n_rows, fit_words, seed):
    rng = np.random.default_rng(seed)
    context = (rng.normal(size=(n_rows + 5, 8)) + rng.normal(size=8)).astype(np.float32)
    rows = np.sort(rng.choice(n_rows + 5, size=n_rows, replace=False))
    whole = coherence(np.asarray(context[rows], dtype=np.float32))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(latent_sets, "FIT_WORDS", fit_words)
        assert latent_sets.context_coherence(context, rows) == pytest.approx(whole, abs=1e-6)  # whole: float32 arithmetic


def test_a_group_joins_its_rules_only_when_its_other_words_differ_too():
    from bbox_sae.features.findings import adds_the_difference

    lp_a, lp_b = np.zeros(100), np.full(100, -2.0)  # A ahead by 2 nats everywhere
    rules, group = np.arange(0, 20), np.arange(0, 60)
    assert adds_the_difference(group, rules, lp_a, lp_b, 1)
    lp_b[20:60] = -0.2  # beyond the rules, A is barely ahead: the rules carried the group's test
    assert not adds_the_difference(group, rules, lp_a, lp_b, 1)
    assert adds_the_difference(rules, rules, lp_a, lp_b, 1)  # nothing beyond them


def test_a_group_without_an_ending_is_proposed_only_when_its_contexts_cohere():
    """Two latents carry the same 40 words, one with contexts around one point (a class), one with
    contexts scattered at random (a grab-bag of words one model happens to win on)."""
    from bbox_sae.features.latent_sets import latent_sets

    nouns = [" cat", " dog", " horse", " cow", " goat", " sheep", " duck", " hen"]
    doc = [w for i in range(40) for w in (" the" if i % 3 else " my", nouns[i % 8], ",")]
    attrs = word_attributes([doc])
    rng = np.random.default_rng(0)
    centre = rng.normal(size=32)
    words = np.arange(1, len(doc), 3)
    coherent, scattered = np.zeros((len(doc), 32)), rng.normal(size=(len(doc), 32))
    coherent[:] = centre + 0.2 * rng.normal(size=(len(doc), 32))
    dlogp = np.zeros(len(doc))
    dlogp[words] = 2.0
    fires = np.zeros(len(doc), dtype=bool)
    fires[words] = True
    train, holdout = np.arange(len(doc)), np.zeros(0, dtype=np.int64)
    pair, none = ("A", "B"), np.zeros(len(doc), dtype=bool)

    def sets_of(context):
        return latent_sets([(0, pair, 1)], {0: fires}.__getitem__, context, attrs, train, holdout, {pair: dlogp}, {(pair, 1): none}, 1.0, 5, 0)

    (found,) = sets_of(coherent)
    assert set(found.word_set.forms) == {n.strip() for n in nouns} and found.word_set.left is None
    assert sets_of(scattered) == []


def test_a_group_of_mostly_ly_words_splits_into_the_ending_and_the_rest():
    """Most of the forms end in '-ly': the '-ly' words are one set, said by the ending; 'thine' and
    'liege' are the rest, however frequent."""
    ly = [" truly", " freely", " presently", " gently", " swiftly", " sweetly"]
    doc = ly + [" thine"] * 20 + [" liege"] * 2
    attrs = word_attributes([doc])
    parts = suffix_parts(attrs, np.arange(len(doc)))
    assert [(sorted({doc[i] for i in rows}), suffix) for rows, suffix in parts] == [(sorted(ly), "ly"), ([" liege", " thine"], None)]


def test_frequent_forms_sharing_an_ending_by_chance_do_not_split_a_class():
    """'father', 'brother', 'mother' are most of the kin words after 'my' but 3 of its 7 forms:
    the class stays whole."""
    doc = [" father"] * 10 + [" brother"] * 8 + [" mother"] * 6 + [" son", " lord", " liege", " cousin"] * 2
    attrs = word_attributes([doc])
    rows = np.arange(len(doc))
    [(whole, suffix)] = suffix_parts(attrs, rows)
    assert suffix is None and np.array_equal(whole, rows)


def test_an_ending_reaches_unseen_forms_but_not_the_forms_train_shows_do_not_differ():
    words = [" truly", " freely", " gently", " swiftly", " sweetly"] * 2 + [" only"] * 6 + [" holy"] * 2
    train_doc = [w for i, word in enumerate(words) for w in ([".", ",", " and"][i % 3], word)]  # no left context shared
    attrs = word_attributes([train_doc, [" it", " only"], [" so", " kindly"]])
    train = np.arange(1, len(train_doc), 2)
    dlogp = np.full(len(attrs.form), 2.0)
    dlogp[train[10:16]] = 0.0  # the model wins on no 'only'
    dlogp[train[16]] = 0.0  # and on one 'holy' of two: half, enough
    total = np.bincount(attrs.form[train], minlength=len(attrs.vocab))
    wins = np.bincount(attrs.form[train], weights=(dlogp[train] > 1.0).astype(float), minlength=len(attrs.vocab))
    word_set = suffix_word_set(attrs, train[:10], "ly", total, wins, 0.5)
    assert word_set.excluded == ("only",)
    assert word_set.describe() == "a word ending in '-ly' (5 forms, most often 'freely', 'gently', 'sweetly') except 'only'"
    assert word_set.matches([" so"], " kindly") and word_set.matches([], " holy") and not word_set.matches([" it"], " only")
    assert not word_set.matches([], " fly")  # a two-letter ending needs a stem of two letters
    assert WordSet.from_json(word_set.to_json()) == word_set


def test_a_finding_said_by_its_words_names_a_left_context_as_a_condition_only_when_every_word_follows_it():
    """The demo's speakers' names: most open a speech, a few are named in the text. "at the start
    of a line" as a condition was untrue of those few; said as where most of them are, it is not."""
    from bbox_sae.features.word_sets import WordSet, describe_words_covered

    doc = [
        "Act",
        " one",
        " here",
        " now",
        " then",
        "\n\n",
        "GLOSTER",
        ".",
        "\n",
        "Go",
        "\n\n",
        "LEAR",
        ".",
        "\n",
        "Sir",
        " Gloster",
        " came",
        "\n\n",
        "GLOSTER",
        ".",
    ]
    attrs = word_attributes([doc])
    names = np.flatnonzero(np.isin(attrs.form, [attrs.code["f:gloster"], attrs.code["f:lear"]]))
    said = describe_words_covered(attrs, names)
    assert said.left is None and said.mask(attrs, names).all()
    assert said.describe() == "a group of 2 word forms, most often 'gloster', 'lear' (75% of them right after a blank line)"
    assert WordSet.from_json(said.to_json()) == said
    speech_starts = names[attrs.after_blank[names]]
    assert describe_words_covered(attrs, speech_starts).describe() == "a group of 2 word forms, most often 'gloster', 'lear' right after a blank line"
