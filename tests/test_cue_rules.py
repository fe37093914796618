"""Differences only the context shows (issue 55): a word form with a cue word shortly before
("'were' with 'if' among the 8 words before"), where the same form elsewhere does not differ."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.features.context import CUE_SCOPES, CUE_WINDOW, cue_windows
from bbox_sae.features.rule_search import search_rules
from bbox_sae.features.rule_statements import describe_rules
from bbox_sae.features.rules import Rule, word_attributes

PIECES = [" if", " you", " were", " here", ",", ".", "\n", " not", " love", "?"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(6)), max_size=40), st.lists(st.booleans(), min_size=40, max_size=40))
def test_a_cue_window_holds_the_last_words_before_each_once_nearest_first(codes, is_word):
    is_word = is_word[: len(codes)]
    window = cue_windows(codes, is_word)[0]
    for i in range(len(codes)):
        before = [c for c, w in zip(codes[:i], is_word[:i]) if w][-CUE_WINDOW:]
        expected = list(dict.fromkeys(reversed(before)))
        assert window[i].tolist() == expected + [-1] * (CUE_WINDOW - len(expected))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 70), st.booleans(), st.booleans(), st.booleans()), max_size=120))
def test_the_sentence_and_text_windows_hold_the_forms_before_each_word_in_their_scope_latest_use_first(tokens):
    codes, is_word, ends, topical = (list(column) for column in zip(*tokens)) if tokens else ([], [], [], [])
    _, sentence, text = cue_windows(codes, is_word, ends, topical)
    start = 0
    for i in range(len(codes)):
        for window, first, keep in ((sentence, start, lambda j: is_word[j]), (text, 0, lambda j: is_word[j] and topical[j])):
            before = [codes[j] for j in range(first, i) if keep(j)]
            expected = list(dict.fromkeys(reversed(before)))[: window.shape[1]]
            assert window[i].tolist() == expected + [-1] * (window.shape[1] - len(expected))
        if ends[i]:
            start = i + 1


def test_each_scope_is_said_as_far_back_as_it_reaches():
    said = [Rule("form", "f:arms", scope.kind, "f:war").describe() for scope in CUE_SCOPES]
    assert said == ["'arms' with 'war' among the 8 words before", "'arms' with 'war' earlier in its sentence", "'arms' with 'war' earlier in the text"]
    assert Rule(None, None, "cue_sentence", "f:thou").describe() == "a word with 'thou' earlier in its sentence"


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


def _searched(docs, delta, rng):
    """The search's rules by rule, on model B's random log-probs and model A's = B's + `delta` + noise."""
    attrs = word_attributes(docs)
    n = len(attrs.form)
    lp_b = -rng.exponential(1.0, n)
    lp_a = lp_b + delta + rng.normal(0, 0.1, n)
    split = rng.random(n) < 0.5
    return {f.rule: f for f in search_rules(attrs, np.flatnonzero(split), np.flatnonzero(~split), lp_a, lp_b, 5, 1.0, 0.1)}


def test_the_search_states_a_cue_that_decides_a_difference_and_no_cue_for_a_form_that_differs_everywhere():
    rng = np.random.default_rng(0)
    docs, delta = _corpus(rng)
    found = _searched(docs, delta, rng)
    were_if = Rule("form", "f:were", "cue", "f:if")
    assert found[were_if].sign == 1
    assert were_if.describe() == "'were' with 'if' among the 8 words before"
    assert Rule("form", "f:were") not in found  # 'were' alone: 40% of its words differ, its median does not
    assert not any(r.left_kind == "cue" and r.word_value == "f:love" for r in found)  # 'love' differs everywhere: the form says it
    assert Rule("form", "f:love") in found


def _topic_and_register_corpus(rng, n_docs=300):
    """A fifth of the texts name 'war' at their start, and there 'king' is model A's; a sentence
    that said 'thou' is model B's from then on, every word and mark; elsewhere nothing differs."""
    docs, delta = [], []
    for _ in range(n_docs):
        war = rng.random() < 0.2
        words, d = ([" war", "."], [0.0, 0.0]) if war else ([" peace", "."], [0.0, 0.0])
        for _ in range(8):
            familiar = rng.random() < 0.3
            sentence = [" the", " king", " said"] + ([" thou", " art", " here"] if familiar else [" you", " are", " here"]) + [" now", "."]
            after_thou = False
            for w in sentence:
                words.append(w)
                d.append(2.0 if (w == " king" and war) else -2.0 if after_thou else 0.0)
                after_thou |= w == " thou"
        docs.append(words)
        delta += d
    return docs, np.array(delta)


def test_the_search_states_a_topic_by_a_cue_earlier_in_the_text_and_a_register_by_a_cue_earlier_in_the_sentence():
    rng = np.random.default_rng(1)
    docs, delta = _topic_and_register_corpus(rng)
    found = _searched(docs, delta, rng)
    topic, register = Rule("form", "f:king", "cue_text", "f:war"), Rule(None, None, "cue_sentence", "f:thou")
    assert found[topic].sign == 1 and found[register].sign == -1
    assert Rule("form", "f:king") not in found  # four fifths of its words differ nowhere
    # Every form after 'thou' differs: the register says them, no form says it again.
    assert not any(r.word_kind and r.left_kind == "cue_sentence" and r.left_value == "f:thou" for r in found)
    # A cue earlier in the text is no cue in the next text.
    assert set(found[topic].holdout_rows) <= set(np.flatnonzero(delta == 2.0))


def test_one_word_part_after_several_cues_of_one_scope_is_said_once():
    register = [Rule(None, None, "cue_sentence", f"f:{cue}") for cue in ("thou", "thy", "thee")]
    assert describe_rules(register) == "a word with 'thou', 'thy' or 'thee' earlier in its sentence"
    topic = [Rule("form", "f:king", "cue_text", "f:war"), Rule("form", "f:lord", "cue_text", "f:war")]
    assert describe_rules(topic) == "'king' or 'lord', each with 'war' earlier in the text"
