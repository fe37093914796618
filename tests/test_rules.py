"""Context rules, Δ-blind ranking and findings: the pieces that make kept features nameable and honest."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.dataset import performance_columns
from bbox_sae.features import blind_rows
from bbox_sae.findings import group_latents
from bbox_sae.labeling import Context, context_matches
from bbox_sae.rules import Rule, best_rule, fit_rule, word_attributes
from bbox_sae.words import split_words

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
    layout = Rule("class", "c:allcaps", "layout", "after_blank")
    assert context_matches(layout, Context("not so?\n\n", "ROMEO", "."))
    assert not context_matches(layout, Context("said", " ROMEO", "."))


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["probs", "logprobs", "delta", "delta_context"]))
def test_blind_rows_do_not_depend_on_which_model_won(seed, mode):
    rng = np.random.default_rng(seed)
    lp = np.log(rng.uniform(0.01, 1, size=(20, 2)))
    emb = rng.normal(size=(20, 8))

    perf = performance_columns(lp, mode, emb)
    swapped = performance_columns(lp[:, ::-1], mode, emb)
    x = torch.tensor(np.hstack([emb, perf]), dtype=torch.float32)
    y = torch.tensor(np.hstack([emb, swapped]), dtype=torch.float32)
    assert torch.allclose(blind_rows(x, 8, mode), blind_rows(y, 8, mode))
    assert torch.equal(blind_rows(x, 8, mode)[:, :8], x[:, :8])


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
