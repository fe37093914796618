"""Every rule of the grammar, proposed on train without any SAE: the search a sceptical reviewer runs.

The grammar (`rules.Rule`) is small enough to enumerate: a word form alone, a form right after a
form or a class, a form at the start of a line or after a blank line, a class right after a form,
and a context attribute (`context.FLAGS`) alone, with a class or with a form. Every rule with at least `min_words` train words whose train median passes the effect rule
(|median Δlog p| > `min_dlogp` or |median Δp| > `min_dp`) is proposed with that median's sign,
and then tested like any other candidate. Latents proposed only the rules their top words
suggest, so most of what this search confirms was never tested, and which rules were depended on
the SAE's seed (docs/findings.md). Grouping, sorting and medians are vectorized over row ids: the
search is O(n log n) in the corpus, whatever the number of rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bbox_sae.features import context
from bbox_sae.features.rules import Rule, WordAttributes

# (word part, left part) of each searched shape; a left part is a column of WordAttributes, a
# layout flag or a context flag (`context.FLAGS`). Not searched: a class alone or after a class (a
# class of every capitalised word is no finding a reader acts on, and latents still propose such
# rules), nor 'form2'. A context flag is searched alone ("a word inside brackets"), with a class
# and with a form ("'?' (question mark) in a sentence that began with a wh-word").
LAYOUTS = ("line_start", "after_blank")
SHAPES = (
    ("form", None),
    ("form", "form"),
    ("form", "class"),
    *(("form", layout) for layout in LAYOUTS),
    ("class", "form"),
    *((None, flag) for flag in context.ALONE),
    *(("class", flag) for flag in context.ALONE),
    *(("form", flag) for flag in context.WITH_FORM),
)


@dataclass(frozen=True)
class SearchedRule:
    rule: Rule
    sign: int  # +1: model A's median is ahead on its train words, -1: model B's
    train_rows: np.ndarray  # ascending
    holdout_rows: np.ndarray  # ascending: every held-out word the rule covers


def _keys(attrs: WordAttributes, shape: tuple[str, str | None], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows in scope of a shape (layout shapes: only rows in that layout) and one int64 key per
    row naming its (word value, left value)."""
    word_kind, left_kind = shape
    word = np.zeros(len(rows), dtype=np.int64) if word_kind is None else (attrs.form if word_kind == "form" else attrs.cls)[rows].astype(np.int64)
    if left_kind is None:
        return rows, word
    if left_kind in LAYOUTS or left_kind in context.FLAGS:
        flag = (
            attrs.context[:, context.FLAGS.index(left_kind)]
            if left_kind in context.FLAGS
            else attrs.line_start
            if left_kind == "line_start"
            else attrs.after_blank
        )
        inside = flag[rows]
        if left_kind in context.COMPLEMENTS:
            inside &= attrs.cls[rows] == attrs.code.get("c:punctuation", -1)
        return rows[inside], word[inside]
    left = (attrs.left_form if left_kind == "form" else attrs.left_cls)[rows].astype(np.int64)
    return rows, word * len(attrs.vocab) + left


def _rule(attrs: WordAttributes, shape: tuple[str, str | None], key: int) -> Rule:
    word_kind, left_kind = shape
    if left_kind is None:
        return Rule(word_kind, attrs.vocab[key])
    if left_kind in context.FLAGS:
        return Rule(word_kind, attrs.vocab[key] if word_kind else None, "context", left_kind)
    if left_kind in LAYOUTS:
        return Rule(word_kind, attrs.vocab[key], "layout", left_kind)
    word, left = divmod(key, len(attrs.vocab))
    return Rule(word_kind, attrs.vocab[word], left_kind, attrs.vocab[left])


def group_medians(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique keys, counts, the median of `values` per key), as `np.median` computes each."""
    order = np.lexsort((values, keys))
    sorted_keys, sorted_values = keys[order], values[order]
    uniq, starts, counts = np.unique(sorted_keys, return_index=True, return_counts=True)
    low, high = sorted_values[starts + (counts - 1) // 2], sorted_values[starts + counts // 2]
    return uniq, counts, (low + high) / 2


def _rows_by_key(keys: np.ndarray, rows: np.ndarray, wanted: np.ndarray) -> dict[int, np.ndarray]:
    """For each key of `wanted` (sorted), the rows carrying it, ascending."""
    at = np.minimum(np.searchsorted(wanted, keys), max(len(wanted) - 1, 0))
    hit = wanted[at] == keys if len(wanted) else np.zeros(len(keys), dtype=bool)
    keys, rows = keys[hit], rows[hit]
    order = np.argsort(keys, kind="stable")  # rows arrive ascending, and a stable sort keeps them so
    keys, rows = keys[order], rows[order]
    uniq, starts = np.unique(keys, return_index=True)
    return {int(k): part for k, part in zip(uniq, np.split(rows, starts[1:]))} if len(uniq) else {}


MAX_CUE_SHARE = 0.5  # of a form's train words, the most a cue may stand before


def _cue_pairs(attrs: WordAttributes, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, key) for every row and every form in its cue window (the word right before too, as
    `Rule.mask` reads a cue): key = word form x vocabulary + cue form."""
    window = attrs.window[rows]
    at = np.nonzero(window >= 0)
    return rows[at[0]], attrs.form[rows][at[0]].astype(np.int64) * len(attrs.vocab) + window[at]


