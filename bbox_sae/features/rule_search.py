"""Every rule of the grammar, proposed on train without any SAE: the search a sceptical reviewer runs.

The grammar (`rules.Rule`) is small enough to enumerate: a word form alone, a form right after a
form or a class, a form at the start of a line or after a blank line, a class right after a form,
a context attribute (`context.FLAGS`) alone, with a class or with a form, and a form (or any
word) with a cue word before it, shortly before, earlier in its sentence or earlier in the text
(`context.CUE_SCOPES`). Every rule with at least `min_words` train words whose train median passes the effect rule
(|median Δlog p| > `min_dlogp` or |median Δp| > `min_dp`) is proposed with that median's sign,
and then tested like any other candidate. Latents proposed only the rules their top words
suggest, so most of what this search confirms was never tested, and which rules were depended on
the SAE's seed (docs/findings.md). Grouping, sorting and medians are vectorized over row ids: the
search is O(n log n) in the corpus, whatever the number of rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

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
# Scopes searched with any word too ("a word with 'thou' earlier in its sentence": a register);
# a cue shortly before says a few words' worth, and a cue earlier in the text a whole text's.
ANY_WORD_SCOPES = ("cue_sentence",)
# A cue earlier in the sentence or the text is read in at least this many documents: a form's
# words of one or two texts are that text's, not a register's or a topic's. Each word has about 14
# forms earlier in its sentence and 38 topic words earlier in its text (planted Shakespeare), so
# without it these scopes proposed thousands of rules of one text each, every one a test.
MIN_CUE_DOCS = {"cue_sentence": 3, "cue_text": 3}
# And its winner wins on most of its train words: a one-sided sign test on train below this. The
# demo's real Δ vary by nats from word to word, and of its 2,600 sentence and text cue rules whose
# train median passed, 103 pass this; every planted cue difference kept its rules (docs/findings.md).
MAX_CUE_SIGN_P = {"cue_sentence": 1e-3, "cue_text": 1e-3}


def _cue_pairs(attrs: WordAttributes, rows: np.ndarray, kind: str, any_word: bool) -> tuple[np.ndarray, np.ndarray]:
    """(row, key) for every row and every form in its `kind` cue window (the word right before
    too, as `Rule.mask` reads a cue): key = word form x vocabulary + cue form, or the cue form
    alone when `any_word`."""
    window = attrs.window(kind)[rows]
    at = np.nonzero(window >= 0)
    word = np.zeros(len(at[0]), dtype=np.int64) if any_word else attrs.form[rows][at[0]].astype(np.int64)
    return rows[at[0]], word * len(attrs.vocab) + window[at]


def _documents_per_key(keys: np.ndarray, docs: np.ndarray, uniq: np.ndarray) -> np.ndarray:
    """Per key of `uniq` (sorted, every key among `keys`), how many documents its rows span."""
    n_docs = int(docs.max()) + 1 if len(docs) else 1
    pairs = np.unique(keys * n_docs + docs)  # keys < vocabulary², far below 2**63 / documents
    return np.bincount(np.searchsorted(uniq, pairs // n_docs), minlength=len(uniq))


def _sign_test(keys: np.ndarray, dlogp: np.ndarray, uniq: np.ndarray, counts: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Per key of `uniq`, the one-sided sign test's p that its words favour `sign`'s model no more
    often than not (ties count against)."""
    at = np.searchsorted(uniq, keys)
    wins = np.where(sign > 0, np.bincount(at, weights=dlogp > 0, minlength=len(uniq)), np.bincount(at, weights=dlogp < 0, minlength=len(uniq)))
    return binom.sf(wins - 1, counts, 0.5)


