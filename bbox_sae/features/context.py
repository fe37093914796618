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
        if text.rstrip(CLOSERS)[-1:] in SENTENCE_ENDS or raw.count("\n") > 1:
            sentence_wh = None
    return out


def cue_windows(codes: list[int], is_word: list[bool]) -> np.ndarray:
    """(len(codes), CUE_WINDOW) int32: per word, the form codes of the last `CUE_WINDOW` words (with a
    letter or digit) before it in its document, nearest first, each form once, -1 where none."""
    out = np.full((len(codes), CUE_WINDOW), -1, dtype=np.int32)
    recent: list[int] = []
    for i, (code, word) in enumerate(zip(codes, is_word)):
        seen = list(dict.fromkeys(reversed(recent)))
        out[i, : len(seen)] = seen
        if word:
            recent = (recent + [code])[-CUE_WINDOW:]
    return out


def rare_forms(docs: list[list[str]]) -> frozenset[str]:
    """Forms (with a letter or digit) seen at most `RARE_COUNT` times in `docs`."""
    counts = Counter(w.strip().lower() for words in docs for w in words if _is_word(w))
    return frozenset(f for f, c in counts.items() if c <= RARE_COUNT)
