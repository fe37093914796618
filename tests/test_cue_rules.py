"""Differences only the context shows (issue 55): a word form with a cue word shortly before
("'were' with 'if' among the 8 words before"), where the same form elsewhere does not differ."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.features.context import CUE_WINDOW, cue_windows
from bbox_sae.features.rule_search import search_rules
from bbox_sae.features.rules import Rule, word_attributes

PIECES = [" if", " you", " were", " here", ",", ".", "\n", " not", " love", "?"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(6)), max_size=40), st.lists(st.booleans(), min_size=40, max_size=40))
def test_a_cue_window_holds_the_last_words_before_each_once_nearest_first(codes, is_word):
    is_word = is_word[: len(codes)]
    window = cue_windows(codes, is_word)
    for i in range(len(codes)):
        before = [c for c, w in zip(codes[:i], is_word[:i]) if w][-CUE_WINDOW:]
        expected = list(dict.fromkeys(reversed(before)))
        assert window[i].tolist() == expected + [-1] * (CUE_WINDOW - len(expected))


def _corpus(rng, n_docs=400):
    """Sentences where 'were' after 'if' (within a few words) is model A's, 'were' elsewhere no one's,
    and 'love' everywhere is model A's."""
    docs, delta = [], []
    for _ in range(n_docs):
        words, d = [], []
        for _ in range(6):
            cue = rng.random() < 0.4
            sentence = [" if", " you", " were", " here"] if cue else [" you", " were", " here"]
            sentence += [" love", "."] + [" la"] * 8  # the next sentence's window does not reach this one's 'if'
            for w in sentence:
                words.append(w)
                d.append(2.0 if (w == " were" and cue) or w == " love" else 0.0)
        docs.append(words)
        delta += d
    return docs, np.array(delta)


def test_the_search_states_a_cue_that_decides_a_difference_and_no_cue_for_a_form_that_differs_everywhere():
    rng = np.random.default_rng(0)
    docs, delta = _corpus(rng)
    attrs = word_attributes(docs)
    n = len(attrs.form)
    lp_b = -rng.exponential(1.0, n)
    lp_a = lp_b + delta + rng.normal(0, 0.1, n)
    split = rng.random(n) < 0.5
    found = {f.rule: f for f in search_rules(attrs, np.flatnonzero(split), np.flatnonzero(~split), lp_a, lp_b, 5, 1.0, 0.1)}
    were_if = Rule("form", "f:were", "cue", "f:if")
    assert found[were_if].sign == 1
    assert were_if.describe() == "'were' with 'if' among the 8 words before"
    assert Rule("form", "f:were") not in found  # 'were' alone: 40% of its words differ, its median does not
    assert not any(r.left_kind == "cue" and r.word_value == "f:love" for r in found)  # 'love' differs everywhere: the form says it
    assert Rule("form", "f:love") in found
