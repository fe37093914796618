"""The offline labeler: a deterministic rule read off a feature's train contexts, said in words,
and used as its own judge on the validation contexts.

A latent with context rules (those of its findings) is described by them, plus the rules of what
it also fires on outside them (a latent is often broader than the difference it carries: 'st' and
place names; `broader.py`); otherwise by its dominant word forms, a shared neighbouring n-gram or
the class of the neighbouring word.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bbox_sae.corpus.words import split_words
from bbox_sae.features.rule_statements import describe_rules
from bbox_sae.features.rules import Rule, normalize_form, shown_word_attributes
from bbox_sae.labeling.records import Context, FeatureExamples, LabelResult, validation_set
from bbox_sae.labeling.scoring import detection_scores, fuzz_set

# The version of this labeler, part of the label stage's key: bump it when what it writes changes for
# the same settings. 5: latents of latent findings are said by their word sets; findings' statements are scored.
# 6: a kept offline statement is also scored against the finding's own forms elsewhere (`detection_same_forms`).
OFFLINE_LABELER_VERSION = 6

_MIN_SHARE = 0.6  # share of the examples a pattern must cover to be part of a description
_FORM_COVERAGE = 0.8  # list word forms until they cover this share of the examples...
_MAX_FORMS = 3  # ...or this many
_CONTEXT_WORDS = 3  # words on each side searched for a shared n-gram

_PUNCT_NAMES = {
    ",": "comma",
    ".": "period",
    "!": "exclamation mark",
    "?": "question mark",
    ";": "semicolon",
    ":": "colon",
    '"': "double quote",
    "'": "apostrophe",
    "(": "opening parenthesis",
    ")": "closing parenthesis",
    "-": "hyphen",
    "—": "em dash",
    "–": "en dash",
    "...": "ellipsis",
}
_FORM_NAMES = {"\n": "newlines", " ": "runs of spaces"}
_CLASS_PLURAL = {"newline": "newlines", "space": "runs of spaces", "number": "numbers", "punctuation": "punctuation", "capitalised": "capitalised words"}
_CLASS_SINGULAR = {"newline": "a newline", "space": "a run of spaces", "number": "a number", "punctuation": "punctuation", "capitalised": "a capitalised word"}


def char_class(word: str) -> str:
    stripped = word.strip()
    if not stripped:
        return "newline" if "\n" in word else "space"
    if all(unicodedata.category(ch).startswith("N") for ch in stripped):
        return "number"
    if not any(ch.isalnum() for ch in stripped):
        return "punctuation"
    return "capitalised" if stripped[0].isupper() else "word"


def _context_words(text: str, side: str) -> list[str]:
    words = [normalize_form(w) for w in split_words(text) if w.strip()]
    return words[-_CONTEXT_WORDS:] if side == "left" else words[:_CONTEXT_WORDS]


def _ngrams(words: Sequence[str]) -> set[tuple[str, ...]]:
    # Punctuation-only n-grams ('"', ',') are better said by the neighbour's class.
    return {tuple(words[i : i + n]) for n in (1, 2) for i in range(len(words) - n + 1) if any(char_class(w) != "punctuation" for w in words[i : i + n])}


def _neighbour_class(text: str, side: str) -> str | None:
    words = split_words(text)
    if not words:
        return None
    return char_class(words[-1] if side == "left" else words[0])


@dataclass(frozen=True)
class Cue:
    """What the context on one side shares: an n-gram among the nearest words, or the adjacent word's class."""

    ngram: tuple[str, ...] = ()
    word_class: str | None = None


@dataclass(frozen=True)
class HeuristicRule:
    forms: tuple[str, ...]  # the word is one of these normalized forms (empty: any word of `word_class`)
    word_class: str | None
    left: Cue | None
    right: Cue | None
    coherent: bool


def _side_cue(texts: Sequence[str], side: str) -> Cue | None:
    n = len(texts)
    candidates: list[tuple[float, int, int, tuple[str, ...], Cue]] = []
    grams = Counter(g for t in texts for g in _ngrams(_context_words(t, side)))
    for gram, count in grams.items():
        # Sort key: coverage first; on ties an n-gram beats a class, a longer n-gram a shorter one.
        candidates.append((-count / n, 0, -len(gram), gram, Cue(ngram=gram)))
    classes = Counter(c for t in texts if (c := _neighbour_class(t, side)) not in (None, "word"))
    for cls, count in classes.items():
        candidates.append((-count / n, 1, 0, (cls,), Cue(word_class=cls)))
    if not candidates:
        return None
    best = min(candidates, key=lambda c: c[:4])
    return best[4] if -best[0] >= _MIN_SHARE else None


def heuristic_rule(train: Sequence[Context]) -> HeuristicRule:
    n = len(train)
    ranked = sorted(Counter(normalize_form(c.word) for c in train).items(), key=lambda kv: (-kv[1], kv[0]))
    forms: list[str] = []
    covered = 0
    for form, count in ranked[:_MAX_FORMS]:
        if count < min(2, n):
            break  # a form seen once is no pattern, however many such forms add up
        forms.append(form)
        covered += count
        if covered / n >= _FORM_COVERAGE:
            break
    left = _side_cue([c.left for c in train], "left")
    right = _side_cue([c.right for c in train], "right")
    if covered / n >= _MIN_SHARE:
        return HeuristicRule(tuple(forms), None, left, right, coherent=True)
    cls, count = min(Counter(char_class(c.word) for c in train).items(), key=lambda kv: (-kv[1], kv[0]))
    if cls != "word" and count / n >= _MIN_SHARE:
        return HeuristicRule((), cls, left, right, coherent=True)
    return HeuristicRule(tuple(f for f, _ in ranked[:_MAX_FORMS]), None, left, right, coherent=False)


