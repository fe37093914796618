"""Rules of one place and one winner that a latent carries together are one finding (`features.places`,
`tested_findings.finding_groups`); a line start and a blank line are different places."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from bbox_sae.features import candidates
from bbox_sae.features.places import unit_place
from bbox_sae.features.rule_statements import canonical_place, describe_rules
from bbox_sae.features.rules import Rule, word_attributes
from bbox_sae.features.tested_findings import finding_groups


def _unit(rule, start, carriers=(), sign=-1, members=(), place=None, token_kind="word"):
    rows = np.arange(start, start + 10)
    return candidates.Tested(
        "rule",
        ("a", "b"),
        sign,
        [],
        rows,
        rows,
        rule=rule,
        searched=True,
        members=members or (rule,),
        carriers=list(carriers),
        place=place,
        token_kind=token_kind,
    )


def test_a_class_of_layout_is_that_layout_and_a_word_alone_has_no_place():
    assert canonical_place(Rule("form", "f:then", "class", "c:newline")) == ("layout", "line_start")
    assert canonical_place(Rule("form", "f:oliver", "class", "c:blank")) == ("layout", "after_blank")
    assert canonical_place(Rule("form", "f:or", "form", "f:\n")) == ("layout", "line_start")
    assert canonical_place(Rule("form", "f:lord", "form", "f:my")) == ("form", "f:my")
    assert canonical_place(Rule("form", "f:then")) is None
    assert canonical_place(Rule(None, None, "layout", "line_start")) is None


def test_a_unit_takes_the_most_specific_place_holding_for_half_its_words():
    docs = [["Act", " one", ",", " scene", " two", ",", " here", "\n\n", "OLIVER", ".", "\n", "Then", " oliver", " went", "\n\n", "OLIVER", "."]]
    attrs = word_attributes(docs)
    oliver = np.flatnonzero(attrs.form == attrs.code["f:oliver"])
    members = (Rule("form", "f:oliver"), Rule("form", "f:oliver", "layout", "line_start"), Rule("form", "f:oliver", "layout", "after_blank"))
    unit = candidates.Tested("rule", ("a", "b"), -1, [], oliver, oliver, rule=members[0], members=members)
    assert unit_place(unit, attrs) == ("layout", "after_blank")  # 2 of 3 after a blank line; every one of them also starts a line
    assert unit_place(unit, attrs, share=0.9) is None


def test_a_layout_or_a_left_word_joins_rules_of_one_winner_and_a_left_class_only_through_a_latent_carrying_both():
    line, blank, after_aux = ("layout", "line_start"), ("layout", "after_blank"), ("class", "c:auxiliary")
    units = [
        _unit(Rule("form", "f:then", "layout", "line_start"), 0, carriers=[7], place=line),
        _unit(Rule("form", "f:or", "layout", "line_start"), 10, carriers=[9], place=line),  # a line start: no latent needed
        _unit(Rule("form", "f:oliver", "layout", "after_blank"), 20, carriers=[7], place=blank),  # another place
        _unit(Rule("form", "f:nor", "layout", "line_start"), 30, carriers=[7], sign=1, place=line),  # another winner
        _unit(Rule("form", "f:not", "class", "c:auxiliary"), 40, carriers=[5], place=after_aux),
        _unit(Rule("form", "f:be", "class", "c:auxiliary"), 50, carriers=[6, 5], place=after_aux),  # latent 5 carries both
        _unit(Rule("form", "f:go", "class", "c:auxiliary"), 60, carriers=[8], place=after_aux),  # no latent in common
        _unit(Rule("form", "f:lord", "form", "f:my"), 70, carriers=[1], place=("form", "f:my")),
        _unit(Rule("form", "f:mother", "form", "f:my"), 80, place=("form", "f:my")),  # one named word before: no latent needed
        _unit(Rule("form", "f:?", "form", "f:my"), 90, place=("form", "f:my"), token_kind="punctuation"),  # another kind of token
    ]
    assert finding_groups(units, 0.5) == [[0, 1], [2], [3], [4, 5], [6], [7, 8], [9]]


def test_one_form_after_several_left_words_of_one_winner_is_one_finding_said_once():
    """The demo's line breaks after '?', after '!' and after '.--' (SmolLM2 better) were three
    findings of one kind: the line a speech's sentence ends."""
    after = {w: ("form", f"f:{w}") for w in ("?", "!", ".--", "well")}
    units = [
        _unit(Rule("form", "f:\n", "form", "f:?"), 0, sign=1, place=after["?"], token_kind="layout"),
        _unit(Rule("form", "f:\n", "form", "f:!"), 10, sign=1, place=after["!"], token_kind="layout"),
        _unit(Rule("form", "f:\n", "form", "f:.--"), 20, sign=1, place=after[".--"], token_kind="layout"),
        _unit(Rule("form", "f:\n", "form", "f:well"), 30, sign=-1, place=after["well"], token_kind="layout"),  # the other winner
        _unit(Rule("form", "f:,", "form", "f:well"), 40, sign=1, place=after["well"], token_kind="punctuation"),  # another form
    ]
    assert finding_groups(units, 0.5) == [[0, 1, 2], [3], [4]]
    rules = [u.rule for u in units[:3]]
    assert describe_rules(rules) == "a line break right after '?' (question mark), '!' (exclamation mark) or '.--'"
    many = [Rule("form", "f:,", "form", f"f:{w}") for w in ("come", "marry", "well", "nay", "why", "alas")]
    assert describe_rules(many) == "',' (comma) right after one of 6 words: 'come', 'marry', 'well', 'nay' and 2 more"
    # One form in one place twice (a line break as class and as form) is still said by its place.
    assert describe_rules([Rule("form", "f:then", "class", "c:newline"), Rule("form", "f:then", "form", "f:\n")]).startswith("'then' or 'then'")


