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
from bbox_sae.features.rules import Rule, WordAttributes, form_set_value

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


# A topic shows in several of its words ('arms', 'field' and 'colours' in texts that named 'war'),
# each with its cue on too few train words for the sign test: planted "a word's sense by the topic
# of its text" came back at recall 0.15 as pairs. So the forms are chosen on half of train's
# documents and the set is confirmed on the other half: the test that gates it is not the one that
# chose it (on the choosing half, chosen forms pass any sign test). The held-out test stays the finding's.
TOPIC_SCOPES = ("cue_text",)
MIN_TOPIC_FORMS = 2


def search_topic_rules(
    attrs: WordAttributes, train: np.ndarray, holdout: np.ndarray, dlogp: np.ndarray, min_words: int, min_dlogp: float, kind: str = "cue_text"
) -> list[SearchedRule]:
    """Rules of a set of forms with one cue word in the scope `kind` ("'arms', 'field' or
    'colours' with 'war' earlier in the text"). Per cue and winner, the forms whose words with the
    cue pass the effect rule on the choosing documents (even-numbered) while the form there shows at
    most half of it and the cue stands before at most `MAX_CUE_SHARE` of its words; kept when the
    set's words with the cue on the confirming documents (odd) number `min_words`, span
    `MIN_CUE_DOCS` documents, pass the effect rule's median and the sign test (`MAX_CUE_SIGN_P`)."""
    if attrs.doc is None or not len(train):
        return []
    rows, keys = _cue_pairs(attrs, train, kind, any_word=False)
    choosing = attrs.doc[rows] % 2 == 0
    uniq, counts, med = group_medians(keys[choosing], dlogp[rows[choosing]])
    sign = np.where(np.abs(med) > min_dlogp, np.sign(med), 0).astype(int)
    chosen_train = train[attrs.doc[train] % 2 == 0]
    forms, form_counts, form_logp = group_medians(attrs.form[chosen_train].astype(np.int64), dlogp[chosen_train])
    word, cue = np.divmod(uniq, len(attrs.vocab))
    at = np.minimum(np.searchsorted(forms, word), max(len(forms) - 1, 0))  # every pair's form is a chosen train form
    lettered = np.array([any(ch.isalpha() for ch in v[2:]) for v in attrs.vocab], dtype=bool)
    eligible = (counts >= 2) & (sign != 0) & (form_logp[at] * sign < 0.5 * np.abs(med)) & (counts <= MAX_CUE_SHARE * form_counts[at])
    eligible &= lettered[word] & (word != cue)
    # One group per (cue, winner); a pair key names its cue, so it is in at most one group.
    pair_keys = uniq[eligible]
    group_keys, group_of_pair, forms_per_group = np.unique(cue[eligible] * 2 + (sign[eligible] > 0), return_inverse=True, return_counts=True)
    confirm_rows, confirm_keys = rows[~choosing], keys[~choosing]
    hit_at = np.minimum(np.searchsorted(pair_keys, confirm_keys), max(len(pair_keys) - 1, 0))
    hit = pair_keys[hit_at] == confirm_keys if len(pair_keys) else np.zeros(len(confirm_keys), dtype=bool)
    group = group_of_pair[hit_at[hit]]
    groups, n, group_med = group_medians(group, dlogp[confirm_rows[hit]])
    group_sign = np.where(group_keys[groups] % 2 == 1, 1, -1)
    passed = (forms_per_group[groups] >= MIN_TOPIC_FORMS) & (n >= min_words) & (group_med * group_sign > min_dlogp)
    passed &= _documents_per_key(group, attrs.doc[confirm_rows[hit]], groups) >= MIN_CUE_DOCS.get(kind, 1)
    passed &= _sign_test(group, dlogp[confirm_rows[hit]], groups, n, group_sign) < MAX_CUE_SIGN_P[kind]
    out, said = [], set()
    for g, s in zip(groups[passed].tolist(), group_sign[passed].tolist()):
        members = word[eligible][group_of_pair == g]
        set_words = int(form_counts[np.searchsorted(forms, members)].sum())
        more = _more_cues(attrs, rows, keys, choosing, dlogp, members, set_words, lettered, group_keys[g] // 2, s, kind, min_words, min_dlogp)
        cues = [group_keys[g] // 2, *more]
        for c in cues:
            rule = Rule("forms", form_set_value([attrs.vocab[w] for w in members]), kind, attrs.vocab[c])
            if (rule, s) in said:  # two cues' sets of the same forms, each extended by the other's cue
                continue
            said.add((rule, s))
            out.append(SearchedRule(rule, s, train[rule.mask(attrs, train)], holdout[rule.mask(attrs, holdout)]))
    return out


def _more_cues(
    attrs: WordAttributes,
    rows: np.ndarray,
    keys: np.ndarray,
    choosing: np.ndarray,
    dlogp: np.ndarray,
    members: np.ndarray,
    set_words: int,
    lettered: np.ndarray,
    cue: int,
    sign: int,
    kind: str,
    min_words: int,
    min_dlogp: float,
) -> list[int]:
    """The other cues that tell a topic set's forms apart (`search_topic_rules`): a topic is named
    by several words, and each (form, cue) pair alone is too rare to pass. Planted war words came
    back after 'war' alone (recall 0.38), the rest stood after 'soldier', 'wars' or 'soldiers'.
    Pooled over the set's forms, a cue is chosen on the choosing documents (its median beyond the
    effect rule's, before at most `MAX_CUE_SHARE` of those forms' words) and confirmed on the
    others as the set's first cue was. `set_words`: the set's words on the choosing documents; `lettered`: per vocab form, whether it has a letter."""
    word, other = np.divmod(keys, len(attrs.vocab))
    of_set = np.isin(word, members) & (other != cue) & ~np.isin(other, members) & lettered[other]
    if not of_set.any():
        return []
    chosen_cues, counts, med = group_medians(other[of_set & choosing], dlogp[rows[of_set & choosing]])
    wanted = chosen_cues[(counts >= 2) & (med * sign > min_dlogp) & (counts <= MAX_CUE_SHARE * set_words)]
    confirm = of_set & ~choosing & np.isin(other, wanted)
    if not confirm.any():
        return []
    uniq, n, med = group_medians(other[confirm], dlogp[rows[confirm]])
    signs = np.full(len(uniq), sign)
    passed = (n >= min_words) & (med * sign > min_dlogp)
    passed &= _documents_per_key(other[confirm], attrs.doc[rows[confirm]], uniq) >= MIN_CUE_DOCS.get(kind, 1)
    passed &= _sign_test(other[confirm], dlogp[rows[confirm]], uniq, n, signs) < MAX_CUE_SIGN_P[kind]
    return uniq[passed].tolist()


def search_rules(
    attrs: WordAttributes, train: np.ndarray, holdout: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, min_words: int, min_dlogp: float, min_dp: float
) -> list[SearchedRule]:
    """Every rule of `SHAPES` with at least `min_words` train words whose train median passes the
    effect rule, with the sign of that median (log-prob first; Δp when only it passes), and the cue
    rules of every scope (`context.CUE_SCOPES`) whose cue is what differs (`search_cue_rules`), and
    a topic's sets of forms with one cue (`search_topic_rules`)."""
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
    for kind in TOPIC_SCOPES:
        found += search_topic_rules(attrs, train, holdout, dlogp, min_words, min_dlogp, kind)
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
