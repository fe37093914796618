"""What a finding's latent fires on besides its findings' rules, for its label.

A latent that carries a finding is often broader than it ('st' and place names). Its label says
so with rules from the same rule space (`rules.cover_outside`), each true of the latent on the
train split: it fires on at least half of the words the rule matches. Listing any word form seen
among the top contexts would claim too much: a latent that fires on 6% of all 'of' does not
"fire on 'of'", and its validation then fails on the other 94%."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bbox_sae.features import FeatureSource
from bbox_sae.features.rules import Rule, cover_outside
from bbox_sae.labeling.records import train_top_contexts


def train_top_rows(contexts: pa.Table, index: pa.Table) -> dict[int, np.ndarray]:
    """Each latent's train top words (`in_top` rows of contexts.parquet) as matrix rows."""
    keyed = train_top_contexts(contexts).select(["latent", "doc_id", "word_idx"]).join(index.select(["row", "doc_id", "word_idx"]), keys=["doc_id", "word_idx"])
    latents, rows = keyed["latent"].to_numpy(), keyed["row"].to_numpy()
    return {int(latent): np.sort(rows[latents == latent]) for latent in np.unique(latents)}


def broader_rules(src: FeatureSource, contexts: pa.Table, rules_of: dict[int, list[Rule]]) -> dict[int, tuple[Rule, ...]]:
    """For each latent with rules: the rules of what else it fires on (empty when nothing holds)."""
    with_rules = sorted(latent for latent, rules in rules_of.items() if rules)
    if not with_rules:
        return {}
    top = train_top_rows(contexts, src.matrix.index)
    fires = src.fires(with_rules)
    train = src.matrix.rows_by_split["train"]
    return {
        latent: tuple(fit.rule for fit in cover_outside(rules_of[latent], src.attrs, top.get(latent, np.zeros(0, np.int64)), fires[:, j], train))
        for j, latent in enumerate(with_rules)
    }