def test_a_word_most_of_whose_words_open_a_speech_is_in_that_place_whatever_its_rules_say():
    """'leontes' (a rule of the word alone) opens a speech in most of its held-out words: it joins
    the other speakers' names after a blank line, not a finding of its own."""
    attrs = word_attributes(
        [["Act", " one", ",", " scene", " two", "\n\n", "LEONTES", ".", "\n", "Sir", " leontes", "\n\n", "LEONTES", ".", "\n\n", "LEONTES"]]
    )
    leontes = np.flatnonzero(attrs.form == attrs.code["f:leontes"])
    unit = candidates.Tested("rule", ("a", "b"), -1, [], leontes, leontes, rule=Rule("form", "f:leontes"), members=(Rule("form", "f:leontes"),))
    assert unit_place(unit, attrs) == ("layout", "after_blank")  # 3 of 4


def test_many_forms_of_one_place_are_said_once_most_frequent_first():
    forms = ["then", "or", "yet", "whose", "thy", "was", "nor"]
    rules = [Rule("form", f"f:{f}", "layout", "line_start") for f in forms]
    assert describe_rules(rules) == "a word at the start of a line: 'then', 'or', 'yet', 'whose' and 3 more"
    assert describe_rules(rules[:2]) == "'then' or 'or', each at the start of a line"
    assert describe_rules([*rules[:2], Rule("form", "f:enter")]) == "'then' or 'or', each at the start of a line; or 'enter'"


def test_a_latent_carries_a_unit_when_enough_of_its_top_words_are_the_units():
    from bbox_sae.features.activations import TopActivations
    from bbox_sae.features.places import carrying_latents

    # Latent 0's 10 train top words: 6 in unit 0, 4 in unit 1; latent 1's: 1 in unit 0.
    top_rows = np.array([[0, 1, 2, 3, 4, 5, 20, 21, 22, 23], [0, 50, 51, 52, 53, 54, 55, 56, 57, 58]])
    # Equal activations: the percentile rule keeps every top word.
    top = TopActivations(
        values={"train": np.ones((2, 10)), "holdout": np.zeros((2, 0))},
        rows={"train": top_rows, "holdout": np.zeros((2, 0), dtype=np.int64)},
        fire_counts=np.full(2, 10),
        n_rows=60,
    )
    units = [_unit(Rule("form", "f:a"), 0), _unit(Rule("form", "f:b"), 20)]
    assert carrying_latents(units, top, [0, 1], min_share=0.3) == [[0], [0]]
    assert carrying_latents(units, top, [0, 1], min_share=0.5) == [[0], []]


def test_a_finding_said_by_its_ending_keeps_the_exclusions_it_was_tested_with():
    """Issue 41 item 13: re-described from its train words, an '-ly' set lost its exclusions and
    its statement took in 'only', which the tested set left out."""
    from bbox_sae.features.tested_findings import statement_word_set
    from bbox_sae.features.word_sets import WordSet

    docs = [[w for _ in range(3) for w in ("truly", " freely", " only", " gladly", " said")]]
    attrs = word_attributes(docs)
    ly = np.flatnonzero(np.isin(np.array([attrs.vocab[c] for c in attrs.form]), ["f:truly", "f:freely", "f:gladly"]))
    tested = WordSet(("truly", "freely"), (3, 3), suffix="ly", excluded=("only",))
    unit = candidates.Tested("latent", ("a", "b"), 1, [4], ly, ly, word_set=tested)
    said = statement_word_set([unit], attrs, ly, ly)
    assert said == tested and "except 'only'" in said.describe()
    only = np.flatnonzero(attrs.form == attrs.code["f:only"])
    assert not said.mask(attrs, only).any() and said.mask(attrs, ly).all()