def search_cue_rules(
    attrs: WordAttributes,
    train: np.ndarray,
    holdout: np.ndarray,
    dlogp: np.ndarray,
    dp: np.ndarray,
    min_words: int,
    min_dlogp: float,
    min_dp: float,
    kind: str = "cue",
    any_word: bool = False,
) -> list[SearchedRule]:
    """Rules of a form (or, `any_word`, of any word) with a cue word before it in the scope `kind`
    ("'were' with 'if' among the 8 words before"), only where the cue is what differs: the form's
    words (all words) together do not pass half the effect rule in that direction. A form that
    differs everywhere has a cue rule for every common word near it, each saying less than the
    form alone; a difference only a cue shows has none."""
    rows, keys = _cue_pairs(attrs, train, kind, any_word)
    uniq, counts, med_logp = group_medians(keys, dlogp[rows])
    _, _, med_p = group_medians(keys, dp[rows])
    sign = np.where(np.abs(med_logp) > min_dlogp, np.sign(med_logp), np.where(np.abs(med_p) > min_dp, np.sign(med_p), 0)).astype(int)
    word_of_train = np.zeros(len(train), dtype=np.int64) if any_word else attrs.form[train].astype(np.int64)
    forms, form_counts, form_logp = group_medians(word_of_train, dlogp[train])
    form_of_key = uniq // len(attrs.vocab)
    at = np.minimum(np.searchsorted(forms, form_of_key), max(len(forms) - 1, 0))
    everywhere = np.where(forms[at] == form_of_key, form_logp[at], 0.0) * sign
    # A cue before most of a form's words names no condition ('the' stands near nearly every word).
    condition = counts <= MAX_CUE_SHARE * form_counts[at]
    chosen = (counts >= min_words) & (sign != 0) & (everywhere < 0.5 * np.abs(med_logp)) & condition
    if kind in MIN_CUE_DOCS and attrs.doc is not None:
        chosen &= _documents_per_key(keys, attrs.doc[rows], uniq) >= MIN_CUE_DOCS[kind]
    if kind in MAX_CUE_SIGN_P:
        chosen &= _sign_test(keys, dlogp[rows], uniq, counts, sign) < MAX_CUE_SIGN_P[kind]
    wanted, signs = uniq[chosen], sign[chosen]
    train_of = _rows_by_key(keys, rows, wanted)
    holdout_rows, holdout_keys = _cue_pairs(attrs, holdout, kind, any_word)
    holdout_of = _rows_by_key(holdout_keys, holdout_rows, wanted)
    empty = np.zeros(0, dtype=train.dtype)
    out = []
    for key, s in zip(wanted.tolist(), signs.tolist()):
        word, cue = divmod(key, len(attrs.vocab))
        rule = Rule(None if any_word else "form", None if any_word else attrs.vocab[word], kind, attrs.vocab[cue])
        out.append(SearchedRule(rule, s, train_of[key], holdout_of.get(key, empty)))
    return out


def search_rules(
    attrs: WordAttributes, train: np.ndarray, holdout: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, min_words: int, min_dlogp: float, min_dp: float
) -> list[SearchedRule]:
    """Every rule of `SHAPES` with at least `min_words` train words whose train median passes the
    effect rule, with the sign of that median (log-prob first; Δp when only it passes), and the cue
    rules of every scope (`context.CUE_SCOPES`) whose cue is what differs (`search_cue_rules`)."""
    dlogp = lp_a - lp_b
    dp = np.exp(lp_a) - np.exp(lp_b)
    found: list[SearchedRule] = []
    for scope in context.CUE_SCOPES:
        if scope.kind not in ANY_WORD_SCOPES:
            found += search_cue_rules(attrs, train, holdout, dlogp, dp, min_words, min_dlogp, min_dp, scope.kind)
            continue
        # A form after a cue that every word after it shows is that difference's fragment: planted
        # "every word of a sentence once it said 'thou'" came back as 1,300 forms each after 'thou'.
        any_word = search_cue_rules(attrs, train, holdout, dlogp, dp, min_words, min_dlogp, min_dp, scope.kind, any_word=True)
        said = {(f.rule.left_value, f.sign) for f in any_word}
        forms = search_cue_rules(attrs, train, holdout, dlogp, dp, min_words, min_dlogp, min_dp, scope.kind)
        found += any_word + [f for f in forms if (f.rule.left_value, f.sign) not in said]
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
