"""Latent-defined findings: the groups of words a latent carries a difference on, said by their
word forms, chosen on train alone.

A rule of the grammar (`bbox_sae.features.rules`) says one word form or class plus one left context. What
an SAE latent carries is often a group no such rule states: a class of nouns of one kind, words of
one ending after a few function words. Here the latent proposes the group itself:

1. its *carrying* train words: where it fires and the proposing model wins by more than the
   effect threshold;
2. split by context, since one latent often carries several unrelated differences (a latent that
   fires wherever model B wins by a lot): k-means on the words' context embeddings, clusters whose
   centroids are closer than `GROUP_COSINE` joined again (average linkage), so a class the
   k-means cut in pieces is one group and unrelated groups stay apart;
3. a group whose words mostly end alike split into the words of that ending, said by the ending
   (every word of it but the forms train shows the model does not win on), and the rest;
4. each group said by what its words share (`word_sets.WordSet`): the word forms on which the
   proposing model wins on most train occurrences (a form the latent carries only in some
   contexts, 'first' in "FIRST CITIZEN", is not the group's), a suffix nearly all of them end in,
   a left context nearly all of them follow.

The held-out set is every held-out word the WordSet matches: chosen without any held-out Δ, so it
is tested exactly like a rule (Wilcoxon over all of it, one BH family with the rules, the
effect-size rule, the proposing sign), and the statement a reader gets is the set's own definition.

Why forms, not the latent's activation: on the planted corpora a latent's context-only activation
(performance columns at their train mean, or made model-symmetric) and a logistic probe of its
carrying words on context embeddings both blur into neighbouring contexts (planted body-part
words: precision 0.6-0.9, recall 0.2-0.7 per latent), while the forms of its carrying groups give
0.9-1.0 and 0.7-0.99 (docs/findings.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from bbox_sae.features.rules import WordAttributes
from bbox_sae.features.significance import coherence
from bbox_sae.features.word_sets import WordSet, describe_word_set, shared_left, suffix_parts, suffix_word_set

GROUP_COSINE = 0.3  # k-means clusters of one latent's carrying words whose centroids are at least this close are one group
CLUSTER_WORDS = 25  # about this many carrying words per k-means cluster...
MAX_CLUSTERS = 8  # ...and at most this many clusters
FIT_WORDS = 50_000  # context vectors read and clustered at most this many at a time (float64: 150 MB)
FORM_CARRIES = 0.5  # a form belongs to a group when the proposing model wins on at least this share of its train occurrences...
FORM_IN_GROUP = 0.3  # ...and the group holds at least this share of those
# A group without a shared ending is a class only when its words' contexts cohere (mean cosine to
# their centroid): planted classes of nouns 0.44-0.84, the demo's grab-bags of 53-87 forms on
# which one model is better 0.29-0.33; an ending says what the forms share, however their contexts
# vary (passive participles, 0.36) (docs/findings.md).
MIN_COHERENCE = 0.4


@dataclass
class LatentSet:
    """A latent's word set for one compared pair and winner."""

    latent: int
    pair: tuple[str, str]
    sign: int  # +1: model_a better on the latent's carrying train words, -1: model_b
    word_set: WordSet
    train_rows: np.ndarray  # train words the word set matches (where it was chosen)
    holdout_rows: np.ndarray  # held-out words it matches: what is tested


def carrying_rows(fires: np.ndarray, rows: np.ndarray, dlogp: np.ndarray, sign: int, min_abs_dlogp: float) -> np.ndarray:
    """The `rows` where a latent fires and `sign`'s model wins by more than the effect threshold."""
    return rows[fires[rows] & (sign * dlogp[rows] > min_abs_dlogp)]


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _vectors(context: np.ndarray, rows: np.ndarray) -> Iterator[np.ndarray]:
    """The unit context vectors of `rows`, `FIT_WORDS` at a time."""
    for s in range(0, len(rows), FIT_WORDS):
        yield _unit(np.asarray(context[rows[s : s + FIT_WORDS]], dtype=np.float32))


