"""The scorer interface: documents in, per-token log-probs with character offsets out.

Every token of a document is scored as log P(token | start token + preceding tokens).
Documents longer than the window are scored with sliding windows over the sequence
[start, t_0, ..., t_{n-1}]: each token is scored exactly once, with at least
`window - stride` tokens of real left context (fewer only near the document start).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

# One rule for log-probs from anywhere (a server's answer, a `source: parquet` file): a value above
# 0, +inf included, is a probability above 1 (negative log-likelihoods, or a server computing
# something else) and is refused; NaN and -inf are a model failing on a word, which is excluded
# with a warning. The tolerance is for rounding.
LOGPROB_RULE = "log-probs must be <= 0 (natural log)"
_POSITIVE_BEYOND_ROUNDING = 1e-9


def largest_positive(logprobs: np.ndarray) -> int | None:
    """Where the largest log-prob above 0 is (+inf included), or None where there is none."""
    above = logprobs > _POSITIVE_BEYOND_ROUNDING
    return int(np.argmax(np.where(above, logprobs, -np.inf))) if above.any() else None


@dataclass
class TokenScores:
    doc_id: str
    offsets: np.ndarray  # (n, 2) int64 character spans [start, end) of the scored tokens
    logprobs: np.ndarray  # (n,) float64; log P(token_i | start, tokens < i)
    token_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # What the model expected most at each position, most likely first: (n, k) token texts and
    # their log-probs; k = 0 where the scorer keeps none (`ModelConfig.alternatives`).
    top_tokens: list[list[str]] | None = None
    top_logprobs: np.ndarray | None = None


@dataclass(frozen=True)
class Window:
    """Input positions [begin, end) of the sequence [start, t_0, ...]; targets [first_target, end) are scored."""

    begin: int
    end: int
    first_target: int


def plan_windows(n_tokens: int, window: int, stride: int) -> list[Window]:
    """Windows over the input [start] + tokens (length n_tokens + 1).

    A target at input position t is predicted from position t - 1, so the first window
    scores targets 1..window-1 and each later window (begun `stride` further on) scores
    only the targets past the previous window's end.
    """
    if not 1 <= stride < window:
        raise ValueError(f"need 1 <= stride < window, got stride={stride}, window={window}")
    length = n_tokens + 1
    windows: list[Window] = []
    scored_until = 1
    begin = 0
    while scored_until < length:
        end = min(begin + window, length)
        windows.append(Window(begin, end, scored_until))
        scored_until = end
        begin += stride
    return windows


class Scorer(Protocol):
    name: str

    def score(self, documents: Iterable[tuple[str, str]]) -> Iterator[TokenScores]:
        """Yield one TokenScores per (doc_id, text), in order."""
        ...


@dataclass
class ScoringStats:
    documents: int = 0
    tokens: int = 0
    seconds: float = 0.0
    retries: int = 0
    failures: int = 0
    precision: str | None = None  # what a local model scored in: `dtype: auto` differs by host

    def as_dict(self) -> dict:
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        return {
            **({"precision": self.precision} if self.precision else {}),
            "documents": self.documents,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(rate, 1),
            "retries": self.retries,
            "failures": self.failures,
        }