def search_cue_rules(
    attrs: WordAttributes, train: np.ndarray, holdout: np.ndarray, dlogp: np.ndarray, dp: np.ndarray, min_words: int, min_dlogp: float, min_dp: float
) -> list[SearchedRule]:
    """Rules of a form with a cue word shortly before ("'were' with 'if' among the 8 words before"),
    only where the cue is what differs: the form's words all together do not pass half the effect
    rule in that direction. A form that differs everywhere has a cue rule for every common word
    near it, each saying less than the form alone; a difference only a cue shows has none."""
    rows, keys = _cue_pairs(attrs, train)
    uniq, counts, med_logp = group_medians(keys, dlogp[rows])
    _, _, med_p = group_medians(keys, dp[rows])
    sign = np.where(np.abs(med_logp) > min_dlogp, np.sign(med_logp), np.where(np.abs(med_p) > min_dp, np.sign(med_p), 0)).astype(int)
    forms, form_counts, form_logp = group_medians(attrs.form[train].astype(np.int64), dlogp[train])
    form_of_key = uniq // len(attrs.vocab)
    at = np.minimum(np.searchsorted(forms, form_of_key), max(len(forms) - 1, 0))
    everywhere = np.where(forms[at] == form_of_key, form_logp[at], 0.0) * sign
    # A cue before most of a form's words names no condition ('the' stands near nearly every word).
    condition = counts <= MAX_CUE_SHARE * form_counts[at]
    chosen = (counts >= min_words) & (sign != 0) & (everywhere < 0.5 * np.abs(med_logp)) & condition
    wanted, signs = uniq[chosen], sign[chosen]
    train_of = _rows_by_key(keys, rows, wanted)
    holdout_rows, holdout_keys = _cue_pairs(attrs, holdout)
    holdout_of = _rows_by_key(holdout_keys, holdout_rows, wanted)
    empty = np.zeros(0, dtype=train.dtype)
    out = []
    for key, s in zip(wanted.tolist(), signs.tolist()):
        word, cue = divmod(key, len(attrs.vocab))
        out.append(SearchedRule(Rule("form", attrs.vocab[word], "cue", attrs.vocab[cue]), s, train_of[key], holdout_of.get(key, empty)))
    return out


def search_rules(
    attrs: WordAttributes, train: np.ndarray, holdout: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, min_words: int, min_dlogp: float, min_dp: float
) -> list[SearchedRule]:
    """Every rule of `SHAPES` with at least `min_words` train words whose train median passes the
    effect rule, with the sign of that median (log-prob first; Δp when only it passes), and the cue
    rules whose cue is what differs (`search_cue_rules`)."""
    dlogp = lp_a - lp_b
    dp = np.exp(lp_a) - np.exp(lp_b)
    found: list[SearchedRule] = []
    found += search_cue_rules(attrs, train, holdout, dlogp, dp, min_words, min_dlogp, min_dp)
    for shape in SHAPES:
        rows, keys = _keys(attrs, shape, train)
        uniq, counts, med_logp = group_medians(keys, dlogp[rows])
        _, _, med_p = group_medians(keys, dp[rows])
        sign = np.where(np.abs(med_logp) > min_dlogp, np.sign(med_logp), np.where(np.abs(med_p) > min_dp, np.sign(med_p), 0)).astype(int)
        chosen = (counts >= min_words) & (sign != 0)
        wanted, signs = uniq[chosen], sign[chosen]
        train_of = _rows_by_key(keys, rows, wanted)
        holdout_rows, holdout_keys = _keys(attrs, shape, holdout)
        holdout_of = _rows_by_key(holdout_keys, holdout_rows, wanted)
        empty = np.zeros(0, dtype=train.dtype)
        for key, s in zip(wanted.tolist(), signs.tolist()):
            found.append(SearchedRule(_rule(attrs, shape, key), s, train_of[key], holdout_of.get(key, empty)))
    return found