def test_a_latent_group_of_a_punctuation_mark_and_words_that_rules_hold_is_no_finding_of_its_own():
    from bbox_sae.features.tested_findings import mixes_kinds

    attrs = word_attributes([["thou", " art", "?", " thy", " heart", "?", " thee", "!"]])
    rows = np.arange(len(attrs.form))
    assert mixes_kinds(attrs, rows)  # 3 of 8 punctuation, 5 words
    assert not mixes_kinds(attrs, rows[[0, 1, 3, 4, 6]])
    assert not mixes_kinds(attrs, rows[[0, 1, 2, 3, 4, 6]], share=0.2)  # 1 mark of 6: under a fifth


def test_a_statement_of_several_parts_says_each_part_once_and_keeps_the_parts_apart():
    """Forms with no context are one part, forms of one place another, and parts that list forms
    are kept apart by "; or" (the demo's line-opening words beside 'then' anywhere and 'i' among
    the text's first words read as one run-on list before)."""
    line_start = [Rule("form", f"f:{f}", "layout", "line_start") for f in ("or", "was", "yet", "against", "than")]
    rules = [Rule("form", "f:then"), *line_start, Rule("form", "f:whose"), Rule("form", "f:i", "context", "doc_opening")]
    assert describe_rules(rules) == (
        "'then' or 'whose'; 'or', 'was', 'yet', 'against' or 'than', each at the start of a line; or 'i' among the first 5 words of the text"
    )
    assert describe_rules([Rule("form", "f:thou"), Rule("form", "f:thy")]) == "'thou' or 'thy'"


def test_one_form_in_several_contexts_of_one_winner_is_one_finding_said_once():
    """'.]' right after 'exeunt' and '.]' among the text's first words, both Gemma's (the demo):
    one mark, one winner, one finding, the form said once."""
    opening = ("context", "doc_opening")
    units = [
        _unit(Rule("form", "f:.]", "form", "f:exeunt"), 0, place=("form", "f:exeunt"), token_kind="punctuation"),
        _unit(Rule("form", "f:.]", "context", "doc_opening"), 10, place=opening, token_kind="punctuation"),
        _unit(Rule("form", "f:[", "class", "c:start"), 20, place=opening, token_kind="punctuation"),  # the text's opening: a place
        _unit(Rule("form", "f:.]", "form", "f:enter"), 30, sign=1, place=("form", "f:enter"), token_kind="punctuation"),  # the other winner
    ]
    assert finding_groups(units, 0.5) == [[0, 1, 2], [3]]
    assert describe_rules([u.rule for u in units[:2]]) == "'.]' right after 'exeunt' or among the first 5 words of the text"
    # A word form's contexts are places that join on their own or stay apart on purpose.
    used = [
        _unit(Rule("form", "f:used", "form", "f:is"), 0, place=("form", "f:is")),
        _unit(Rule("form", "f:used", "layout", "line_start"), 10, place=("layout", "line_start")),
    ]
    assert finding_groups(used, 0.5) == [[0], [1]]


def test_the_opening_words_of_a_text_are_a_place():
    attrs = word_attributes([["[", "Enter", " X", ".]", "\n", "Y", ".]"], ["[", "Exit", ".]"]])
    brackets = np.flatnonzero(attrs.form == attrs.code["f:["])
    unit = candidates.Tested(
        "rule", ("a", "b"), -1, [], brackets, brackets, rule=Rule("form", "f:[", "class", "c:start"), members=(Rule("form", "f:[", "class", "c:start"),)
    )
    assert unit_place(unit, attrs) == ("context", "doc_opening")


def test_right_after_a_lower_case_word_is_no_place():
    """'?' after a lower-case word: that class names nothing about the context, so it is no place
    that joins '?' to '!' (planted Shakespeare with context rules)."""
    attrs = word_attributes([["who", " goes", " there", " now", "?", " stand", " here", " and", " speak", " now", "?", "\n\n", "Nay", " go", " now", "?"]])
    marks = np.flatnonzero(attrs.form == attrs.code["f:?"])
    members = (Rule("form", "f:?", "class", "c:word"),)
    unit = candidates.Tested("rule", ("a", "b"), 1, [], marks, marks, rule=members[0], members=members)
    assert unit_place(unit, attrs) is None  # every '?' after a lower-case word, as 9 of the 16 words are
    names = np.flatnonzero(attrs.form == attrs.code["f:nay"])
    assert unit_place(candidates.Tested("rule", ("a", "b"), 1, [], names, names, rule=Rule("form", "f:nay")), attrs) == ("layout", "after_blank")


