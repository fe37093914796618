"""Arrow schemas of the run's tables, next to `layout` which says where each one lives.

Writers build their tables with these schemas, so a reader (or a user's own tool) can rely on
the column types documented in docs/artifacts.md. Tables that carry one column per model take
the model names and name those columns with `layout.logprob_column`.
"""

from __future__ import annotations

import pyarrow as pa

from bbox_sae.layout import logprob_column

# documents.parquet
DOCUMENTS_SCHEMA = pa.schema(
    [("doc_id", pa.string()), ("text", pa.string()), ("split", pa.string()), ("domain", pa.string()), ("shard", pa.int32())]
)

# words/ (sharded)
WORDS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("word_idx", pa.int32()),
        ("char_start", pa.int64()),
        ("char_end", pa.int64()),
        ("word", pa.string()),
        ("split", pa.string()),
        ("domain", pa.string()),
    ]
)

# top_activations.parquet: one row per (latent, split, rank).
TOP_ACTIVATIONS_SCHEMA = pa.schema(
    [
        ("latent", pa.int32()),
        ("split", pa.string()),
        ("rank", pa.int32()),
        ("doc_id", pa.string()),
        ("word_idx", pa.int32()),
        ("row", pa.int64()),
        ("activation", pa.float32()),
    ]
)


def _logprob_fields(models: list[str]) -> list[tuple[str, pa.DataType]]:
    return [(logprob_column(m), pa.float64()) for m in models]


def index_schema(models: list[str]) -> pa.Schema:
    """build/index.parquet: one row per row of the matrix, with every model's log-prob of its word."""
    return pa.schema(
        [("row", pa.int64()), ("doc_id", pa.string()), ("word_idx", pa.int32()), ("split", pa.string())] + _logprob_fields(models)
    )


def contexts_schema(models: list[str]) -> pa.Schema:
    """contexts.parquet: one row per example shown to people and labelers."""
    return pa.schema(
        [
            ("latent", pa.int32()),
            ("split", pa.string()),
            ("rank", pa.int32()),
            ("doc_id", pa.string()),
            ("word_idx", pa.int32()),
            ("activation", pa.float32()),
            ("in_top", pa.bool_()),
            ("left", pa.string()),
            ("word", pa.string()),
            ("right", pa.string()),
        ]
        + _logprob_fields(models)
    )


# logprobs/<model>/ (sharded), and a `source: parquet` model's file
LOGPROB_SCHEMA = pa.schema([("doc_id", pa.string()), ("word_idx", pa.int32()), ("logprob", pa.float64())])

# features.parquet: one row per (latent, pair)
FEATURE_SCHEMA = pa.schema(
    [
        ("latent", pa.int32()),
        ("model_a", pa.string()),
        ("model_b", pa.string()),
        ("n_top", pa.int32()),
        ("density", pa.float64()),
        ("max_activation", pa.float64()),
        ("median_dlogp", pa.float64()),
        ("mean_dlogp", pa.float64()),
        ("median_dp", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("consistency", pa.float64()),
        ("p_value", pa.float64()),
        ("q_value", pa.float64()),
        ("coherence", pa.float64()),
        ("holdout_n", pa.int32()),
        ("holdout_median_dlogp", pa.float64()),
        ("holdout_mean_dlogp", pa.float64()),
        ("holdout_median_dp", pa.float64()),
        ("holdout_ci_low", pa.float64()),
        ("holdout_ci_high", pa.float64()),
        ("holdout_p_value", pa.float64()),
        ("generalizes", pa.bool_()),
        ("paper_rule", pa.bool_()),
        ("passes_delta", pa.bool_()),
        ("rule", pa.string()),
        ("rule_json", pa.string()),
        ("rule_precision", pa.float64()),
        ("rule_recall", pa.float64()),
        ("rule_f1", pa.float64()),
        ("kept", pa.bool_()),
        ("finding", pa.int32()),
        ("findings", pa.string()),
        ("better_model", pa.string()),
        ("top_words", pa.string()),
        ("source", pa.string()),
    ]
)

# rules.parquet: one row per tested candidate finding, a rule or a latent's word set (`kind`)
TESTED_RULE_SCHEMA = pa.schema(
    [
        ("model_a", pa.string()), ("model_b", pa.string()), ("better_model", pa.string()), ("kind", pa.string()), ("rule", pa.string()),
        ("rule_json", pa.string()), ("statement", pa.string()), ("latents", pa.string()), ("proposer", pa.string()), ("n_train", pa.int32()), ("median_dlogp", pa.float64()),
        ("holdout_n", pa.int32()), ("holdout_median_dlogp", pa.float64()), ("holdout_median_dp", pa.float64()),
        ("holdout_p_value", pa.float64()), ("q_value", pa.float64()), ("passed", pa.bool_()),
    ]
)

# findings.parquet: one row per finding
FINDING_SCHEMA = pa.schema(
    [
        ("finding", pa.int32()), ("model_a", pa.string()), ("model_b", pa.string()), ("better_model", pa.string()),
        ("latents", pa.string()), ("n_latents", pa.int32()), ("proposer", pa.string()), ("n_units", pa.int32()), ("q_value", pa.float64()), ("n_top", pa.int32()), ("holdout_n", pa.int32()),
        ("median_dlogp", pa.float64()), ("mean_dlogp", pa.float64()), ("median_dp", pa.float64()),
        ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("consistency", pa.float64()),
        ("holdout_median_dlogp", pa.float64()), ("holdout_ci_low", pa.float64()), ("holdout_ci_high", pa.float64()),
        ("holdout_p_value", pa.float64()), ("rule", pa.string()), ("rule_json", pa.string()),
        ("rule_precision", pa.float64()), ("rule_recall", pa.float64()), ("rule_f1", pa.float64()), ("top_words", pa.string()),
        ("kind", pa.string()), ("statement", pa.string()), ("word_set_json", pa.string()), ("single_rule", pa.bool_()),
    ]
)

# finding_words.parquet: one row per (finding, word it covers)
FINDING_WORDS_SCHEMA = pa.schema(
    [("finding", pa.int32()), ("split", pa.string()), ("row", pa.int64()), ("doc_id", pa.string()), ("word_idx", pa.int32())]
)


def latent_ids(latents: str | None) -> list[int]:
    """The latents of a `latents` column ("3,17"); a finding the rule search alone found has none ("")."""
    return [int(x) for x in latents.split(",") if x] if latents else []
