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
