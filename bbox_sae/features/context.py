"""Context attributes: what a word's document holds to its left, beyond the word before it.

A rule's left part names the word before, its class or the layout. The differences the paper
names first live further back: a word the document used long ago (long-range dependencies), the
bracket or quotation a word sits in, the kind of sentence a '?' closes, the opening words of a
text, and rare words (low-frequency words). Each is one boolean flag per word, computed left to
right within the document as a causal LM reads it; only `rare` counts over the corpus, as a
property of the word form, not of what follows it.

The set is kept small and nameable: each flag is said in words a reader checks in the contexts
shown (`PHRASES`), and a rule tests one flag, alone or with a word form or class.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

# A cue word's scope: "'were' with 'if' among the 8 words before" ("if you were", "if it please
# you that I were"), the conditional the paper names, a negation's or a question word's reach.
CUE_WINDOW = 8
REPEAT_GAP = 30  # a repeat is long-range when the form's last use is more than this many words back
OPENING_WORDS = 5  # "among the first words of the text"
RARE_COUNT = 2  # a form seen at most this many times in the corpus is rare
WH_WORDS = frozenset("who whom whose what which when where whither whence why wherefore how".split())
SENTENCE_ENDS = frozenset(".?!")
CLOSERS = ")]\"'\u201d\u2019"  # a sentence also ends at ".]" (a stage direction) or '?"'


@dataclass(frozen=True)
class CueScope:
    """How far back a cue word may stand: a Rule's `left_kind`, how it is said after "with 'x'",
    and the most forms a word's window keeps (nearest first)."""

    kind: str
    phrase: str
    width: int


# Three reaches, one concept: a cue shortly before (a conditional's 'if', a negation), a cue earlier
# in the sentence (its register: 'thou' sets a familiar one), and a cue earlier in the text (its
# topic: 'arms' after 'war' is not 'arms' after 'embrace'). The sentence and the text keep their
# most recent forms up to `width`; the text keeps only topic words (`topic_forms`), so a window
# holds what tells one text from another, not the function words every text has.
CUE_SCOPES = (
    CueScope("cue", f"among the {CUE_WINDOW} words before", CUE_WINDOW),
    CueScope("cue_sentence", "earlier in its sentence", 48),
    CueScope("cue_text", "earlier in the text", 64),
)
CUE_KINDS = {scope.kind: scope for scope in CUE_SCOPES}
# A shown context (a few words to the left) cannot tell what the text said before it.
CUES_BEYOND_SHOWN = frozenset({"cue_text"})
# A topic word: in at least this many documents and at most this share of them.
TOPIC_MIN_DOCS = 3
TOPIC_MAX_DOC_SHARE = 0.25

FLAGS = ("repeat_far", "in_brackets", "in_quotes", "doc_opening", "rare", "sentence_wh", "sentence_other")
PHRASES = {
    "repeat_far": f"repeated from more than {REPEAT_GAP} words back",
    "in_brackets": "inside brackets",
    "in_quotes": "inside quotation marks",
    "doc_opening": f"among the first {OPENING_WORDS} words of the text",
    "rare": f"seen at most {RARE_COUNT} times in the corpus",
    "sentence_wh": "in a sentence that began with a wh-word",
    "sentence_other": "in a sentence that did not begin with a wh-word",
}
# Holds for nearly every word: searched only with a punctuation mark, where it tells one mark's two
# kinds of sentence apart ('?' after "Why ..." and after "Is it ..."). With a word it split off a
# few percent of a form's words as a finding of its own on the demo ("'pride' in a sentence that
# did not begin with a wh-word"); alone, or beside a latent's group, it would say nothing.
COMPLEMENTS = frozenset({"sentence_other"})
# What a shown context (a few words to the left) cannot tell: a judge reading one takes them as
# holding, and checks the rest of the statement.
BEYOND_SHOWN = ("repeat_far", "doc_opening", "rare")
# Flags a rule may test alone or with a class ("a word inside brackets").
ALONE = tuple(f for f in FLAGS if f not in COMPLEMENTS)
# Flags a rule tests with a word form ('?' in a sentence that began with a wh-word). A rare form
# has too few words to be a rule of its own.
WITH_FORM = tuple(f for f in FLAGS if f != "rare")