def _set_unit(rows, sign=1):
    rows = np.asarray(rows, dtype=np.int64)
    return candidates.Tested("latent", ("a", "b"), sign, [], rows, rows)


def test_a_member_lying_inside_a_finding_brings_its_other_words_only_when_they_differ_too():
    """Planted Handbook passives: "a lower-case word right after 'be'" lies mostly inside "a word
    ending in '-ed' right after an auxiliary verb"; its other words ("be able") differ in nothing
    and stay out, where joining them made 31% of the finding's words not passives."""
    from bbox_sae.features.tested_findings import finding_rows

    lp_b = np.zeros(200)
    lp_a = np.zeros(200)
    lp_a[:100] = 2.0  # the class: model a wins
    lp_a[150:170] = 2.0  # another part that differs too
    passives, after_be = _set_unit(np.arange(0, 100)), _set_unit(np.arange(60, 140))  # 40 of 80 inside, its other 40 differ in nothing
    rows = finding_rows([after_be, passives], {"a": lp_a, "b": lp_b}, containment=0.5)
    assert rows["holdout"].tolist() == list(range(100)) and rows["whole"] == [1]
    differing = _set_unit(np.r_[np.arange(80, 100), np.arange(150, 170)])  # half inside, the other half differs
    rows = finding_rows([passives, differing], {"a": lp_a, "b": lp_b}, containment=0.5)
    assert rows["holdout"].tolist() == [*range(100), *range(150, 170)] and rows["whole"] == [0, 1]
    apart = _set_unit(np.arange(100, 140))  # not inside: another part of the finding (a place join), all its words
    assert finding_rows([passives, apart], {"a": lp_a, "b": lp_b}, containment=0.5)["whole"] == [0, 1]


@given(
    st.lists(st.tuples(st.integers(0, 150), st.integers(1, 60)), min_size=1, max_size=6),
    st.lists(st.floats(-3, 3, allow_nan=False), min_size=220, max_size=220),
)
def test_a_findings_words_hold_every_whole_member_and_half_of_every_other(spans, deltas):
    from bbox_sae.features.findings import shared_count
    from bbox_sae.features.tested_findings import finding_rows

    members = [_set_unit(np.arange(s, s + n)) for s, n in spans]
    lp = {"a": np.asarray(deltas), "b": np.zeros(len(deltas))}
    rows = finding_rows(members, lp, containment=0.5)
    union = np.unique(np.concatenate([m.holdout_rows for m in members]))
    assert set(rows["holdout"].tolist()) <= set(union.tolist()) and rows["whole"]
    for i, m in enumerate(members):
        held = shared_count(m.holdout_rows, rows["holdout"])
        assert held == len(m.holdout_rows) if i in rows["whole"] else held >= 0.5 * len(m.holdout_rows)


def test_rare_words_of_every_class_and_one_winner_are_one_finding_said_once():
    """Planted rare words came back as three findings: lower-case, capitalised, all-capitals."""
    rare = ("context", "rare")
    units = [
        _unit(Rule("class", "c:word", "context", "rare"), 0, place=rare),
        _unit(Rule("class", "c:capitalised", "context", "rare"), 10, place=rare),  # no latent in common: a rare form is a place
        _unit(Rule("class", "c:allcaps", "context", "rare"), 20, sign=1, place=rare),  # the other winner
    ]
    assert finding_groups(units, 0.5) == [[0, 1], [2]]
    assert describe_rules([u.rule for u in units]) == ("a lower-case word, a capitalised word or an all-capitals word, each seen at most 2 times in the corpus")


def test_a_word_part_after_several_cues_of_one_scope_is_one_finding():
    """A register told by several of its forms (any word with 'thou', with 'thy' earlier in its
    sentence: no word part), a topic told by several of its words (a set of forms after 'war', one
    of them after 'battle'), a form after several cue words: each one finding per winner."""
    units = [
        _unit(Rule(None, None, "cue_sentence", "f:thou"), 0, place=("cue_sentence", "f:thou")),
        _unit(Rule(None, None, "cue_sentence", "f:thy"), 10, place=("cue_sentence", "f:thy")),
        _unit(Rule("forms", "f:arms|f:field", "cue_text", "f:war"), 20, sign=1),
        _unit(Rule("form", "f:arms", "cue_text", "f:battle"), 30, sign=1),
        _unit(Rule("form", "f:were", "cue", "f:if"), 40, sign=1),
        _unit(Rule("form", "f:were", "cue", "f:an"), 50, sign=1),
        _unit(Rule("form", "f:were", "cue", "f:if"), 60),  # the other winner
    ]
    assert finding_groups(units, 0.5) == [[0, 1], [2, 3], [4, 5], [6]]
