"""The independent reader of statements (`evaluation.statement_truth`): on any text it reads every
kind of rule as the features stage's own `Rule.mask` does, so a run's findings can be checked
against what their statements say with code that did not write them. The runs' own checks are in
the pipeline tests (test_latent_findings, test_context_rules, test_rule_search)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.evaluation.statement_truth import _Document, _holds, _word_set_holds, class_of, form_of, left_class_of
from bbox_sae.features import context
from bbox_sae.features.rules import WORD_KINDS, Rule, word_attributes
from bbox_sae.features.word_sets import WordSet

PIECES = ["the", " cat", " Cat", " sat", ".", "?", "!", ",", "\n", "\n\n", "  ", " (", ")", " [", "]", ' "', '"', "Why", " what", "Is", " you",
          " in", " was", "GLOSTER", "Gloster", " 12", " my", " lord", "'", "s"]  # fmt: skip
RULES = [
    Rule("form", "f:cat"),
    Rule("form", "f:?", "context", "sentence_wh"),
    Rule("form", "f:?", "context", "sentence_other"),
    Rule("class", "c:allcaps", "layout", "after_blank"),
    Rule("form", "f:lord", "form", "f:my"),
    Rule("form", "f:lord", "form2", "f:the"),
    Rule("class", "c:word", "class", "c:preposition"),
    Rule("form", "f:you", "class", "c:start"),
    Rule("class", "c:punctuation", "layout", "line_start"),
    Rule("form", "f:\n", "form", "f:?"),
    Rule("class", "c:number", "class", "c:word"),
    Rule("form", "f: ", None, None),
    *(Rule(None, None, "context", flag) for flag in context.ALONE),
    Rule("class", "c:capitalised", "context", "in_brackets"),
    Rule("form", "f:lord", "cue", "f:why"),
    Rule("form", "f:?", "cue", "f:12"),
    Rule(None, None, "cue", "f:s"),
    Rule("form", "f:lord", "cue_sentence", "f:why"),
    Rule(None, None, "cue_sentence", "f:you"),
    Rule("form", "f:?", "cue_text", "f:cat"),
    Rule(None, None, "cue_text", "f:gloster"),
    Rule("forms", "f:?|f:lord|f:you", "cue_text", "f:cat"),
    Rule("forms", "f:lord|f:why", None, None),
]


def test_every_kind_of_rule_is_read_here():
    """A new kind of word part is an entry of `rules.WORD_KINDS`, and a new cue scope one of
    `context.CUE_KINDS`; the reader must be shown each, or its agreement above says nothing of it."""
    assert {r.word_kind for r in RULES} - {None} == set(WORD_KINDS)
    assert {r.left_kind for r in RULES} >= set(context.CUE_KINDS)
    assert {r.left_value for r in RULES if r.left_kind == "context"} == set(context.FLAGS)


def _reader_doc(words: list[str], docs: list[list[str]]) -> _Document:
    from collections import Counter

    from bbox_sae.evaluation.statement_truth import FLAG_READERS

    counts = Counter(form_of(w) for d in docs for w in d)
    return _Document(words, {f: r.matches(words, counts) for f, r in FLAG_READERS.items()})


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PIECES), min_size=1, max_size=60), min_size=1, max_size=3))
def test_the_independent_reader_reads_every_kind_of_rule_as_the_tool_defines_it(docs):
    # Every form a topic word: the reader says "with 'cat' earlier in the text" of any form, and the
    # tool keeps the forms that tell texts apart (`context.topic_forms`), which a few short
    # documents have none of.
    attrs = word_attributes(docs, topics=frozenset(form_of(w) for d in docs for w in d))
    starts = np.cumsum([0, *(len(d) for d in docs)])
    for rule in RULES:
        tool = rule.mask(attrs)
        for d, words in enumerate(docs):
            doc = _reader_doc(words, docs)
            mine = [_holds(rule.as_dict(), doc, i) for i in range(len(words))]
            np.testing.assert_array_equal(tool[starts[d] : starts[d + 1]], mine, err_msg=rule.describe())


def test_a_word_set_is_its_listed_forms_or_its_ending_outside_its_exclusions_with_its_left_condition():
    words = ["GLOSTER", ".", "\n\n", "LEAR", ".", "\n", "Learning", " quickly", " only", " lord", "\n\n", "lear"]
    doc = _reader_doc(words, [words])
    names = WordSet(("gloster", "lear"), (2, 1), left=Rule(None, None, "layout", "after_blank"))
    assert [i for i in range(len(words)) if _word_set_holds(json_of(names), doc, i)] == [0, 3, 11]
    endings = WordSet(("quickly",), (1,), suffix="ly", excluded=("only",))
    assert [i for i in range(len(words)) if _word_set_holds(json_of(endings), doc, i)] == [7]


def json_of(word_set: WordSet) -> dict:
    import json

    return json.loads(word_set.to_json())


def test_forms_and_classes_are_what_statements_say():
    assert form_of(" The") == "the" and form_of("\n\n") == "\n\n" and form_of("   ") == " " and form_of(None) == ""
    assert [class_of(w) for w in ("GLOSTER.", "Gloster", "A", "12", "--", "\n")] == [
        "allcaps",
        "capitalised",
        "capitalised",
        "number",
        "punctuation",
        "newline",
    ]
    assert left_class_of(None) == "start" and left_class_of(" upon") == "preposition" and left_class_of(" hath") == "auxiliary"