def context_groups(context: np.ndarray, rows: np.ndarray, seed: int) -> np.ndarray:
    """Group labels for `rows` of `context` (their embeddings): k-means (about `CLUSTER_WORDS` rows a
    cluster, at most `MAX_CLUSTERS`), then clusters whose unit centroids have cosine >=
    `GROUP_COSINE` joined by average linkage. Above `FIT_WORDS` rows, k-means is fitted on a seeded
    sample of that many and every row joins its nearest centroid, so a latent that carries a
    difference on a large share of a large corpus costs no more than `FIT_WORDS` rows at a time."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from sklearn.cluster import KMeans

    # Always at least two clusters: a small group can mix two differences as easily as a large one.
    k = min(MAX_CLUSTERS, max(2, len(rows) // CLUSTER_WORDS), len(rows))
    if k < 2:
        return np.zeros(len(rows), dtype=np.int64)
    kmeans = KMeans(k, n_init=3, random_state=seed)
    if len(rows) <= FIT_WORDS:
        unit = _unit(np.asarray(context[rows], dtype=np.float32))
        labels = kmeans.fit(unit).labels_
        centroids = (np.eye(k)[labels].T @ unit) / np.maximum(np.bincount(labels, minlength=k), 1)[:, None]  # an empty cluster: zero
    else:
        sample = np.sort(np.random.default_rng(seed).choice(rows, size=FIT_WORDS, replace=False))
        kmeans.fit(_unit(np.asarray(context[sample], dtype=np.float32)))
        labels = np.empty(len(rows), dtype=np.int64)
        sums = np.zeros((k, context.shape[1]))
        for s, unit in zip(range(0, len(rows), FIT_WORDS), _vectors(context, rows)):
            part = labels[s : s + len(unit)] = kmeans.predict(unit)
            sums += np.eye(k)[part].T @ unit
        centroids = sums / np.maximum(np.bincount(labels, minlength=k), 1)[:, None]
    joined = fcluster(linkage(_cosine_distances(centroids), method="average"), t=1 - GROUP_COSINE, criterion="distance")
    return joined[labels] - 1


def _cosine_distances(centroids: np.ndarray) -> np.ndarray:
    """Condensed cosine distances between centroids, a centroid with no direction (an empty
    cluster, or context vectors that are all zero: `build.output_feature_weight: 1` leaves the
    context part zero) at distance 1 from every other: nothing joins it, where scipy's own cosine
    gave NaN and linkage failed."""
    from scipy.spatial.distance import squareform

    unit = _unit(np.nan_to_num(np.asarray(centroids, dtype=np.float64)))
    distances = np.clip(1.0 - unit @ unit.T, 0.0, 2.0)
    pointless = np.linalg.norm(unit, axis=1) == 0
    distances[pointless, :] = distances[:, pointless] = 1.0
    np.fill_diagonal(distances, 0.0)
    return squareform(distances, checks=False)


def context_coherence(context: np.ndarray, rows: np.ndarray) -> float:
    """`significance.coherence` of the rows' context vectors, read `FIT_WORDS` rows at a time."""
    if len(rows) <= FIT_WORDS:
        return coherence(np.asarray(context[rows], dtype=np.float32))
    centroid = sum(unit.sum(axis=0) for unit in _vectors(context, rows)) / len(rows)
    norm = np.linalg.norm(centroid)
    if norm == 0:
        return 0.0
    return float(sum((unit @ (centroid / norm)).sum() for unit in _vectors(context, rows)) / len(rows))


def form_wins(attrs: WordAttributes, train: np.ndarray, dlogp: np.ndarray, sign: int, min_abs_dlogp: float) -> tuple[np.ndarray, np.ndarray]:
    """(vocab,) each word form's train occurrences, and those on which `sign`'s model wins by more
    than the threshold."""
    size = len(attrs.vocab)
    total = np.bincount(attrs.form[train], minlength=size)
    wins = np.bincount(attrs.form[train], weights=(sign * dlogp[train] > min_abs_dlogp).astype(np.float64), minlength=size)
    return total, wins


