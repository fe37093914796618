"""Words where a latent is inactive, drawn by the label stage.

`negative`: for validation, holdout words, half of them with the latent's own top word forms (so
a label that only names the word fails on them), half random. `contrast`: for the LLM labeler's
prompt (delphi's contrastive explainer), train words of those same forms only.

A latent in a finding is labeled with the finding's rule, which describes every member; so its
negatives are words where no member fires. Otherwise a word a sibling latent took over (one
member per name, say) would count against a label that correctly covers it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from bbox_sae.features import Encoder, FeatureSource, contexts_table, encode_rows
from bbox_sae.features.rules import normalize_form
from bbox_sae.labeling.records import train_top_contexts


def latent_forms(contexts: pa.Table, latents: list[int]) -> dict[int, set[str]]:
    """Each latent's train top word forms (`in_top` rows of contexts.parquet), by latent order."""
    top = train_top_contexts(contexts)
    forms: dict[int, set[str]] = {latent: set() for latent in sorted(latents)}
    for latent, word in zip(top["latent"].to_pylist(), top["word"].to_pylist()):
        if latent in forms:
            forms[latent].add(normalize_form(word or ""))
    return forms


def finding_members(findings: pa.Table | None, latents: list[int]) -> dict[int, list[int]]:
    """Each latent with the members of every finding it belongs to (itself alone when in none)."""
    members = {latent: {latent} for latent in latents}
    for group in findings["latents"].to_pylist() if findings is not None else []:
        ids = [int(x) for x in group.split(",") if x]
        for latent in ids:
            if latent in members:
                members[latent].update(ids)
    return {latent: sorted(ids) for latent, ids in members.items()}


def negative_rows(
    encode: Encoder,
    matrix: np.ndarray,
    forms_of: dict[int, set[str]],
    pool: np.ndarray,
    pool_forms: np.ndarray,
    n: int,
    seed: int,
    chunk_rows: int,
    same_only: bool = False,
    members_of: dict[int, list[int]] | None = None,
) -> dict[int, np.ndarray]:
    """Per latent: up to `n` rows of `pool` (sorted) where it (and every latent in `members_of[latent]`)
    is inactive, half with its forms and half random, or (`same_only`) all with its forms."""
    members_of = members_of or {}
    rng = np.random.default_rng(seed)
    # Forms as integer codes, once: matching a latent's forms is then an integer scan of the pool,
    # not a comparison of every pool word's string with each form.
    code_of: dict[str, int] = {}
    pool_codes = np.array([code_of.setdefault(f, len(code_of)) for f in pool_forms.tolist()], dtype=np.int64)
    wanted = {latent: np.array([code_of[f] for f in forms if f in code_of], dtype=np.int64) for latent, forms in forms_of.items()}
    candidates: dict[int, np.ndarray] = {}
    for latent in forms_of:
        same = pool[np.isin(pool_codes, wanted[latent])]
        same = rng.choice(same, size=min(len(same), 4 * n), replace=False) if len(same) else same
        rand = rng.choice(pool, size=0 if same_only else min(len(pool), 4 * n), replace=False)
        candidates[latent] = np.unique(np.concatenate([same, rand]).astype(np.int64))
    if not candidates:
        return {}
    all_rows = np.unique(np.concatenate(list(candidates.values())))
    acts = torch.cat([a for _, a in encode_rows(encode, matrix, all_rows, chunk_rows)])
    position = {r: i for i, r in enumerate(all_rows.tolist())}
    out = {}
    for latent, rows in candidates.items():
        group = members_of.get(latent, [latent])
        at = torch.as_tensor([position[r] for r in rows.tolist()], dtype=torch.long)
        inactive = rows[(acts[at][:, group] <= 0).all(dim=1).numpy()]
        is_same = np.isin(pool_codes[np.searchsorted(pool, inactive)], wanted[latent])
        same, other = inactive[is_same], inactive[~is_same]
        pick_same = rng.permutation(same)[: n if same_only else n // 2]
        pick_other = rng.permutation(other)[: n - len(pick_same)]
        out[latent] = np.concatenate([pick_same, pick_other])
    return out


def draw_negatives(src: FeatureSource, forms_of: dict[int, set[str]], contrast: int = 0, members_of: dict[int, list[int]] | None = None) -> pa.Table:
    """contexts.parquet-shaped rows (split `negative`, and `contrast` when `contrast` > 0) for the
    latents in `forms_of`, encoded by the features stage's encoder (`src`); `members_of`
    (`finding_members`) widens "inactive" to a latent's whole findings."""
    cfg, m = src.cfg, src.matrix
    examples = []
    if forms_of:
        draws = [("negative", "holdout", cfg.label.validation_examples, cfg.seed, False), ("contrast", "train", contrast, cfg.seed + 1, True)]
        for split, pool_split, n, seed, same_only in draws:
            pool = m.rows_by_split[pool_split]
            if not (n and len(pool)):
                continue
            forms = np.array([normalize_form(w) for w in src.words_of_row[pool]], dtype=object)
            rows = negative_rows(src.encode, m.values, forms_of, pool, forms, n, seed, cfg.features.chunk_rows, same_only, members_of)
            examples += [(latent, split, rank, int(r), 0.0, False) for latent, picked in rows.items() for rank, r in enumerate(picked)]
    return contexts_table(cfg, examples, m.index, m.models)
