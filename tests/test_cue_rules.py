"""Differences only the context shows (issue 55): a word form with a cue word shortly before
("'were' with 'if' among the 8 words before"), where the same form elsewhere does not differ."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.config import FeaturesConfig
from bbox_sae.features.context import CUE_SCOPES, CUE_WINDOW, cue_windows
from bbox_sae.features.rule_search import search_rules, search_topic_rules
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


NOUNS = [f" n{i}" for i in range(24)] + [" arms", " field", " colours", " drum", " horse", " sword"]
TOPIC_FORMS = {"f:arms", "f:field", "f:colours", "f:drum", "f:horse", "f:sword"}


TOPIC_CUES = (" war", " battle", " soldier")


def _topic_corpus(rng, planted: bool, n_docs=400, soldier_share=0.0):
    """Some texts open on 'war' or 'battle' (and `soldier_share` on 'soldier'); there six of 30
    nouns are model A's (when `planted`), each of them with its cue on a few train words only;
    elsewhere nothing differs."""
    docs, delta = [], []
    for _ in range(n_docs):
        r = rng.random()
        cue = rng.choice([" war", " battle"]) if r < 0.15 else " soldier" if r < 0.15 + soldier_share else rng.choice([" peace", " feast", " court", " sea"])
        words, d = [cue, "."], [0.0, 0.0]
        for _ in range(12):
            noun = NOUNS[rng.integers(len(NOUNS))]
            for w in (" the", noun, " was", " here", "."):
                words.append(w)
                d.append(2.0 if planted and w == noun and cue in TOPIC_CUES and f"f:{noun.strip()}" in TOPIC_FORMS else 0.0)
        docs.append(words)
        delta += d
    return docs, np.array(delta)


def test_a_topic_told_by_several_forms_each_rare_with_its_cue_is_a_set_of_forms_with_each_cue_and_nothing_without_it():
    rng = np.random.default_rng(2)
    docs, delta = _topic_corpus(rng, planted=True)
    attrs = word_attributes(docs)
    lp_b = -rng.exponential(1.0, len(delta))
    lp_a = lp_b + delta + rng.normal(0, 0.1, len(delta))
    train, holdout = np.flatnonzero(rng.random(len(delta)) < 0.5), None
    holdout = np.setdiff1d(np.arange(len(delta)), train)
    topics = search_topic_rules(attrs, train, holdout, lp_a - lp_b, 5, 1.0)
    # Each cue chooses a set, and each set holds after the other cue too (`_more_cues`).
    sets = {f.rule.word_value for f in topics}
    assert {(v, c) for v in sets for c in ("f:battle", "f:war")} == {(f.rule.word_value, f.rule.left_value) for f in topics}
    assert all(f.sign == 1 for f in topics)
    planted = np.flatnonzero(delta == 2.0)
    for f in topics:
        # Its forms are chosen on half of train's texts: one is missing only where that half held fewer than 2 of its words.
        assert f.rule.word_kind == "forms" and 4 <= len(f.rule.word_value.split("|")) and set(f.rule.word_value.split("|")) <= TOPIC_FORMS
        assert np.isin(f.holdout_rows, planted).all() and np.array_equal(f.holdout_rows, holdout[f.rule.mask(attrs, holdout)])
    # A form the choosing half saw once with a cue is left out of that cue's set (74% covered here).
    covered = np.unique(np.concatenate([f.holdout_rows for f in topics]))
    assert len(covered) >= 0.6 * np.isin(holdout, planted).sum()
    # The same texts with nothing planted: no set of forms passes on the confirming texts.
    null_docs, null_delta = _topic_corpus(np.random.default_rng(2), planted=False)
    null_attrs = word_attributes(null_docs)
    noise = np.random.default_rng(3).normal(0, 1.0, len(null_delta))
    assert search_topic_rules(null_attrs, train, holdout, noise, 5, 1.0) == []


def test_a_cue_too_rare_to_choose_forms_of_its_own_extends_a_topic_set_that_another_cue_chose():
    """3% of texts open on 'soldier': no (form, 'soldier') pair is frequent enough to choose a set,
    yet pooled over the forms 'war' chose, 'soldier' passes on the confirming texts."""
    rng = np.random.default_rng(1)
    docs, delta = _topic_corpus(rng, planted=True, soldier_share=0.03)
    attrs = word_attributes(docs)
    lp_b = -rng.exponential(1.0, len(delta))
    lp_a = lp_b + delta + rng.normal(0, 0.1, len(delta))
    train = np.flatnonzero(rng.random(len(delta)) < 0.5)
    holdout = np.setdiff1d(np.arange(len(delta)), train)
    topics = search_topic_rules(attrs, train, holdout, lp_a - lp_b, 5, 1.0)
    by_soldier = [f for f in topics if f.rule.left_value == "f:soldier"]
    assert len(by_soldier) == 1 and by_soldier[0].sign == 1
    assert any(f.rule.word_value == by_soldier[0].rule.word_value for f in topics if f.rule.left_value != "f:soldier")
    planted = np.flatnonzero(delta == 2.0)
    assert np.isin(by_soldier[0].holdout_rows, planted).all() and len(by_soldier[0].holdout_rows) >= 10
    # Each rule once, though two cues' sets of the same forms extend to each other's cue.
    assert len({(f.rule, f.sign) for f in topics}) == len(topics)


def test_a_set_of_forms_holds_where_one_of_its_forms_does_and_is_said_as_a_topic_after_all_its_cues():
    attrs = word_attributes([[" war", ".", " the", " arms", " and", " field", " sword", " arms", "."]])
    arms_field = Rule("forms", "f:arms|f:field", "cue_text", "f:war")
    assert (
        arms_field.mask(attrs).tolist()
        == (Rule("form", "f:arms", "cue_text", "f:war").mask(attrs) | Rule("form", "f:field", "cue_text", "f:war").mask(attrs)).tolist()
    )
    assert arms_field.describe() == "'arms' or 'field' with 'war' earlier in the text"
    by_battle = Rule("forms", "f:field|f:sword", "cue_text", "f:battle")
    assert describe_rules([arms_field, by_battle]) == "'arms', 'field' or 'sword' with 'war' or 'battle' earlier in the text"


def test_detection_against_the_same_forms_elsewhere_scores_a_list_of_forms_at_chance_and_a_cue_by_what_it_says():
    from bbox_sae.labeling.finding_statements import Statement, same_forms_detection
    from bbox_sae.labeling.records import Context, FeatureExamples

    with_if = tuple(Context(left, " were", "") for left in ("if you", "and if it please you that I", "if she"))
    without = tuple(Context(left, " were", "") for left in ("you", "they", "as we"))
    other = (Context("the", " king", ""),)
    feature = FeatureExamples(0, train=with_if, holdout=with_if, negative=without + other, comparisons=())
    cue = Statement("'were' with 'if' among the 8 words before", "rule", rules=(Rule("form", "f:were", "cue", "f:if"),))
    forms = Statement("'were'", "rule", rules=(Rule("form", "f:were"),))
    assert same_forms_detection(cue, feature) == 1.0 and same_forms_detection(forms, feature) == 0.5
    topic = Statement("'were' with 'war' earlier in the text", "rule", rules=(Rule("form", "f:were", "cue_text", "f:war"),))
    assert same_forms_detection(topic, feature) == 0.5  # a shown context cannot tell the text's topic
    assert same_forms_detection(cue, FeatureExamples(0, with_if, with_if, other, ())) is None


def test_a_finding_whose_words_stand_in_a_topic_s_texts_joins_that_topic_for_its_winner_only():
    from bbox_sae.features.candidates import Tested
    from bbox_sae.features.tested_findings import joined_with_topics

    war = [" war", ".", " arms", " and", " sword", ",", " thou", " sword", " field", "."]
    peace = [" peace", ".", " bread", " and", " field", ",", " bread", " arms", " wine", "."]
    docs = [war, peace, peace, war[:1] + peace[1:]]
    # Too few texts to find the corpus's topic words: named here.
    attrs = word_attributes(docs, topics=frozenset({"war", "peace"}))
    train = np.arange(len(attrs.form))

    def unit(rule, sign=1):
        rows = train[rule.mask(attrs, train)]
        return Tested("rule", ("a", "b"), sign, [], rows, rows, rule=rule, members=(rule,))

    topic = Rule("forms", "f:arms|f:field", "cue_text", "f:war")
    units = [
        unit(topic),
        unit(Rule("form", "f:sword")),  # only in the war text: the topic's word
        unit(Rule("form", "f:bread")),  # one of its four words after 'war'
        unit(Rule("form", "f:sword"), sign=-1),  # the other model's
        unit(Rule(None, None, "cue_sentence", "f:thou")),  # says no word: a register, not a topic's word
        unit(Rule("form", "f:.", "form", "f:war")),  # in the war texts by what it says: a phrase of the cue
    ]
    lp = {"a": np.zeros(len(train)), "b": np.zeros(len(train))}
    fcfg = FeaturesConfig()
    assert joined_with_topics([[0], [1], [2], [3], [4], [5]], units, attrs, train, lp, fcfg) == [[0, 1], [2], [3], [4], [5]]
    # 'sword' does not differ outside the war texts (it is not there): said where it joined.
    assert units[1].said_by == (Rule("form", "f:sword", "cue_text", "f:war"),) and units[2].said_by == ()
    # Where 'war' stands before most words, it names no topic and nothing joins.
    assert joined_with_topics([[0], [1]], units, word_attributes([war, war], topics=frozenset({"war"})), np.arange(2 * len(war)), lp, fcfg) == [[0], [1]]


def test_a_form_that_joins_a_topic_keeps_its_words_elsewhere_only_where_they_differ_too():
    from bbox_sae.features.candidates import Tested
    from bbox_sae.features.tested_findings import _in_topic_texts

    network = [" network", ".", " address", " server", "."]
    mail = [" mail", ".", " address", " box", "."]
    attrs = word_attributes([network, network, mail], topics=frozenset({"network", "mail"}))
    rows = np.arange(len(attrs.form))
    address = rows[Rule("form", "f:address").mask(attrs, rows)]
    scope = rows[Rule(left_kind="cue_text", left_value="f:network").mask(attrs, rows)]
    fcfg = FeaturesConfig()
    for mail_differs, kept in ((0.0, address[:2]), (3.0, address)):
        lp_a = np.zeros(len(rows))
        lp_a[address[:2]] = 3.0
        lp_a[address[2]] = mail_differs
        unit = Tested("rule", ("a", "b"), 1, [], address, address, rule=Rule("form", "f:address"))
        _in_topic_texts(unit, ["f:network"], scope, attrs, {"a": lp_a, "b": np.zeros(len(rows))}, fcfg)
        assert unit.train_rows.tolist() == unit.holdout_rows.tolist() == kept.tolist()
        assert unit.said_by == (() if mail_differs else (Rule("form", "f:address", "cue_text", "f:network"),))


def test_a_topic_is_where_its_most_specific_cues_were_named():
    """A topic's set extends to every cue that tells it, generic ones too ('several' stands in
    most texts, the network texts among them): its scope is the cues whose texts are most its
    own words, so a form of those texts joins, and the scope stays off the rest of the corpus."""
    from bbox_sae.features.tested_findings import topic_scope

    network = [" network", ".", " several", " hosts", " server", ",", " address", " server", "."]
    other = [" several", " people", " came", ".", " they", " sang", ",", " danced", "."]
    docs = [network, network, other, other, other, other]
    attrs = word_attributes(docs, topics=frozenset({"network", "several"}))
    train = np.arange(len(attrs.form))
    own = train[Rule("form", "f:server", "cue_text", "f:network").mask(attrs, train)]
    scope, named = topic_scope(["f:several", "f:network"], attrs, train, own)
    assert named == {"f:network"} and np.array_equal(scope, Rule(left_kind="cue_text", left_value="f:network").mask(attrs, train))
    assert scope.mean() < 0.3 and Rule(left_kind="cue_text", left_value="f:several").mask(attrs, train).mean() > 0.7