def group_forms(attrs: WordAttributes, members: np.ndarray, total: np.ndarray, wins: np.ndarray) -> np.ndarray:
    """The members whose form is the group's: the model wins on at least `FORM_CARRIES` of the
    form's train occurrences, and the group holds at least `FORM_IN_GROUP` of those wins (and two).
    One stray 'three' in a group of body words would otherwise bring every 'three' into it."""
    in_group = np.bincount(attrs.form[members], minlength=len(attrs.vocab))
    own = (wins >= FORM_CARRIES * np.maximum(total, 1)) & (in_group >= np.maximum(2, FORM_IN_GROUP * wins))
    return members[own[attrs.form[members]]]


def without_idle_left(word_set: WordSet, attrs: WordAttributes, train: np.ndarray, dlogp: np.ndarray, sign: int, min_abs_dlogp: float) -> WordSet:
    """The word set without its left context when the model wins on its forms elsewhere too (on at
    least `FORM_CARRIES` of their other train occurrences): most nouns follow a determiner, and a
    class of nouns that differs wherever it stands is not "after a determiner". 'lord' after 'my'
    keeps its 'my' when 'lord' elsewhere does not differ."""
    if word_set.left is None:
        return word_set
    bare = replace(word_set, left=None)
    elsewhere = train[bare.mask(attrs, train) & ~word_set.left.mask(attrs, train)]
    if len(elsewhere) and np.mean(sign * dlogp[elsewhere] > min_abs_dlogp) >= FORM_CARRIES:
        return bare
    return word_set


def latent_sets(
    proposals: list[tuple[int, tuple[str, str], int]],
    fires_of: Callable[[int], np.ndarray],
    context: np.ndarray,
    attrs: WordAttributes,
    train: np.ndarray,
    holdout: np.ndarray,
    dlogp_of: dict[tuple[str, str], np.ndarray],
    in_context_rule: dict[tuple, np.ndarray],
    min_abs_dlogp: float,
    min_words: int,
    seed: int,
) -> list[LatentSet]:
    """The word sets of each proposal (latent, pair, sign): one per context group of its carrying
    train words with at least `min_words` words on forms that carry; a set another proposal (or
    group) already made is made once, with its first latent. Words a proposed rule of a place
    matches (`in_context_rule[(pair, sign)]`, over all rows: any word after a blank line) are left
    to that rule."""
    every_row = np.arange(len(attrs.form))
    wins_of: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    out: list[LatentSet] = []
    seen: set[tuple] = set()
    for latent, pair, sign in proposals:
        carrying = carrying_rows(fires_of(latent), train, dlogp_of[pair], sign, min_abs_dlogp)
        carrying = carrying[~in_context_rule[(pair, sign)][carrying]]
        if len(carrying) < min_words:
            continue
        groups = context_groups(context, carrying, seed + latent)
        for g in np.unique(groups):
            members = carrying[groups == g]
            # Whether a form carries is judged where the group's words stand: 'lord' after 'my' is
            # the group's even though most 'lord' are not after 'my'.
            left = shared_left(attrs, members)
            key = (pair, sign, left)
            if key not in wins_of:
                scope = train if left is None else train[left.mask(attrs, train)]
                wins_of[key] = form_wins(attrs, scope, dlogp_of[pair], sign, min_abs_dlogp)
            for part, suffix in suffix_parts(attrs, members):
                if suffix is None:
                    part = group_forms(attrs, part, *wins_of[key])
                if len(part) < min_words:
                    continue
                described = describe_word_set(attrs, part) if suffix is None else suffix_word_set(attrs, part, suffix, *wins_of[key], FORM_CARRIES)
                word_set = without_idle_left(described, attrs, train, dlogp_of[pair], sign, min_abs_dlogp)
                if word_set.suffix is None and context_coherence(context, part) < MIN_COHERENCE:
                    continue
                # A suffix set is every word of its ending but its exclusions, whichever forms were shown.
                same = (pair, sign, word_set.excluded if word_set.suffix else frozenset(word_set.forms), word_set.suffix, word_set.left)
                if same in seen:
                    continue
                seen.add(same)
                chosen = word_set.mask(attrs, every_row)
                out.append(LatentSet(latent, pair, sign, word_set, train[chosen[train]], holdout[chosen[holdout]]))
    return out
