"""How far to trust a label: a judge's picks on held-out examples against the truth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class DetectionScores:
    balanced_accuracy: float | None
    precision: float | None
    recall: float | None


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def detection_scores(truth: Sequence[bool], predicted: Sequence[bool]) -> DetectionScores:
    """Balanced accuracy, precision and recall; a metric whose denominator is empty is None, not 0."""
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} truths but {len(predicted)} judgements")
    tp = sum(t and p for t, p in zip(truth, predicted))
    fp = sum(not t and p for t, p in zip(truth, predicted))
    fn = sum(t and not p for t, p in zip(truth, predicted))
    tn = sum(not t and not p for t, p in zip(truth, predicted))
    recall = _ratio(tp, tp + fn)
    specificity = _ratio(tn, tn + fp)
    balanced = None if recall is None or specificity is None else (recall + specificity) / 2
    return DetectionScores(balanced_accuracy=balanced, precision=_ratio(tp, tp + fp), recall=recall)
