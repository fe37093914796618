"""Rules said in words a reader checks: several rules of one place said once ("a word at the start
of a line: 'then', 'or', 'yet', 'whose' and 3 more"), one form after several words said once."""

from __future__ import annotations

from bbox_sae.features.context import CUE_KINDS
from bbox_sae.features.rules import LISTED_FORMS, WORD_KINDS, Rule, _phrase, listed

# Places said several ways by the grammar: a left class or form of layout is that layout.
LAYOUT_LEFTS = {
    ("class", "c:newline"): ("layout", "line_start"),
    ("form", "f:\n"): ("layout", "line_start"),
    ("class", "c:blank"): ("layout", "after_blank"),
    ("form", "f:\n\n"): ("layout", "after_blank"),
}


def canonical_place(rule: Rule) -> tuple[str, str] | None:
    """The rule's left context when it also names the word (a form or class), one way of saying
    each: "right after a line break" (the class, or the form) is the start of a line (the layout)."""
    if not (rule.word_kind and rule.left_kind) or rule.left_kind == "form2":
        return None
    return LAYOUT_LEFTS.get((rule.left_kind, rule.left_value), (rule.left_kind, rule.left_value))


def describe_rules(rules: list[Rule] | tuple[Rule, ...]) -> str:
    """Rules in words, joined by "or"; listed word forms in one left context are said once, in the
    order given ("'lord', 'mother' or 'brother', each right after 'my'"; past `LISTED_FORMS`, "a
    word at the start of a line: 'then', 'or', 'yet', 'whose' and 3 more"), and so are forms in no
    context ("'then' or 'whose'") and one form right after several left forms ("a line break right
    after '?' (question mark) or '!'"). Parts that list forms themselves are kept apart by "; or".
    """
    cue_parts, rules = _several_cues(rules)
    said: list[list[Rule]] = []
    in_place: dict[tuple[str, str] | str, list[Rule]] = {}
    for r in rules:
        if r.word_kind == "form":
            place = canonical_place(r) or (ANYWHERE if not r.left_kind else None)
        else:  # classes in one place are said once too, apart from forms: "a lower-case word or a capitalised word, each seen at most 2 times ..."
            place = ("classes", canonical_place(r)) if r.word_kind == "class" and canonical_place(r) else None
        if place in in_place:
            in_place[place].append(r)
            continue
        said.append([r])
        if place:
            in_place[place] = said[-1]
    parts = cue_parts + [_together(g) for g in _after_left_forms(said)]
    if len(parts) > 1 and any("," in p or ":" in p for p in parts):
        return "; ".join(parts[:-1]) + "; or " + parts[-1]
    return " or ".join(parts)


ANYWHERE = "anywhere"  # the place of forms said with no context


def _several_cues(rules: list[Rule] | tuple[Rule, ...]) -> tuple[list[str], list[Rule]]:
    """One word part after several cues of one scope said once ("a word with 'thou', 'thy' or
    'thee' earlier in its sentence": a register told by its forms), and the rules left to say."""
    by_part: dict[tuple, list[Rule]] = {}
    for r in rules:
        if r.left_kind in CUE_KINDS:
            # A topic's form sets, one per cue, are said as one set after any of its cues.
            sets = r.word_kind and WORD_KINDS[r.word_kind].united is not None
            by_part.setdefault((r.left_kind, r.word_kind, None if sets else r.word_value), []).append(r)
    parts, grouped = [], set()
    for (kind, word_kind, word_value), group in by_part.items():
        if len(group) < 2:
            continue
        if word_value is None and word_kind:
            kind_of_word = WORD_KINDS[word_kind]
            word_value = kind_of_word.united(list({f for r in group for f in kind_of_word.parts(r.word_value)}))
        subject = _phrase(word_kind, word_value) if word_kind else "a word"
        cues = listed([_phrase("form", c) for c in dict.fromkeys(r.left_value for r in group)], "a word")
        parts.append(f"{subject} with {cues} {CUE_KINDS[kind].phrase}")
        grouped.update(group)
    return parts, [r for r in rules if r not in grouped]


def _together(group: list[Rule]) -> str:
    if len(group) == 1:
        return group[0].describe()
    words = [_phrase(r.word_kind, r.word_value) for r in group]
    if not group[0].left_kind:
        return listed(words, "a word")
    if _one_form_after_forms(group):
        lefts = [_phrase("form", r.left_value) for r in group]
        return f"{_phrase('form', group[0].word_value)} right after {listed(lefts, 'a word')}"
    if len({r.word_value for r in group}) == 1 and len({canonical_place(r) for r in group}) == len(group):  # one form, several contexts
        contexts = [Rule(None, None, r.left_kind, r.left_value).describe().removeprefix("a word ") for r in group]
        return f"{_phrase('form', group[0].word_value)} {' or '.join(contexts)}"
    place = Rule(None, None, *canonical_place(group[0])).describe()
    if len(words) > LISTED_FORMS + 1:
        return f"{place}: {', '.join(words[:LISTED_FORMS])} and {len(words) - LISTED_FORMS} more"
    return f"{', '.join(words[:-1])} or {words[-1]}, each {place.removeprefix('a word ')}"


def _one_form_after_forms(group: list[Rule]) -> bool:
    return len({r.word_value for r in group}) == 1 and all(r.left_kind == "form" for r in group) and len({r.left_value for r in group}) == len(group)


def _after_left_forms(said: list[list[Rule]]) -> list[list[Rule]]:
    """Lone rules of a form in a context that share their word form said as one ("'.]' right after
    'exeunt' or among the first 5 words of the text"): the first one's group takes the others, in
    the order given."""
    out: list[list[Rule]] = []
    by_word: dict[str, list[Rule]] = {}
    for group in said:
        r = group[0]
        if len(group) == 1 and r.word_kind == "form" and r.left_kind:
            if r.word_value in by_word:
                by_word[r.word_value].append(r)
                continue
            by_word[r.word_value] = group
        out.append(group)
    return out
