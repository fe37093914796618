"""Simple context rules: what a group of words has in common, said in a way a person can check.

Every word of the corpus gets a few *left-context* attributes (a causal LM sees only the word and
what precedes it, so no rule looks right): its normalized form, its class, the form and class of
the word before it, and its place in the layout (line start, after a blank line). A rule is one
condition on the word and/or one on its left context, e.g. "'not' right after an auxiliary verb"
or "a capitalised word after a blank line".

`best_rule` searches this small rule space for the rule that best separates a latent's top words
from the rest: recall is the share of the top words the rule covers, precision the share of the
words matching the rule on which the latent fires. Its F1 is a label-free coherence measure (a
mixture of unrelated words has no rule with both high), the rule itself is an offline label,
and latents with the same rule express one finding.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from bbox_sae.features.context import ALONE as ALONE_FLAGS
from bbox_sae.features.context import (
    BEYOND_SHOWN,
    CUE_KINDS,
    CUE_SCOPES,
    CUES_BEYOND_SHOWN,
    FLAGS,
    cue_windows,
    document_flags,
    ends_sentence,
    rare_forms,
    topic_forms,
)
from bbox_sae.features.context import PHRASES as CONTEXT_PHRASES

# English function-word classes, used only to phrase left-context rules ("after an auxiliary").
# Only forms that are what the class says wherever they stand: "'d" is a past tense as often as
# 'would' ("carv'd out", "pluck'd out" were "after an auxiliary verb" on the demo), "'s" a
# possessive or 'us', 'need' a noun.
AUXILIARIES = frozenset(
    "am is are was were be been being have has had having do does did can could will would shall should may might must "
    "dare 'll 're 've art wast wert hast hath dost doth didst canst couldst wilt wouldst shalt shouldst mayst".split()
)
DETERMINERS = frozenset("the a an this that these those my your his her its our their thy thine no every each some any".split())
PREPOSITIONS = frozenset("of in on at to for with by from into upon about over under through between against without within".split())
PRONOUNS = frozenset("i you he she it we they me him us them thou thee ye who whom which what".split())
CONJUNCTIONS = frozenset("and or but nor so yet if though although because when while as than".split())
FUNCTION_CLASSES = (
    ("auxiliary", AUXILIARIES),
    ("determiner", DETERMINERS),
    ("preposition", PREPOSITIONS),
    ("pronoun", PRONOUNS),
    ("conjunction", CONJUNCTIONS),
)
FUNCTION_WORDS = frozenset().union(*(members for _, members in FUNCTION_CLASSES))
# A left class of named members, as the vocabulary spells it: a rule after one can be said by the
# members that carry its difference (`findings.narrower_left_forms`).
LISTED_LEFT_CLASSES = frozenset("c:" + name for name, _ in FUNCTION_CLASSES)

CLASS_PHRASES = {
    "newline": "a line break",
    "blank": "a blank line",
    "space": "a run of spaces",
    "number": "a number",
    "punctuation": "punctuation",
    "capitalised": "a capitalised word",
    "allcaps": "an all-capitals word",
    "word": "a lower-case word",
    "auxiliary": "an auxiliary verb",
    "determiner": "a determiner",
    "preposition": "a preposition",
    "pronoun": "a pronoun",
    "conjunction": "a conjunction",
    "start": "the start of the text",
}
LAYOUT_PHRASES = {"line_start": "at the start of a line", "after_blank": "after a blank line"}
PUNCT_NAMES = {
    ",": "comma",
    ".": "full stop",
    ";": "semicolon",
    ":": "colon",
    "?": "question mark",
    "!": "exclamation mark",
    "'": "apostrophe",
    '"': "quotation mark",
    "(": "opening bracket",
    ")": "closing bracket",
    "-": "hyphen",
    "--": "dash",
}


def normalize_form(word: str) -> str:
    """Case- and space-insensitive form; whitespace runs are one form per kind."""
    stripped = word.strip()
    if not stripped:
        return "\n\n" if word.count("\n") > 1 else "\n" if "\n" in word else " "
    return stripped.lower()


def word_class(word: str) -> str:
    stripped = word.strip()
    if not stripped:
        return "blank" if word.count("\n") > 1 else "newline" if "\n" in word else "space"
    if all(unicodedata.category(ch).startswith("N") for ch in stripped):
        return "number"
    if not any(ch.isalnum() for ch in stripped):
        return "punctuation"
    if stripped[0].isupper():
        return "allcaps" if len(stripped) > 1 and stripped.isupper() else "capitalised"
    return "word"


def left_class(word: str | None) -> str:
    """The class of the word to the left, with function words named by their role."""
    if word is None:
        return "start"
    form = normalize_form(word)
    for name, members in FUNCTION_CLASSES:
        if form in members:
            return name
    return word_class(word)


@dataclass(frozen=True)
class WordAttributes:
    """Per word (aligned arrays of ints indexing `vocab`): the attributes rules test."""

    form: np.ndarray
    cls: np.ndarray
    left_form: np.ndarray
    left_cls: np.ndarray
    left2_form: np.ndarray  # the form two words back ("if" for "were" in "if you were")
    line_start: np.ndarray  # bool
    after_blank: np.ndarray  # bool
    vocab: list[str]
    context: np.ndarray  # (n, len(context.FLAGS)) bool: what the document holds further left
    cues: tuple[np.ndarray, ...]  # per `context.CUE_SCOPES`, (n, width) int: the forms before each word in that scope
    shown: bool = False  # read from a shown context, which cannot tell what `context.CUES_BEYOND_SHOWN` need
    doc: np.ndarray | None = None  # int: each word's document, in the order given to `word_attributes`

    @cached_property
    def code(self) -> dict[str, int]:
        """Vocab string -> code; built once per attribute table, not once per rule test."""
        return {s: i for i, s in enumerate(self.vocab)}

    def take(self, positions: np.ndarray) -> WordAttributes:
        """The attributes of the words at `positions` (e.g. the words behind a matrix's rows)."""
        return WordAttributes(
            self.form[positions],
            self.cls[positions],
            self.left_form[positions],
            self.left_cls[positions],
            self.left2_form[positions],
            self.line_start[positions],
            self.after_blank[positions],
            self.vocab,
            self.context[positions],
            tuple(window[positions] for window in self.cues),
            self.shown,
            None if self.doc is None else self.doc[positions],
        )

    def window(self, kind: str) -> np.ndarray:
        """The cue window of a scope (`context.CUE_KINDS`)."""
        return self.cues[list(CUE_KINDS).index(kind)]


def word_attributes(docs: list[list[str]], rare: frozenset[str] | None = None, topics: frozenset[str] | None = None) -> WordAttributes:
    """Attributes of every word of every document, in order (documents concatenated); `rare`: the
    corpus's rare forms (`context.rare_forms`) and `topics` its topic words (`context.topic_forms`),
    by default counted over `docs`."""
    ids: dict[str, int] = {}

    def code(s: str) -> int:
        return ids.setdefault(s, len(ids))

    form, cls, left_form, left_cls, left2_form, line_start, after_blank = [], [], [], [], [], [], []
    forms_by_doc = [[normalize_form(w) for w in words] for words in docs]
    topics = topic_forms(forms_by_doc, FUNCTION_WORDS) if topics is None else topics
    windows = []
    for words, forms in zip(docs, forms_by_doc):
        start = len(form)
        prev = prev2 = None
        for w in words:
            form.append(code("f:" + normalize_form(w)))
            cls.append(code("c:" + word_class(w)))
            left_form.append(code("f:" + (normalize_form(prev) if prev is not None else "")))
            left_cls.append(code("c:" + left_class(prev)))
            left2_form.append(code("f:" + (normalize_form(prev2) if prev2 is not None else "")))
            line_start.append(prev is None or "\n" in prev)
            after_blank.append(prev is None or prev.count("\n") > 1)
            prev2, prev = prev, w
        is_word = [any(ch.isalnum() for ch in w) for w in words]
        windows.append(cue_windows(form[start:], is_word, [ends_sentence(w) for w in words], [f in topics for f in forms]))
    vocab = [s for s, _ in sorted(ids.items(), key=lambda kv: kv[1])]
    arr = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
    rare = rare_forms(docs) if rare is None else rare
    flags = [document_flags(words, rare) for words in docs]
    context = np.concatenate(flags) if flags else np.zeros((0, len(FLAGS)), dtype=bool)
    return WordAttributes(
        arr(form),
        arr(cls),
        arr(left_form),
        arr(left_cls),
        arr(left2_form),
        np.asarray(line_start, dtype=bool),
        np.asarray(after_blank, dtype=bool),
        vocab,
        context,
        tuple(np.concatenate([w[k] for w in windows]) if windows else np.zeros((0, scope.width), dtype=np.int32) for k, scope in enumerate(CUE_SCOPES)),
        doc=np.repeat(np.arange(len(docs), dtype=np.int32), [len(words) for words in docs]),
    )


def shown_word_attributes(left_words: list[str], word: str) -> WordAttributes:
    """Attributes of a word shown with the words to its left (the last row), as a judge reads it:
    what the shown words cannot tell (`context.BEYOND_SHOWN`: a repeat from far back, the text's
    opening, a rare form; a cue earlier in the text) is taken as holding, so the rest of a
    statement is what gets checked."""
    attrs = word_attributes([[*left_words, word]], rare=frozenset(), topics=frozenset())
    attrs.context[:, [FLAGS.index(f) for f in BEYOND_SHOWN]] = True
    return replace(attrs, shown=True)


# A rule's word part may be a set of forms ('forms'): a topic shows in several of its words
# ('arms', 'field' or 'colours' in a text that named 'war'), each too rare with its cue to test alone.
FORMS_SEP = "|"


def form_set_value(forms: list[str]) -> str:
    """The `word_value` of a 'forms' rule: its vocab strings, sorted (so one set is one rule)."""
    return FORMS_SEP.join(sorted(forms))


@dataclass(frozen=True)
class WordKind:
    """One kind of a rule's word part, declared once (`WORD_KINDS`): where it holds, how it is said,
    the word forms it names (each joins findings as the word it says), and, for a kind whose values
    are sets, how several of them are said as one. A new kind is one entry here, the independent
    reader's check (`evaluation.statement_truth`, its own code on purpose) and what proposes it."""

    column: Callable[[WordAttributes], np.ndarray]  # each word's code, the word part holds where it is one of the value's
    phrase: Callable[[str], str]
    parts: Callable[[str], list[str]] = lambda value: [value]  # noqa: E731
    # A kind whose values are sets: several values' parts said as one value (a topic's sets, one per cue).
    united: Callable[[list[str]], str] | None = None

    def holds(self, attrs: WordAttributes, value: str, rows: np.ndarray | None) -> np.ndarray:
        col = self.column(attrs) if rows is None else self.column(attrs)[rows]
        return np.isin(col, [attrs.code.get(v, -1) for v in self.parts(value)])


@dataclass(frozen=True)
class Rule:
    """A condition on the word (`word_kind` 'form', 'forms' (one of several forms, `FORMS_SEP`
    between them) or 'class') and/or on its left context (`left_kind` 'form', 'class', 'form2'
    (two words back), 'layout', 'context' or a cue scope); values are vocab strings, layout names
    or `context.FLAGS`."""

    word_kind: str | None = None
    word_value: str | None = None
    left_kind: str | None = None
    left_value: str | None = None

    def mask(self, attrs: WordAttributes, rows: np.ndarray | None = None) -> np.ndarray:
        take = (lambda a: a) if rows is None else (lambda a: a[rows])  # noqa: E731
        n = len(attrs.form) if rows is None else len(rows)
        m = np.ones(n, dtype=bool)
        code = attrs.code
        if self.word_kind:
            m &= WORD_KINDS[self.word_kind].holds(attrs, self.word_value, rows)
        if self.left_kind == "layout":
            m &= take(attrs.line_start if self.left_value == "line_start" else attrs.after_blank)
        elif self.left_kind == "context":
            m &= take(attrs.context[:, FLAGS.index(self.left_value)])
        elif self.left_kind in CUE_KINDS:
            if not (attrs.shown and self.left_kind in CUES_BEYOND_SHOWN):
                # Read only where the word part holds: a text's window is 64 forms wide.
                at = np.flatnonzero(m)
                m[at] = (attrs.window(self.left_kind)[at if rows is None else rows[at]] == code.get(self.left_value, -2)).any(axis=1)
        elif self.left_kind:
            col = {"form": attrs.left_form, "class": attrs.left_cls, "form2": attrs.left2_form}[self.left_kind]
            m &= take(col) == code.get(self.left_value, -1)
        return m

    def describe(self) -> str:
        subject = _phrase(self.word_kind, self.word_value) if self.word_kind else "a word"
        if not self.left_kind:
            return subject
        if self.left_kind == "layout":
            return f"{subject} {LAYOUT_PHRASES[self.left_value]}"
        if self.left_kind == "context":
            return f"{subject} {CONTEXT_PHRASES[self.left_value]}"
        if self.left_kind == "form2":
            return f"{subject} two words after {_phrase('form', self.left_value)}"
        if self.left_kind in CUE_KINDS:
            return f"{subject} with {_phrase('form', self.left_value)} {CUE_KINDS[self.left_kind].phrase}"
        return f"{subject} right after {_phrase(self.left_kind, self.left_value)}"

    def as_dict(self) -> dict:
        return {"word_kind": self.word_kind, "word_value": self.word_value, "left_kind": self.left_kind, "left_value": self.left_value}


LISTED_FORMS = 4  # forms said in full; past this many and one more, the rest are counted


def listed(phrases: list[str], noun: str) -> str:
    """'a', 'b' or 'c'; past `LISTED_FORMS` and one more, "one of 9 words: 'a', 'b', 'c', 'd' and 5 more"."""
    if len(phrases) == 1:
        return phrases[0]
    if len(phrases) > LISTED_FORMS + 1:
        return f"one of {len(phrases)} {noun.removeprefix('a ')}s: {', '.join(phrases[:LISTED_FORMS])} and {len(phrases) - LISTED_FORMS} more"
    return f"{', '.join(phrases[:-1])} or {phrases[-1]}"


def _phrase(kind: str, value: str) -> str:
    """A word part said: a form, a class or a set of forms ('form' and 'class' name left contexts too)."""
    return WORD_KINDS[kind].phrase(value)


def _class_phrase(value: str) -> str:
    return CLASS_PHRASES.get(value[2:], value[2:])


def _form_phrase(value: str) -> str:
    text = value[2:]
    if text in ("\n", "\n\n"):
        return "a line break" if text == "\n" else "a blank line"
    if text == " ":
        return "a run of spaces"  # normalize_form's one form for every run without a line break
    if text == "":
        return "the start of the text"
    if text in PUNCT_NAMES:
        return f"'{text}' ({PUNCT_NAMES[text]})"
    return f"'{text}'"


def _forms_parts(value: str) -> list[str]:
    return value.split(FORMS_SEP)


WORD_KINDS = {
    "form": WordKind(lambda attrs: attrs.form, _form_phrase),
    "class": WordKind(lambda attrs: attrs.cls, _class_phrase),
    "forms": WordKind(lambda attrs: attrs.form, lambda value: listed([_form_phrase(f) for f in _forms_parts(value)], "a word"), _forms_parts, form_set_value),
}


@dataclass(frozen=True)
class RuleFit:
    rule: Rule
    precision: float  # share of the rule's words on which the latent fires
    recall: float  # share of the latent's top words the rule covers
    f1: float


def _candidates(attrs: WordAttributes, top_rows: np.ndarray, min_share: float) -> tuple[list, list]:
    """Word and left conditions that hold for at least `min_share` of the top words."""
    n = len(top_rows)
    word_parts: list = [(None, None)]
    left_parts: list = [(None, None)]
    for kind, col in (("form", attrs.form), ("class", attrs.cls)):
        for value, count in Counter(col[top_rows].tolist()).items():
            if count >= min_share * n:
                word_parts.append((kind, attrs.vocab[value]))
    for kind, col in (("form", attrs.left_form), ("class", attrs.left_cls), ("form2", attrs.left2_form)):
        for value, count in Counter(col[top_rows].tolist()).items():
            if count >= min_share * n:
                left_parts.append((kind, attrs.vocab[value]))
    for layout, col in (("line_start", attrs.line_start), ("after_blank", attrs.after_blank)):
        if col[top_rows].sum() >= min_share * n:
            left_parts.append(("layout", layout))
    for flag in ALONE_FLAGS:
        if attrs.context[top_rows, FLAGS.index(flag)].sum() >= min_share * n:
            left_parts.append(("context", flag))
    return word_parts, left_parts


# The most cues `common_cues` gives, most common first: a text's window holds dozens of topic words
# common to a latent's words, and each is a rule to try on every train word.
MAX_COMMON_CUES = 5


def common_cues(attrs: WordAttributes, rows: np.ndarray, min_share: float, kind: str = "cue") -> list[int]:
    """The forms in the `kind` cue window (`context.CUE_KINDS`) of at least `min_share` of `rows`
    (a window holds a form once), but those mostly right before, which the left form already says;
    the `MAX_COMMON_CUES` most common."""
    if len(rows) == 0:
        return []
    window = attrs.window(kind)[rows]
    counts = Counter(window.ravel().tolist())
    counts.pop(-1, None)
    right_before = Counter(attrs.left_form[rows].tolist())
    common = [(c, v) for v, c in counts.items() if c >= min_share * len(rows) and right_before[v] < 0.5 * c]
    return [v for _, v in sorted(common, reverse=True)[:MAX_COMMON_CUES]]


def fit_rule(rule: Rule, attrs: WordAttributes, top_rows: np.ndarray, fires: np.ndarray, scope: np.ndarray) -> RuleFit:
    """Precision over the words in `scope` (indices), recall over `top_rows`; `fires` is aligned to all words."""
    recall = float(rule.mask(attrs, top_rows).mean()) if len(top_rows) else 0.0
    matching = scope[rule.mask(attrs, scope)]
    precision = float(fires[matching].mean()) if len(matching) else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return RuleFit(rule, precision, recall, f1)


def any_mask(rules: list[Rule] | tuple[Rule, ...], attrs: WordAttributes, rows: np.ndarray | None = None) -> np.ndarray:
    """Where any of the rules holds (a finding may join several sibling rules)."""
    masks = [r.mask(attrs, rows) for r in rules]
    return np.logical_or.reduce(masks) if masks else np.zeros(len(attrs.form) if rows is None else len(rows), dtype=bool)


def fit_rules(rules: list[Rule], attrs: WordAttributes, top_rows: np.ndarray, fires: np.ndarray, scope: np.ndarray) -> RuleFit:
    """`fit_rule` for a disjunction of rules (reported under the first rule)."""
    recall = float(any_mask(rules, attrs, top_rows).mean()) if len(top_rows) else 0.0
    matching = scope[any_mask(rules, attrs, scope)]
    precision = float(fires[matching].mean()) if len(matching) else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return RuleFit(rules[0], precision, recall, f1)


def rules_to_json(rules: list[Rule]) -> str:
    return json.dumps([r.as_dict() for r in rules])


def rules_from_json(text: str) -> list[Rule]:
    raw = json.loads(text)
    return [Rule(**r) for r in (raw if isinstance(raw, list) else [raw])]


def _condition_masks(parts: list, attrs: WordAttributes, rows: np.ndarray, left: bool) -> np.ndarray:
    """(conditions x rows): where each word condition (or, with `left`, each left condition) holds;
    the empty condition (None, None) holds everywhere."""
    rules = [Rule(None, None, kind, value) if left else Rule(kind, value) for kind, value in parts]
    return np.stack([rule.mask(attrs, rows) for rule in rules]) if rules else np.zeros((0, len(rows)), dtype=bool)


def _pair_counts(word: np.ndarray, left: np.ndarray, weight: np.ndarray | None = None, chunk: int = 1 << 16) -> np.ndarray:
    """(word conditions x left conditions): on how many rows both hold (and `weight`, a bool per
    row, where given): the counts `fit_rule` takes means of. The rows go in chunks of fewer than
    2**24, within which float32 sums of 0/1 are exact, and the chunks add up in float64."""
    out = np.zeros((len(word), len(left)))
    for s in range(0, word.shape[1], chunk):
        w = word[:, s : s + chunk] if weight is None else word[:, s : s + chunk] & weight[s : s + chunk]
        out += w.astype(np.float32) @ left[:, s : s + chunk].T.astype(np.float32)
    return out


def ranked_rules(attrs: WordAttributes, top_rows: np.ndarray, fires: np.ndarray, scope: np.ndarray, min_share: float = 0.2) -> list[RuleFit]:
    """Every rule built from conditions common in the top words, best first: by F1, ties to the rule
    that names the word (its form, else its class), then to the one with fewer conditions; of two
    equally true statements the label keeps the more telling one."""
    if len(top_rows) == 0:
        return []
    word_parts, left_parts = _candidates(attrs, top_rows, min_share)
    # A rule holds where its word condition and its left condition both do, so every rule's counts
    # come from one product of the conditions' masks: `fit_rule` per rule, masking the whole scope
    # twice each time, had taken two thirds of the demo's features stage.
    word_top, left_top = _condition_masks(word_parts, attrs, top_rows, left=False), _condition_masks(left_parts, attrs, top_rows, left=True)
    word_scope, left_scope = _condition_masks(word_parts, attrs, scope, left=False), _condition_masks(left_parts, attrs, scope, left=True)
    in_top = _pair_counts(word_top, left_top)
    in_scope = _pair_counts(word_scope, left_scope)
    fired = _pair_counts(word_scope, left_scope, fires[scope])
    scored = []
    for i, (wk, wv) in enumerate(word_parts):
        for j, (lk, lv) in enumerate(left_parts):
            if wk is None and lk is None:
                continue
            recall = float(in_top[i, j] / len(top_rows))
            precision = float(fired[i, j] / in_scope[i, j]) if in_scope[i, j] else 0.0
            f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
            fit = RuleFit(Rule(wk, wv, lk, lv), precision, recall, f1)
            scored.append(((round(fit.f1, 4), wk == "form", wk is not None, -(lk is not None), lk == "form"), len(scored), fit))
    scored.sort(key=lambda t: (t[0], -t[1]), reverse=True)
    return [fit for _, _, fit in scored]


def best_rule(attrs: WordAttributes, top_rows: np.ndarray, fires: np.ndarray, scope: np.ndarray, min_share: float = 0.2) -> RuleFit | None:
    """The first of `ranked_rules`."""
    ranked = ranked_rules(attrs, top_rows, fires, scope, min_share)
    return ranked[0] if ranked else None


def cover_outside(
    rules: list[Rule] | tuple[Rule, ...],
    attrs: WordAttributes,
    top_rows: np.ndarray,
    fires: np.ndarray,
    scope: np.ndarray,
    min_precision: float = 0.5,
    max_rules: int = 3,
    min_words: int = 2,
) -> list[RuleFit]:
    """Rules for the top words that `rules` leave out, greedily (best F1 first, each over what is
    still left), each covering at least `min_words` of them with a precision over `scope` of at
    least `min_precision`: what else the latent fires on, said only where it mostly fires (a latent
    that fires on 6% of all 'of' does not "fire on 'of'")."""
    left = top_rows[~any_mask(rules, attrs, top_rows)] if len(rules) else top_rows
    found: list[RuleFit] = []
    while len(found) < max_rules and len(left) >= min_words:
        fit = next(
            (
                f
                for f in ranked_rules(attrs, left, fires, scope, min_share=min_words / len(left))
                if f.precision >= min_precision and f.recall * len(left) >= min_words - 1e-9
            ),
            None,
        )
        if fit is None:
            break
        found.append(fit)
        left = left[~fit.rule.mask(attrs, left)]
    return found
