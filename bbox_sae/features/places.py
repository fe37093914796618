"""Where a unit of kept rules says its words are (its place), and which latents carry it.

Rules of one place and one winner that a latent carries together are one finding a person would
name ("a word at the start of a line: 'then', 'or', 'yet' and 4 more", Gemma better), not seven
findings of one form each (`tested_findings.finding_groups`). The place must be the same one: a
line start and a blank line are different places though every word after a blank line also
starts a line, so a unit takes its most specific place, and "right after a line break" (the
class) is the line start (the layout) said another way.
"""

from __future__ import annotations

import numpy as np

from bbox_sae.features import context
from bbox_sae.features.activations import TopActivations, top_words
from bbox_sae.features.candidates import Tested
from bbox_sae.features.findings import memberships
from bbox_sae.features.rule_statements import canonical_place
from bbox_sae.features.rules import Rule, WordAttributes

# More specific first: a left word, a cue word before (in any scope), a left class, a context attribute of the word (a rare form, a
# repeat, inside brackets or quotes, the kind of sentence), the text's opening words, a blank line,
# a line start.
SPECIFICITY = {"form": 0, "cue": 1, "cue_sentence": 1, "cue_text": 1, "class": 2, "context": 3, "doc_opening": 4, "after_blank": 5, "line_start": 6}
# Every context attribute is a place that joins the units of one winner alone, as a layout does.
# A planted long-range repeat came back as 45 findings, "'there' repeated from more than 30 words
# back", "'which' ...", each a form the repeat happened to hold; the opening of a text is a layout of
# the document, as a blank line is ('[' at the start and '.]' among the first words: a passage that
# opens on a stage direction); a rare form is a place in the vocabulary (planted rare words came
# back as three findings, lower-case, capitalised and all-capitals). Only a unit whose own rules name
# the attribute has it as its place (`unit_place`), so a form that differs everywhere joins no one
# by it. Not a complement ("in a sentence that did not begin with a wh-word"): it holds for nearly
# every word and would join unrelated forms.
OPENING = ("context", "doc_opening")
RARE = ("context", "rare")
JOINING_CONTEXTS = tuple(("context", flag) for flag in context.FLAGS if flag not in context.COMPLEMENTS)
# "Right after the start of the text" is the text's opening, for grouping (not for saying it).
OPENING_LEFTS = {("class", "c:start"), ("form", "f:")}


def _specificity(place: tuple[str, str]) -> int:
    if place[0] in ("layout", "context"):
        return SPECIFICITY.get(place[1], SPECIFICITY["context"])
    return SPECIFICITY[place[0]]


# "Right after a lower-case word" is no place: it is the class of every word that is no function
# word, punctuation, number, capitalised word or layout, so it names nothing about the context.
# Through it a latent firing on '?' and '!' joined two planted differences ('?' everywhere, 67% of
# them after one; '!' closing a sentence that did not begin with a wh-word, 82%) into one finding.
NO_PLACE = ("class", "c:word")


def unit_place(unit: Tested, attrs: WordAttributes, share: float = 0.5) -> tuple[str, str] | None:
    """The most specific place that holds for at least `share` of the unit's held-out words, among
    its rules' places, a latent's group's left context and the two layouts: 'gloster' (any), most
    of whose words open a speech, is after a blank line, beside the other speakers' names."""
    candidates = {canonical_place(rule) for rule in unit.members or ((unit.rule,) if unit.rule is not None else ())}
    if unit.word_set is not None and unit.word_set.left is not None:
        candidates.add(canonical_place(Rule("form", "f:", unit.word_set.left.left_kind, unit.word_set.left.left_value)))
    candidates = {OPENING if p in OPENING_LEFTS else p for p in candidates} | {("layout", "line_start"), ("layout", "after_blank"), OPENING}
    if not len(unit.holdout_rows):
        return None
    named = [p for p in candidates if p not in (None, NO_PLACE) and (p[0] != "context" or p in JOINING_CONTEXTS)]
    places = [p for p in named if Rule(None, None, *p).mask(attrs, unit.holdout_rows).mean() >= share]
    return min(places, key=lambda p: (_specificity(p), p)) if places else None


def carrying_latents(units: list[Tested], top: TopActivations, latents: list[int], min_share: float, min_words: int = 2) -> list[list[int]]:
    """Per unit, the latents that carry it: at least `min_share` of a latent's train top words
    (and `min_words`) are the unit's train words. Proposed or not: the rule search proposes without
    latents, and latents still say which of its rules belong together. Looked up by row, so the
    cost grows with the top words and the units' words, not with their product."""
    rows, owner = memberships([u.train_rows for u in units])
    out: list[list[int]] = [[] for _ in units]
    for latent in latents:
        tops = np.unique(top_words(top, "train", latent))
        if not len(tops):
            continue
        start, end = np.searchsorted(rows, tops, side="left"), np.searchsorted(rows, tops, side="right")
        hits = np.concatenate([owner[s:e] for s, e in zip(start, end)]) if len(rows) else np.zeros(0, dtype=np.int64)
        counts = np.bincount(hits, minlength=len(units))
        for u in np.flatnonzero(counts >= max(min_words, min_share * len(tops))):
            out[u].append(latent)
    return out