def _show_form(form: str) -> str:
    if form in _FORM_NAMES:
        return _FORM_NAMES[form]
    if form in _PUNCT_NAMES:
        return f"'{form}' ({_PUNCT_NAMES[form]})"
    return f"'{form}'"


def _show_cue(cue: Cue, side: str) -> str:
    what = f"'{' '.join(cue.ngram)}'" if cue.ngram else _CLASS_SINGULAR[cue.word_class]
    return f"after {what}" if side == "left" else f"followed by {what}"


def describe(rule: HeuristicRule) -> str:
    if rule.forms:
        shown = [_show_form(f) for f in rule.forms]
        subject = " or ".join(shown) if rule.coherent else "mixed words such as " + ", ".join(shown)
    else:
        subject = _CLASS_PLURAL[rule.word_class]
    cues = [_show_cue(cue, side) for cue, side in ((rule.left, "left"), (rule.right, "right")) if cue]
    return " ".join([subject, *cues]) if len(cues) < 2 else f"{subject} {cues[0]} and {cues[1]}"


def _cue_matches(cue: Cue, text: str, side: str) -> bool:
    if cue.ngram:
        return cue.ngram in _ngrams(_context_words(text, side))
    return _neighbour_class(text, side) == cue.word_class


def rule_matches(rule: HeuristicRule, ctx: Context) -> bool:
    """The deterministic judge of a heuristic description: every part of the rule must hold."""
    if rule.forms and normalize_form(ctx.word) not in rule.forms:
        return False
    if not rule.forms and char_class(ctx.word) != rule.word_class:
        return False
    return all(_cue_matches(cue, text, side) for cue, text, side in ((rule.left, ctx.left, "left"), (rule.right, ctx.right, "right")) if cue)


def context_matches(rule: Rule, ctx: Context) -> bool:
    """Whether a context rule holds for a shown context (its word and the words to its left)."""
    attrs = shown_word_attributes(split_words(ctx.left), ctx.word)
    return bool(rule.mask(attrs)[-1])


def judged(label: str, source: str, coherent: bool, fits: Callable[[Context], bool], feature: FeatureExamples, seed: int, n_fuzz: int) -> LabelResult:
    """A label whose own rule is the judge: detection on the validation set, fuzzing on moved marks."""
    examples, truth = validation_set(feature, seed)
    scores = detection_scores(truth, [fits(c) for c in examples])
    fuzzed, correct = fuzz_set(feature, n_fuzz, seed)
    fuzz = detection_scores(correct, [fits(c) for c in fuzzed]).balanced_accuracy if fuzzed else None
    return LabelResult(label, source, None, coherent, scores.balanced_accuracy, scores.precision, scores.recall, fuzz)


def _describe_beyond(rule: Rule, finding_rules: Sequence[Rule]) -> str:
    """A rule outside the findings' rules; the bare word of a finding's contextual rule ('years'
    beside "'years' right after a lower-case word") is said as that word elsewhere."""
    same_word = any(r.word_kind == rule.word_kind and r.word_value == rule.word_value for r in finding_rules)
    return rule.describe() + (" elsewhere" if same_word and rule.left_kind is None else "")


def heuristic_label(feature: FeatureExamples, seed: int, n_fuzz: int = 0) -> LabelResult:
    """The context rules of the latent's findings, said in words ("... or ...": a context fits
    when any holds), and the rules of what else it fires on (`FeatureExamples.broader`; the label
    is then not coherent: the latent is broader than its findings); for a latent in latent
    findings only, their word sets; otherwise the heuristic rule read off its train contexts."""
    if not feature.train:
        return LabelResult(None, "unlabeled", reason="no train contexts")
    if feature.rules:

        def by_rule(c: Context) -> bool:
            return any(context_matches(r, c) for r in feature.rules)

        def fits(c: Context) -> bool:
            return by_rule(c) or any(context_matches(r, c) for r in feature.broader)

        label = describe_rules(feature.rules)
        if feature.broader:
            label += "; the latent also fires on " + ", ".join(_describe_beyond(r, feature.rules) for r in feature.broader)
        return judged(label, "rule", not feature.broader, fits, feature, seed, n_fuzz)
    if feature.word_sets:

        def in_a_set(c: Context) -> bool:
            left = split_words(c.left)
            return any(ws.matches(left, c.word) for ws in feature.word_sets)

        return judged(" or ".join(ws.describe() for ws in feature.word_sets), "word set", True, in_a_set, feature, seed, n_fuzz)
    rule = heuristic_rule(feature.train)
    return judged(describe(rule), "heuristic", rule.coherent, lambda c: rule_matches(rule, c), feature, seed, n_fuzz)
