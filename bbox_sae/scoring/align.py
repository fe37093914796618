"""Map a model's per-token log-probs onto canonical words by character offsets.

Rules (each keeps `sum(word log-probs) == sum(token log-probs)`):
- a token whose span overlaps several words splits its log-prob evenly among them;
- a token with an empty span [s, s) (e.g. byte-level pieces of one multibyte character
  after the first, or a tokenizer that reports no characters for a piece) goes to the word
  containing character s (the last word when s is the end of the text);
- the start-of-document token is never passed in: it is context, not a scored token.
Byte-level BPE tokenizers can report the same or overlapping spans for the pieces of one
multibyte character; each such token is assigned by its own span, so nothing is dropped.
"""

from __future__ import annotations

import numpy as np


def token_word_ranges(token_offsets: np.ndarray, word_spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each token, the first and last index of the words it overlaps (inclusive)."""
    offsets = np.asarray(token_offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = word_spans[:, 0], word_spans[:, 1]
    s, e = offsets[:, 0], offsets[:, 1]
    n_words = len(word_spans)
    # first word whose end is beyond s (the word containing character s)
    first = np.searchsorted(ends, s, side="right")
    # last word whose start is before e
    last = np.searchsorted(starts, e, side="left") - 1
    empty = e <= s
    last = np.where(empty, first, last)
    first = np.clip(first, 0, n_words - 1)
    last = np.clip(last, 0, n_words - 1)
    last = np.maximum(last, first)
    return first, last


def align_logprobs(token_offsets: np.ndarray, token_logprobs: np.ndarray, word_spans: np.ndarray) -> np.ndarray:
    """Sum token log-probs into words; returns float64 per-word log-probs (0 for words no token touched)."""
    token_logprobs = np.asarray(token_logprobs, dtype=np.float64)
    n_words = len(word_spans)
    out = np.zeros(n_words, dtype=np.float64)
    if n_words == 0 or len(token_logprobs) == 0:
        if len(token_logprobs) and n_words == 0:
            raise ValueError("tokens but no words: the text is empty")
        return out
    first, last = token_word_ranges(token_offsets, word_spans)
    single = first == last
    np.add.at(out, first[single], token_logprobs[single])
    for i in np.flatnonzero(~single):
        span = np.arange(first[i], last[i] + 1)
        out[span] += token_logprobs[i] / len(span)
    return out


def first_token_of_words(token_offsets: np.ndarray, word_spans: np.ndarray) -> np.ndarray:
    """(n_words,) the first token that begins in each word, -1 where none does (a word scored
    only through a token that began in the word before it): where the model's prediction for
    the word starts, so what it expected there in place of the word."""
    out = np.full(len(word_spans), -1, dtype=np.int64)
    if len(word_spans) == 0 or len(token_offsets) == 0:
        return out
    first, _ = token_word_ranges(token_offsets, word_spans)
    words, at = np.unique(first, return_index=True)
    out[words] = at
    return out
