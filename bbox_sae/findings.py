"""From kept latents to findings: one difference, however many latents express it.

An SAE often splits one difference over several latents (one per name in "a name after a
dash"). Kept latents of the same compared pair and the same winner join one *finding* when they
share their best context rule (`bbox_sae.rules`) or fire on each other's top words (at least
`overlap` of one latent's holdout top words). A finding's statistics are computed on the union
of its members' top words, and its rule is re-fitted on that union.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from bbox_sae.rules import RuleFit, WordAttributes, best_rule, fit_rule, normalize_form


@dataclass(frozen=True)
class LatentRule:
    train: RuleFit  # chosen on the train top words, precision over train words
    holdout: RuleFit  # the same rule measured on the holdout top words and holdout words


def mine_rule(attrs: WordAttributes, top_train: np.ndarray, top_holdout: np.ndarray, fires: np.ndarray, train_scope: np.ndarray, holdout_scope: np.ndarray, min_share: float) -> LatentRule | None:
    """The best rule on train, and its held-out fit (the label-free coherence measure)."""
    chosen = best_rule(attrs, top_train, fires, train_scope, min_share)
    if chosen is None:
        return None
    return LatentRule(chosen, fit_rule(chosen.rule, attrs, top_holdout, fires, holdout_scope))


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        self.parent[self.find(i)] = self.find(j)


def group_latents(keys: list[tuple], rules: list[str | None], top_holdout: list[np.ndarray], fires: np.ndarray, overlap: float) -> list[list[int]]:
    """Groups of positions into `keys` (pair and winner per kept latent) that express one difference.

    `fires[:, i]` is where latent i fires over all rows; i and j (same key) join when their rule
    descriptions are equal or one fires on at least `overlap` of the other's holdout top words."""
    uf = _UnionFind(len(keys))
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            if keys[i] != keys[j]:
                continue
            same_rule = rules[i] is not None and rules[i] == rules[j]
            cofire = max(
                fires[top_holdout[i], j].mean() if len(top_holdout[i]) else 0.0,
                fires[top_holdout[j], i].mean() if len(top_holdout[j]) else 0.0,
            )
            if same_rule or cofire >= overlap:
                uf.union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(keys)):
        groups.setdefault(uf.find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def top_forms(words: np.ndarray, n: int = 5) -> str:
    forms = Counter(normalize_form(w) for w in words)
    shown = lambda f: f if f.strip() else ("\\n" * f.count("\n") if "\n" in f else "␣")  # noqa: E731
    return " | ".join(f"{shown(w)} ({c})" for w, c in forms.most_common(n))
