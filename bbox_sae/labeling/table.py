"""`labels.parquet`: the label stage's table, and the one reader that puts labels on features."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from bbox_sae.artifacts import read_table, require_columns
from bbox_sae.labeling.records import LabelResult
from bbox_sae.layout import RunLayout

# One label row per features.parquet row: a latent's label goes on each of its pairs.
LABEL_KEY = ["latent", "model_a", "model_b"]
# column -> (LabelResult attribute, Arrow type)
LABEL_COLUMNS = {
    "label": ("label", pa.string()),
    "label_source": ("source", pa.string()),
    "label_reason": ("reason", pa.string()),
    "label_coherent": ("coherent", pa.bool_()),
    "label_score": ("score", pa.float64()),
    "label_precision": ("precision", pa.float64()),
    "label_recall": ("recall", pa.float64()),
    "fuzz_score": ("fuzz", pa.float64()),
}
LABEL_SCHEMA = pa.schema([("latent", pa.int32()), ("model_a", pa.string()), ("model_b", pa.string())] + [(c, t) for c, (_, t) in LABEL_COLUMNS.items()])


def labels_table(features: pa.Table, results: Mapping[int, LabelResult]) -> pa.Table:
    """One row per (latent, pair) of the labeled latents."""
    keys = [k for k in features.select(LABEL_KEY).to_pylist() if k["latent"] in results]
    rows = [{**k, **{c: getattr(results[k["latent"]], attr) for c, (attr, _) in LABEL_COLUMNS.items()}} for k in keys]
    return pa.Table.from_pylist(rows, schema=LABEL_SCHEMA)


def labeled_features(paths: RunLayout) -> pa.Table:
    """features.parquet with the label columns of labels.parquet joined on (latent, pair), in
    features.parquet's row order; label columns are null where nothing is labeled (yet)."""
    features = read_table(paths.features)
    if not paths.labels.exists():
        for name, (_, type_) in LABEL_COLUMNS.items():
            if name not in features.column_names:
                features = features.append_column(pa.field(name, type_), pa.nulls(features.num_rows, type_))
        return features
    labels = read_table(paths.labels)
    require_columns(labels, LABEL_KEY + list(LABEL_COLUMNS), str(paths.labels))
    base = features.drop_columns([c for c in LABEL_COLUMNS if c in features.column_names])
    order = base.column_names + list(LABEL_COLUMNS)
    base = base.append_column("_row", pa.array(range(base.num_rows), pa.int64()))
    labels = labels.select(LABEL_KEY + list(LABEL_COLUMNS)).cast(LABEL_SCHEMA)
    # Arrow's hash join does not keep row order: restore features.parquet's.
    return base.join(labels, keys=LABEL_KEY, join_type="left outer").sort_by("_row").select(order)