def _is_word(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def document_flags(words: list[str], rare_forms: frozenset[str]) -> np.ndarray:
    """(len(words), len(FLAGS)) booleans for one document's words (raw, in order); `rare_forms`
    are the normalized forms seen at most `RARE_COUNT` times in the corpus."""
    out = np.zeros((len(words), len(FLAGS)), dtype=bool)
    col = {name: i for i, name in enumerate(FLAGS)}
    last_seen: dict[str, int] = {}
    n_words = 0  # words (with a letter or digit) so far: punctuation and layout are not counted
    brackets = quotes = 0
    sentence_wh: bool | None = None  # unknown until the sentence's first word
    for i, raw in enumerate(words):
        text = raw.strip()
        form = text.lower()
        is_word = _is_word(text)
        if is_word and sentence_wh is None:
            sentence_wh = form in WH_WORDS
        row = out[i]
        if is_word:
            before = last_seen.get(form)
            row[col["repeat_far"]] = before is not None and n_words - before > REPEAT_GAP
            row[col["rare"]] = form in rare_forms
        row[col["in_brackets"]] = brackets > 0
        row[col["in_quotes"]] = quotes % 2 == 1
        row[col["doc_opening"]] = n_words < OPENING_WORDS
        row[col["sentence_wh"]] = bool(sentence_wh)
        row[col["sentence_other"]] = sentence_wh is False
        # What this word changes is seen by the words after it, not by the word itself.
        if is_word:
            last_seen[form] = n_words
            n_words += 1
        brackets = max(0, brackets + text.count("(") + text.count("[") - text.count(")") - text.count("]"))
        quotes += text.count('"') + text.count("\u201c") + text.count("\u201d")
        if ends_sentence(raw):
            sentence_wh = None
    return out


def ends_sentence(raw: str) -> bool:
    """Whether a sentence ends with this word: a closing mark (also inside a closer, ".]") or a
    blank line."""
    return raw.strip().rstrip(CLOSERS)[-1:] in SENTENCE_ENDS or raw.count("\n") > 1


def cue_windows(codes: list[int], is_word: list[bool], ends: list[bool] | None = None, topical: list[bool] | None = None) -> tuple[np.ndarray, ...]:
    """Per scope of `CUE_SCOPES`, a (len(codes), width) int32 array: per word, the form codes before
    it in its document, nearest first, each form once, -1 where none: the last `CUE_WINDOW` words
    (with a letter or digit); the words of its sentence so far (`ends`: where one ends); the topic
    words (`topical`) of the text so far."""
    n = len(codes)
    ends = ends if ends is not None else [False] * n
    topical = topical if topical is not None else [False] * n
    out = tuple(np.full((n, scope.width), -1, dtype=np.int32) for scope in CUE_SCOPES)
    recent: list[int] = []
    sentence: dict[int, None] = {}  # insertion-ordered: the latest use last
    text: dict[int, None] = {}
    for i, (code, word) in enumerate(zip(codes, is_word)):
        for window, seen in zip(out, (dict.fromkeys(reversed(recent)), reversed(sentence), reversed(text))):
            kept = list(seen)[: window.shape[1]]
            window[i, : len(kept)] = kept
        if word:
            recent = (recent + [code])[-CUE_WINDOW:]
            sentence.pop(code, None)
            sentence[code] = None
            if topical[i]:
                text.pop(code, None)
                text[code] = None
        if ends[i]:
            sentence = {}
    return out


def topic_forms(forms_by_doc: list[list[str]], function_words: frozenset[str]) -> frozenset[str]:
    """Forms (with a letter) found in at least `TOPIC_MIN_DOCS` documents and at most
    `TOPIC_MAX_DOC_SHARE` of them, function words excepted: the words that tell texts apart."""
    doc_counts = Counter(f for forms in forms_by_doc for f in set(forms) if any(ch.isalpha() for ch in f))
    most = TOPIC_MAX_DOC_SHARE * len(forms_by_doc)
    return frozenset(f for f, c in doc_counts.items() if TOPIC_MIN_DOCS <= c <= most and f not in function_words)


def rare_forms(docs: list[list[str]]) -> frozenset[str]:
    """Forms (with a letter or digit) seen at most `RARE_COUNT` times in `docs`."""
    counts = Counter(w.strip().lower() for words in docs for w in words if _is_word(w))
    return frozenset(f for f, c in counts.items() if c <= RARE_COUNT)
