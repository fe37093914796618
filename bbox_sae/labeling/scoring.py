"""How far to trust a label: a judge's picks on held-out examples against the truth.

Detection: does the judge, reading only the label, tell the latent's holdout top words from
negatives? Fuzzing: does it tell excerpts whose mark is on the word the latent fired on from the
same kind of excerpts with the mark moved to a wrong word? Both are balanced accuracies.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bbox_sae.corpus.words import split_words
from bbox_sae.features.rules import normalize_form
from bbox_sae.labeling.records import Context, FeatureExamples


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


def move_mark(ctx: Context, rng: random.Random) -> Context | None:
    """The same excerpt with the mark on another word (not whitespace, not the same form), or None
    when the excerpt has no such word."""
    left, right = split_words(ctx.left), split_words(ctx.right)
    form = normalize_form(ctx.word)
    spots = [("left", i) for i, w in enumerate(left) if w.strip() and normalize_form(w) != form]
    spots += [("right", i) for i, w in enumerate(right) if w.strip() and normalize_form(w) != form]
    if not spots:
        return None
    side, i = rng.choice(spots)
    if side == "left":
        return Context("".join(left[:i]), left[i], "".join(left[i + 1 :]) + ctx.word + ctx.right)
    return Context(ctx.left + ctx.word + "".join(right[:i]), right[i], "".join(right[i + 1 :]))


def fuzz_set(feature: FeatureExamples, n: int, seed: int) -> tuple[list[Context], list[bool]]:
    """Fuzzing examples (delphi): up to `n` holdout positives, every other one with its mark moved to
    a wrong word; truth is True where the mark is where the latent fired. Shuffled the same way on
    every run (stable cache keys)."""
    rng = random.Random(f"fuzz:{seed}:{feature.latent}")
    examples = []
    for i, ctx in enumerate(feature.holdout[:n]):
        moved = move_mark(ctx, rng) if i % 2 else None
        examples.append((moved, False) if moved is not None else (Context(ctx.left, ctx.word, ctx.right), True))
    rng.shuffle(examples)
    return [c for c, _ in examples], [t for _, t in examples]
