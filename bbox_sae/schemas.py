"""Arrow schemas of the run's tables, next to `layout` which says where each one lives.

Writers build their tables with these schemas, so a reader (or a user's own tool) can rely on
the column types documented in docs/artifacts.md. Tables that carry one column per model take
the model names and name those columns with `layout.logprob_column`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import pyarrow as pa

from bbox_sae.layout import logprob_column


def column(arrow_type: pa.DataType):
    """A field of a record that is a column of its table, of `arrow_type` (null where not given)."""
    return field(default=None, metadata={"arrow": arrow_type})


def record_schema(record: type) -> pa.Schema:
    """The table of `record`s: one column per field, in the fields' order."""
    return pa.schema([(f.name, f.metadata["arrow"]) for f in fields(record)])


def records_table(rows: Sequence, record: type) -> pa.Table:
    """The table of `rows`, each a `record` or a mapping of its fields: a field the record does not
    have is an error, not a column quietly left out."""
    return pa.Table.from_pylist([asdict(r) if isinstance(r, record) else asdict(record(**r)) for r in rows], schema=record_schema(record))


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
# What a model scored in process expected most at each word's first token (`ModelConfig.alternatives`):
# token texts and their log-probs, most likely first; null where no token begins in the word.
LOGPROB_ALTERNATIVES_SCHEMA = pa.schema([*LOGPROB_SCHEMA, ("top_tokens", pa.list_(pa.string())), ("top_logprobs", pa.list_(pa.float32()))])

@dataclass(frozen=True)
class FeatureRecord:
    """features.parquet: one row per (latent, pair)."""

    latent: int | None = column(pa.int32())
    model_a: str | None = column(pa.string())
    model_b: str | None = column(pa.string())
    n_top: int | None = column(pa.int32())
    density: float | None = column(pa.float64())
    max_activation: float | None = column(pa.float64())
    median_dlogp: float | None = column(pa.float64())
    mean_dlogp: float | None = column(pa.float64())
    median_dp: float | None = column(pa.float64())
    ci_low: float | None = column(pa.float64())
    ci_high: float | None = column(pa.float64())
    consistency: float | None = column(pa.float64())
    p_value: float | None = column(pa.float64())
    q_value: float | None = column(pa.float64())
    coherence: float | None = column(pa.float64())
    holdout_n: int | None = column(pa.int32())
    holdout_median_dlogp: float | None = column(pa.float64())
    holdout_mean_dlogp: float | None = column(pa.float64())
    holdout_median_dp: float | None = column(pa.float64())
    holdout_ci_low: float | None = column(pa.float64())
    holdout_ci_high: float | None = column(pa.float64())
    holdout_p_value: float | None = column(pa.float64())
    generalizes: bool | None = column(pa.bool_())
    paper_rule: bool | None = column(pa.bool_())
    passes_delta: bool | None = column(pa.bool_())
    rule: str | None = column(pa.string())
    rule_json: str | None = column(pa.string())
    rule_precision: float | None = column(pa.float64())
    rule_recall: float | None = column(pa.float64())
    rule_f1: float | None = column(pa.float64())
    kept: bool | None = column(pa.bool_())
    finding: int | None = column(pa.int32())
    findings: str | None = column(pa.string())
    better_model: str | None = column(pa.string())
    top_words: str | None = column(pa.string())
    source: str | None = column(pa.string())


FEATURE_SCHEMA = record_schema(FeatureRecord)

@dataclass(frozen=True)
class TestedRuleRecord:
    """rules.parquet: one row per tested candidate finding, a rule or a latent's word set (`kind`)."""

    model_a: str | None = column(pa.string())
    model_b: str | None = column(pa.string())
    better_model: str | None = column(pa.string())
    kind: str | None = column(pa.string())
    rule: str | None = column(pa.string())
    rule_json: str | None = column(pa.string())
    statement: str | None = column(pa.string())
    latents: str | None = column(pa.string())
    proposer: str | None = column(pa.string())
    n_train: int | None = column(pa.int32())
    median_dlogp: float | None = column(pa.float64())
    holdout_n: int | None = column(pa.int32())
    holdout_median_dlogp: float | None = column(pa.float64())
    holdout_median_dp: float | None = column(pa.float64())
    holdout_p_value: float | None = column(pa.float64())
    q_value: float | None = column(pa.float64())
    passed: bool | None = column(pa.bool_())


TESTED_RULE_SCHEMA = record_schema(TestedRuleRecord)

@dataclass(frozen=True)
class FindingRecord:
    """findings.parquet: one row per finding."""

    finding: int | None = column(pa.int32())
    model_a: str | None = column(pa.string())
    model_b: str | None = column(pa.string())
    better_model: str | None = column(pa.string())
    latents: str | None = column(pa.string())
    n_latents: int | None = column(pa.int32())
    proposer: str | None = column(pa.string())
    n_units: int | None = column(pa.int32())
    q_value: float | None = column(pa.float64())
    n_top: int | None = column(pa.int32())
    holdout_n: int | None = column(pa.int32())
    median_dlogp: float | None = column(pa.float64())
    mean_dlogp: float | None = column(pa.float64())
    median_dp: float | None = column(pa.float64())
    ci_low: float | None = column(pa.float64())
    ci_high: float | None = column(pa.float64())
    consistency: float | None = column(pa.float64())
    holdout_median_dlogp: float | None = column(pa.float64())
    holdout_ci_low: float | None = column(pa.float64())
    holdout_ci_high: float | None = column(pa.float64())
    holdout_p_value: float | None = column(pa.float64())
    holdout_docs: int | None = column(pa.int32())  # the documents its held-out words span
    rule: str | None = column(pa.string())
    rule_json: str | None = column(pa.string())
    rule_precision: float | None = column(pa.float64())
    rule_recall: float | None = column(pa.float64())
    rule_f1: float | None = column(pa.float64())
    top_words: str | None = column(pa.string())
    kind: str | None = column(pa.string())
    statement: str | None = column(pa.string())
    word_set_json: str | None = column(pa.string())
    single_rule: bool | None = column(pa.bool_())
    # What the finding rests on beyond the models (`features.evidence.ARTIFACTS`): a document's
    # start, whitespace or markup; null when its words are ordinary text.
    artifact: str | None = column(pa.string())


FINDING_SCHEMA = record_schema(FindingRecord)

# finding_words.parquet: one row per (finding, word it covers)
FINDING_WORDS_SCHEMA = pa.schema(
    [("finding", pa.int32()), ("split", pa.string()), ("row", pa.int64()), ("doc_id", pa.string()), ("word_idx", pa.int32())]
)


def latent_ids(latents: str | None) -> list[int]:
    """The latents of a `latents` column ("3,17"); a finding the rule search alone found has none ("")."""
    return [int(x) for x in latents.split(",") if x] if latents else []
