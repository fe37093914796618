"""Evidence counted once: a word whose context is identical to an earlier word's adds nothing.

The demo's passages open on '[' ten times with the same Δ (−4.056) to the last bit: the same
context scored the same way by both models. Counted ten times, the test and the bootstrap took one
observation for ten. Two words are one observation when they are the same form after the same two
words and every model gives each the bit-identical log-prob: two causal LMs assigning the same
floats to different contexts does not happen, so this merges only repeated contexts (a stage
direction, a refrain, a boilerplate line), and only their repeats, never the first.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bbox_sae.features.context import FLAGS
from bbox_sae.features.rules import WordAttributes


def first_of_identical_contexts(attrs: WordAttributes, lp_by_row: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per row, whether it is the first (lowest row id) of the rows sharing its form, its two
    words before and every model's log-prob, bit for bit."""
    if len(attrs.form) == 0:
        return np.zeros(0, dtype=bool)
    columns = [attrs.form, attrs.left_form, attrs.left2_form]
    columns += [np.ascontiguousarray(lp_by_row[m], dtype=np.float64).view(np.int64) for m in sorted(lp_by_row)]
    keys = np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1)
    _, first = np.unique(keys, axis=0, return_index=True)
    out = np.zeros(len(keys), dtype=bool)
    out[first] = True
    return out


def counted_once(rows_by_split: Mapping[str, np.ndarray], first: np.ndarray) -> dict[str, np.ndarray]:
    """Each split's rows without the repeats of an identical context, wherever its first stands:
    a repeat in the held-out half of a train word would test the word it was chosen on."""
    return {split: rows[first[rows]] for split, rows in rows_by_split.items()}


# What a finding can rest on that says more about how the corpus was prepared than about the
# models: each a test of one held-out word, and what the report says of a finding most of whose
# words pass it.
MARKUP_CHARS = frozenset("[]{}<>#*|=_~`\\")
ARTIFACTS = {
    "document start": "rests on where documents start (no left context; in a corpus cut into passages, where it was cut)",
    "layout": "rests on whitespace (line breaks, blank lines, runs of spaces)",
    "markup": "rests on markup (brackets, stage-direction or format marks)",
}
LAYOUT_CLASSES = ("c:space", "c:newline", "c:blank")


def is_markup(form: str) -> bool:
    """A mark with no letter or digit that holds a markup character: '[', '.]', '**', '<'."""
    text = form.removeprefix("f:")
    return bool(text) and not any(ch.isalnum() for ch in text) and any(ch in MARKUP_CHARS for ch in text)


def artifact_of(attrs: WordAttributes, rows: np.ndarray, share: float = 0.5) -> str | None:
    """The artifact (a key of `ARTIFACTS`) that at least `share` of a finding's held-out words rest
    on, the most common first; None when none does."""
    if len(rows) == 0:
        return None
    vocab = attrs.vocab
    layout_codes = [attrs.code[c] for c in LAYOUT_CLASSES if c in attrs.code]
    markup_codes = [i for i, v in enumerate(vocab) if v.startswith("f:") and is_markup(v)]
    shares = {
        "document start": float(attrs.context[rows, FLAGS.index("doc_opening")].mean()),
        "layout": float(np.isin(attrs.cls[rows], layout_codes).mean()),
        "markup": float(np.isin(attrs.form[rows], markup_codes).mean()),
    }
    name, most = max(shares.items(), key=lambda kv: kv[1])
    return name if most >= share else None
