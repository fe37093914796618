"""Context attributes (`features.context`): what a word's document holds to its left beyond the
word before. They are causal (a word's flags depend on nothing after it), they agree with the
planted rules' own, independent reading of the same conditions, rules state them in words, and a
difference that only they state comes back as a finding that says it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.errors import ConfigError
from bbox_sae.evaluation.planting import load_rules
from bbox_sae.features import context
from bbox_sae.features.rule_statements import describe_rules
from bbox_sae.features.rules import Rule, shown_word_attributes, word_attributes

PIECES = [
    "the",
    " cat",
    " sat",
    " the",
    " cat",
    ".",
    "?",
    "!",
    "\n",
    "\n\n",
    " (",
    ")",
    " [",
    "]",
    ' "',
    '"',
    "Why",
    " what",
    "Is",
    " you",
    "GLOSTER",
    " my",
    " lord",
]
docs_strategy = st.lists(st.lists(st.sampled_from(PIECES), min_size=1, max_size=80), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(docs_strategy, st.data())
def test_flags_are_causal_a_word_s_flags_do_not_change_with_what_follows(docs, data):
    rare = frozenset({"cat", "gloster"})
    full = word_attributes(docs, rare=rare)
    doc = data.draw(st.integers(0, len(docs) - 1))
    cut = data.draw(st.integers(1, len(docs[doc])))
    prefix = word_attributes([docs[doc][:cut]], rare=rare)
    start = sum(len(d) for d in docs[:doc])
    np.testing.assert_array_equal(prefix.context, full.context[start : start + cut])


@settings(max_examples=60, deadline=None)
@given(docs_strategy)
def test_flags_agree_with_the_planted_rules_independent_reading(docs):
    """Two implementations of one definition: the tool's attributes and the planted rules' checks
    (as the independent statement reader, `evaluation.statement_truth`, reads each flag)."""
    from collections import Counter

    from bbox_sae.evaluation.statement_truth import FLAG_READERS

    counts = Counter(w.strip().lower() for d in docs for w in d)
    assert set(FLAG_READERS) == set(context.FLAGS)
    attrs = word_attributes(docs)
    for flag, rule in FLAG_READERS.items():
        expected = np.concatenate([rule.matches(d, counts) for d in docs])
        np.testing.assert_array_equal(attrs.context[:, context.FLAGS.index(flag)], expected, err_msg=flag)


def test_a_long_range_repeat_is_one_last_used_more_than_the_gap_back():
    filler = [f" w{i}" for i in range(context.REPEAT_GAP)]
    attrs = word_attributes([["lord", *filler, " lord", " lord"]])
    repeat = attrs.context[:, context.FLAGS.index("repeat_far")]
    # The second 'lord' is 31 words after the first; the third follows the second at once.
    assert repeat.tolist() == [False] * (len(filler) + 1) + [True, False]


def test_a_sentence_s_opener_reaches_its_closing_mark_and_no_further():
    words = ["Why", " go", "?", " Is", " it", "?", "\n\n", "How", " now", "!"]
    attrs = word_attributes([words])
    wh, other = (attrs.context[:, context.FLAGS.index(f)] for f in ("sentence_wh", "sentence_other"))
    assert wh.tolist() == [True, True, True, False, False, False, False, True, True, True]
    assert other.tolist() == [False, False, False, True, True, True, False, False, False, False]


def test_context_rules_are_said_in_words_a_reader_checks():
    assert Rule("form", "f:?", "context", "sentence_wh").describe() == "'?' (question mark) in a sentence that began with a wh-word"
    assert Rule(None, None, "context", "repeat_far").describe() == f"a word repeated from more than {context.REPEAT_GAP} words back"
    assert Rule("class", "c:capitalised", "context", "in_brackets").describe() == "a capitalised word inside brackets"
    both = [Rule("form", "f:enter", "context", "in_brackets"), Rule("form", "f:exit", "context", "in_brackets")]
    assert describe_rules(both) == "'enter' or 'exit', each inside brackets"


def test_a_judge_reading_a_shown_context_checks_what_the_shown_words_tell():
    rule = Rule("form", "f:?", "context", "sentence_wh")
    assert rule.mask(shown_word_attributes(["Why", " go"], "?"))[-1]
    assert not rule.mask(shown_word_attributes(["Is", " it"], "?"))[-1]
    # A repeat from far back cannot be seen in a shown context: the word part is what is checked.
    far = Rule("form", "f:lord", "context", "repeat_far")
    assert far.mask(shown_word_attributes(["my"], " lord"))[-1] and not far.mask(shown_word_attributes(["my"], " lady"))[-1]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("{name: x, delta: 1, inside: parens}", "'inside': expected one of ['brackets', 'quotes']"),
        ("{name: x, delta: 1, repeat_gap: -3}", "'repeat_gap': expected a whole number >= 0"),
        ("{name: x, delta: 1, first_words: 2.5}", "'first_words': expected a whole number >= 0"),
        ("{name: x, delta: 1, sentence_start: '('}", "'sentence_start': not a regex"),
        ("{name: x, delta: 1}", "names no condition"),
    ],
)
def test_planted_context_conditions_are_validated_in_one_line(tmp_path, rule, message):
    path = tmp_path / "rules.yaml"
    path.write_text(f"rules:\n  - {rule}\n")
    with pytest.raises(ConfigError) as err:
        load_rules(path)
    assert message in str(err.value) and "rules[0]" in str(err.value) and "\n" not in str(err.value)


WH_QUESTIONS = ["Why did you go?", "What is the time?", "Where is the road?", "How did it end?"]
OTHER_QUESTIONS = ["Is it late?", "Did you go?", "Can we stay?", "Shall I come?"]
STATEMENTS = ["The road was long.", "We sat by the fire.", "She ran to the door.", "The sky was grey."]


def question_corpus(n_docs: int = 240) -> list[str]:
    rng = np.random.default_rng(5)
    return [" ".join(str(s) for s in [*rng.choice(STATEMENTS, 2), rng.choice(WH_QUESTIONS), rng.choice(OTHER_QUESTIONS)]) for _ in range(n_docs)]


def question_by_opener(words: list[str], idx: int) -> float:
    """+1 (A better) on '?' closing a wh-question, -1 (B better) on '?' closing any other."""
    if words[idx].strip() != "?":
        return 0.0
    start = idx
    while start > 0 and words[start - 1].strip() not in {".", "?", "!"}:
        start -= 1
    opener = next(w.strip().lower() for w in words[start:idx] if w.strip())
    return 1.0 if opener in context.WH_WORDS else -1.0


def test_one_mark_two_kinds_of_sentence_opposite_winners_are_two_findings_that_say_which(tmp_path):
    """'?' after "Why ...": A better; '?' after "Is it ...": B better. Said as the same form, they
    are one mark with two winners; the sentence's opener is what tells them apart."""
    from bbox_sae.artifacts import read_table
    from helpers.planted import assert_statements_true, planted_pipeline

    cfg, _, _ = planted_pipeline(tmp_path, planted_delta=2.0, docs=question_corpus(), is_planted=question_by_opener)
    assert_statements_true(cfg)
    findings = {f["statement"]: f["better_model"] for f in read_table(cfg.paths.findings).to_pylist()}
    assert findings.get("'?' (question mark) in a sentence that began with a wh-word") == "A"
    assert findings.get("'?' (question mark) in a sentence that did not begin with a wh-word") == "B"
