"""Canonical words: one tokenizer-independent segmentation of raw text into character spans.

GPT-2 / Longformer style pre-tokenization: a word carries its leading space; runs of
punctuation and runs of whitespace (newlines included, kept whole) are words of their own, because how
a model predicts layout and punctuation is part of what we compare. Combining marks stay
with their letters. The spans tile the text: concatenating the words gives it back.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import regex

_WORD_PATTERN = regex.compile(
    r"""'(?:[sdmt]|ll|ve|re)(?![\p{L}\p{M}])"""  # English contractions, as GPT-2 splits them
    r"""| ?[\p{L}\p{M}]+"""  # letters (with combining marks), optional leading space
    r"""| ?\p{N}+"""  # digit runs
    r"""| ?[^\s\p{L}\p{M}\p{N}]+"""  # punctuation / symbol runs
    r"""|\s+(?= \S)"""  # whitespace run before " word": the last space goes with the word
    r"""|\s+""",
    regex.VERSION1,
)


def word_spans(text: str) -> np.ndarray:
    """Return an (n, 2) int64 array of [start, end) character spans that tile `text`."""
    spans = [(m.start(), m.end()) for m in _WORD_PATTERN.finditer(text)]
    arr = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    return arr


def split_words(text: str) -> list[str]:
    return [text[s:e] for s, e in word_spans(text)]


def pack_pieces(pieces: Iterable[str], words_per_doc: int, max_words: float = float("inf")) -> list[str]:
    """Consecutive pieces joined by blank lines into documents of about `words_per_doc` words: a
    document ends once it reaches that size, or before a piece would take it past `max_words`; a
    last document shorter than half the size is dropped."""
    docs, current, count = [], [], 0
    for piece in pieces:
        n = len(piece.split())
        if current and count + n > max_words:
            docs.append("\n\n".join(current))
            current, count = [], 0
        current.append(piece)
        count += n
        if count >= words_per_doc:
            docs.append("\n\n".join(current))
            current, count = [], 0
    if count >= words_per_doc // 2:
        docs.append("\n\n".join(current))
    return docs
