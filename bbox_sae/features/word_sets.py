"""A group of words the SAE isolated, said in words without pretending to be a rule.

A latent-defined finding is a set of words chosen by the SAE (`latent_sets.py`), not by a rule
of the grammar in `bbox_sae.features.rules`. Offline it is said by what its train words share: the word
forms it is made of (all of them are kept, so a reader can check any word against the list),
a suffix nearly all of them end in ("-ed"), and a left context nearly all of them follow ("right
after an auxiliary verb"). The same statement is its own judge: a word fits when its form is
listed (or ends in the suffix) and the left context holds, so its held-out detection measures
how well the words in the statement predict the words the SAE chose.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np

from bbox_sae.features import context
from bbox_sae.features.rules import Rule, WordAttributes, _phrase, shown_word_attributes

SUFFIX_SHARE = 0.9  # share of the set's train words a suffix must end
# A latent's group whose forms mostly end alike is two sets: the words of that ending, said by the
# ending (every form, seen on train or not), and the rest. On planted Shakespeare the '-ly' words
# came back as one group with 'thine' and 'liege': a list of its 52 most frequent forms found a
# quarter of the held-out '-ly' words, of ~380 forms most of which occur once.
SUFFIX_MAJORITY = 0.5
SUFFIX_MIN_FORMS = 5  # a suffix of fewer distinct forms says no more than the list
LEFT_SHARE = 0.8  # share of the set's train words a left context must hold for
SHOWN_FORMS = 3


@dataclass(frozen=True)
class WordSet:
    """What a set's train words share: their forms (most frequent first), and optionally a suffix
    and a left-context condition (a `Rule` with only a left part)."""

    forms: tuple[str, ...]
    counts: tuple[int, ...]
    suffix: str | None = None
    left: Rule | None = None
    # Forms of the suffix the set is not: seen on train, and the proposing model does not win on
    # most of them ('only' among the '-ly' words).
    excluded: tuple[str, ...] = ()
    # Said, not a condition: where most of the words are when not all of them are (a finding's
    # speakers' names, most of them after a blank line, a few named in the text).
    usual_left: Rule | None = None
    usual_share: float | None = None
    # The left forms that carry a difference when `left` (a class) said more than differs
    # (`findings.narrower_left_forms`): "right after 'is', 'was' or 'be'", not "after an auxiliary verb".
    left_forms: tuple[str, ...] = ()

    def describe(self) -> str:
        shown = ", ".join(_phrase("form", "f:" + f) for f in self.forms[:SHOWN_FORMS])
        if self.suffix:
            subject = f"a word ending in '-{self.suffix}' ({len(self.forms)} forms, most often {shown})"
            if self.excluded:
                more = len(self.excluded) - SHOWN_FORMS
                subject += " except " + ", ".join(_phrase("form", "f:" + f) for f in self.excluded[:SHOWN_FORMS]) + (f" and {more} more" if more > 0 else "")
        elif len(self.forms) == 1:
            subject = shown
        else:
            subject = f"a group of {len(self.forms)} word forms, most often {shown}"
        if self.left_forms:
            lefts = [_phrase("form", f) for f in self.left_forms]
            subject += " right after " + (", ".join(lefts[:-1]) + " or " + lefts[-1] if len(lefts) > 1 else lefts[0])
        elif self.left is not None:
            subject += Rule(None, None, self.left.left_kind, self.left.left_value).describe().removeprefix("a word")
        if self.usual_left is not None:
            where = Rule(None, None, self.usual_left.left_kind, self.usual_left.left_value).describe().removeprefix("a word ")
            subject += f" ({self.usual_share:.0%} of them {where})"
        return subject

    def mask(self, attrs: WordAttributes, rows: np.ndarray) -> np.ndarray:
        """Where the statement holds among `rows` of `attrs` (the offline judge, on rows)."""
        listed, excluded = frozenset(self.forms), frozenset(self.excluded)
        vocab_form = np.array([v.startswith("f:") and self._form_fits(v[2:], listed, excluded) for v in attrs.vocab], dtype=bool)
        fits = vocab_form[attrs.form[rows]]
        if self.left_forms:
            fits &= np.isin(attrs.left_form[rows], [attrs.code.get(f, -1) for f in self.left_forms])
        elif self.left is not None:
            fits &= self.left.mask(attrs, rows)
        return fits

    def matches(self, left_words: list[str], word: str) -> bool:
        """Whether the statement holds for a word shown with the words to its left."""
        attrs = shown_word_attributes(left_words, word)
        return bool(self.mask(attrs, np.array([len(attrs.form) - 1]))[0])

    def _form_fits(self, form: str, listed: frozenset[str], excluded: frozenset[str]) -> bool:
        return form in listed or bool(self.suffix and has_suffix(form, self.suffix) and form not in excluded)

    def to_json(self) -> str:
        left = self.left.as_dict() if self.left else None
        usual = self.usual_left.as_dict() if self.usual_left else None
        return json.dumps(
            {
                "forms": list(self.forms),
                "counts": list(self.counts),
                "suffix": self.suffix,
                "left": left,
                "excluded": list(self.excluded),
                "usual_left": usual,
                "usual_share": self.usual_share,
                "left_forms": list(self.left_forms),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> WordSet:
        raw = json.loads(text)
        left = Rule(**raw["left"]) if raw.get("left") else None
        usual = Rule(**raw["usual_left"]) if raw.get("usual_left") else None
        return cls(
            tuple(raw["forms"]), tuple(raw["counts"]), raw.get("suffix"), left, tuple(raw.get("excluded", ())), usual, raw.get("usual_share"),
            tuple(raw.get("left_forms", ())),
        )  # fmt: skip


def has_suffix(form: str, suffix: str) -> bool:
    """Whether `form` ends in `suffix` after a stem of at least two letters ('only' ends in '-ly', 'fly' does not)."""
    return form.endswith(suffix) and len(form) > len(suffix) + 1


def _shared_suffix(forms: Counter, share: float = SUFFIX_SHARE) -> str | None:
    """The longest suffix (2 to 4 letters) that at least `share` of the words end in, spread over
    at least `SUFFIX_MIN_FORMS` forms."""
    total = sum(forms.values())
    for length in (4, 3, 2):
        ends = Counter()
        spread = Counter()
        for form, count in forms.items():
            if len(form) > length + 1 and form[-length:].isalpha():
                ends[form[-length:]] += count
                spread[form[-length:]] += 1
        for suffix, count in ends.most_common(1):
            if count >= share * total and spread[suffix] >= SUFFIX_MIN_FORMS:
                return suffix
    return None


def suffix_parts(attrs: WordAttributes, rows: np.ndarray) -> list[tuple[np.ndarray, str | None]]:
    """`rows` split into the words of the suffix most of their distinct forms end in
    (`SUFFIX_MAJORITY`) and the rest; all of `rows` with no suffix when there is none. Counted by
    form, not by word: a class of a few frequent forms can share an ending by chance ('father',
    'brother', 'mother' are most of the kin words after 'my', yet 6 of its 14 forms), and a
    morphological class is many forms however frequent one other form in its group is ('package'
    among 400 forms in '-ed' after 'is')."""
    forms = [attrs.vocab[c][2:] for c in attrs.form[rows].tolist()]
    suffix = _shared_suffix(Counter(set(forms)), SUFFIX_MAJORITY)
    if suffix is None:
        return [(rows, None)]
    ends = np.array([has_suffix(f, suffix) for f in forms], dtype=bool)
    return [(rows[ends], suffix), (rows[~ends], None)]


def suffix_word_set(attrs: WordAttributes, rows: np.ndarray, suffix: str, total: np.ndarray, wins: np.ndarray, carries: float) -> WordSet:
    """The set of every word ending in `suffix` but the forms seen on train (twice or more, where
    `total` and `wins` count a form's train occurrences and the proposing model's wins) on which the
    model wins less than `carries` of the time; `rows` (its train words) give the forms shown."""
    seen = {i: v[2:] for i, v in enumerate(attrs.vocab) if v.startswith("f:") and has_suffix(v[2:], suffix) and total[i] >= 2}
    excluded_ids = sorted((i for i in seen if wins[i] < carries * total[i]), key=lambda i: (-total[i], seen[i]))
    excluded = tuple(seen[i] for i in excluded_ids)
    not_shown = frozenset(excluded)
    counts = Counter(f for f in (attrs.vocab[c][2:] for c in attrs.form[rows].tolist()) if f not in not_shown)
    ranked = sorted(counts.items(), key=lambda fc: (-fc[1], fc[0]))
    return WordSet(forms=tuple(f for f, _ in ranked), counts=tuple(c for _, c in ranked), suffix=suffix, left=shared_left(attrs, rows), excluded=excluded)


def shared_left(attrs: WordAttributes, rows: np.ndarray, share: float = LEFT_SHARE) -> Rule | None:
    """The left context at least `share` of the words follow, a word form before a class (more telling)."""
    n = len(rows)
    for kind, col in (("form", attrs.left_form), ("form2", attrs.left2_form), ("class", attrs.left_cls)):
        value, count = Counter(col[rows].tolist()).most_common(1)[0]
        if count >= share * n:
            return Rule(None, None, kind, attrs.vocab[value])
    for layout, col in (("after_blank", attrs.after_blank), ("line_start", attrs.line_start)):
        if col[rows].sum() >= share * n:
            return Rule(None, None, "layout", layout)
    # Not `rare`: it is the forms' own count, which the listed forms (or the ending) already say.
    for flag in (f for f in context.ALONE if f != "rare"):
        if attrs.context[rows, context.FLAGS.index(flag)].sum() >= share * n:
            return Rule(None, None, "context", flag)
    return None


def describe_word_set(attrs: WordAttributes, rows: np.ndarray) -> WordSet:
    """What the words at `rows` (train rows of a set, non-empty) share."""
    forms = Counter(attrs.vocab[c][2:] for c in attrs.form[rows].tolist())
    ranked = sorted(forms.items(), key=lambda fc: (-fc[1], fc[0]))
    return WordSet(forms=tuple(f for f, _ in ranked), counts=tuple(c for _, c in ranked), suffix=_shared_suffix(forms), left=shared_left(attrs, rows))


USUAL_SHARE = 0.5  # a left context said of "most of them" holds for at least this share of the words


def describe_words_covered(attrs: WordAttributes, rows: np.ndarray) -> WordSet:
    """What every word at `rows` (a finding's words, train and held out) is: each form listed, and
    a left context as a condition only when every word follows it, else said as where most of them
    are ("a group of 9 word forms, most often 'shallow', 'charmian', 'gloster' (75% of them after a
    blank line)"). Which words a finding covers is known before any held-out Δ is read, so saying
    them reads nothing the test decides on."""
    described = describe_word_set(attrs, rows)
    left = shared_left(attrs, rows, share=1.0)
    usual = None if left is not None else shared_left(attrs, rows, share=USUAL_SHARE)
    usual_share = float(usual.mask(attrs, rows).mean()) if usual is not None else None
    return WordSet(described.forms, described.counts, described.suffix, left, described.excluded, usual, usual_share)
