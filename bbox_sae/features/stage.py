"""The features stage: top activations → Δ statistics → rules and findings → tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import atomic_write_json, atomic_write_table, read_table
from bbox_sae.config import Config
from bbox_sae.build.matrix import open_matrix
from bbox_sae.features.domains import domain_stats
from bbox_sae.features.activations import TopActivations, firing, top_activations, top_records
from bbox_sae.features.contexts import contexts_table, word_attributes_by_position, words_by_row
from bbox_sae.features.encoders import Encoder, make_encoder
from bbox_sae.features.grouping import add_rules_and_findings, rule_tested_findings
from bbox_sae.features.feature_table import apply_filters, corpus_stats, feature_rows, print_summary
from bbox_sae.layout import RunLayout, logprob_column
from bbox_sae.schemas import FEATURE_SCHEMA, FINDING_SCHEMA, FINDING_WORDS_SCHEMA, TESTED_RULE_SCHEMA


@dataclass(frozen=True)
class Matrix:
    """The built matrix with its row index, and its rows by split."""

    values: np.ndarray
    index: pa.Table
    info: dict
    rows_by_split: dict[str, np.ndarray]

    @property
    def models(self) -> list[str]:
        return self.info["models"]


def open_rows(cfg: Config) -> Matrix:
    matrix, index, info = open_matrix(cfg)
    split = index["split"].to_numpy(zero_copy_only=False)
    rows = index["row"].to_numpy()
    return Matrix(matrix, index, info, {"train": rows[split == "train"], "holdout": rows[split == "holdout"]})


def features_layout(cfg: Config, baseline: str | None = None) -> RunLayout:
    """Where a run's feature tables go: the run itself, or `baselines/<name>/` for a baseline."""
    return cfg.paths.baseline(baseline) if baseline else cfg.paths


@dataclass
class Tables:
    features: pa.Table
    findings: pa.Table
    tested_rules: pa.Table
    finding_words: pa.Table


def _find(cfg: Config, m: Matrix, encode: Encoder, top: TopActivations, source: str) -> Tables:
    """Statistics per latent and pair, the filters, then rules, latent sets and findings."""
    fcfg = cfg.features
    words_of_row, word_position = words_by_row(cfg, m.index)
    attrs = word_attributes_by_position(cfg).take(word_position)
    lp_by_row = {model: m.index[logprob_column(model)].to_numpy() for model in m.models}
    d_emb = m.info["d_embedding"]

    def embedding_of(r: np.ndarray) -> np.ndarray:
        return np.asarray(m.values[np.sort(r), :d_emb], dtype=np.float64)

    pairs = [tuple(p) for p in cfg.compare]
    feats = feature_rows(top, lp_by_row, words_of_row, embedding_of, pairs, fcfg, cfg.seed, source)
    apply_filters(feats, fcfg)
    make_findings = rule_tested_findings if fcfg.test == "rule" else add_rules_and_findings
    tested: list[dict] = []
    words_of_finding: list[tuple[int, str, np.ndarray]] = []
    findings = make_findings(
        feats, top, lambda latents: firing(encode, m.values, latents, fcfg.chunk_rows), attrs, m.rows_by_split, lp_by_row, words_of_row,
        fcfg, cfg.seed, tested, m.values[:, :d_emb], words_of_finding,
    )
    return Tables(
        features=pa.Table.from_pylist(feats, schema=FEATURE_SCHEMA) if feats else FEATURE_SCHEMA.empty_table(),
        findings=pa.Table.from_pylist(findings, schema=FINDING_SCHEMA) if findings else FINDING_SCHEMA.empty_table(),
        tested_rules=pa.Table.from_pylist(tested, schema=TESTED_RULE_SCHEMA),
        finding_words=finding_words_table(words_of_finding, m.index),
    )


def finding_words_table(words: list[tuple[int, str, np.ndarray]], index: pa.Table) -> pa.Table:
    """finding_words.parquet: every word a finding covers, train (where it was chosen) and held out
    (where it was tested)."""
    rows = np.concatenate([r for _, _, r in words]).astype(np.int64) if words else np.zeros(0, np.int64)
    at = pa.array(rows, pa.int64())
    return pa.table(
        {
            "finding": pa.array(np.repeat([f for f, _, _ in words], [len(r) for _, _, r in words]).astype(np.int32) if words else [], pa.int32()),
            "split": pa.array([split for _, split, r in words for _ in range(len(r))], pa.string()),
            "row": at,
            "doc_id": index["doc_id"].take(at),
            "word_idx": index["word_idx"].take(at),
        },
        schema=FINDING_WORDS_SCHEMA,
    )


def _corpus_stats(cfg: Config, m: Matrix) -> dict:
    documents = read_table(cfg.paths.documents, columns=["doc_id", "domain"])
    pairs = [tuple(p) for p in cfg.compare]
    stats = corpus_stats(m.index, m.models, pairs, documents.num_rows)
    stats["domains"] = domain_stats(m.index, documents, m.models, pairs)
    return stats


def _write(dest: RunLayout, tables: Tables, top_tbl: pa.Table, contexts: pa.Table, stats: dict) -> None:
    # features.parquet is the table later stages start from: withdraw the old one before writing
    # the new companions and write it last, so a run killed in between never pairs an old
    # features.parquet with new contexts (label and report would trust the mix).
    dest.features.unlink(missing_ok=True)
    atomic_write_table(dest.top_activations, top_tbl)
    atomic_write_table(dest.contexts, contexts)
    atomic_write_table(dest.rules, tables.tested_rules)
    atomic_write_table(dest.finding_words, tables.finding_words)
    atomic_write_table(dest.findings, tables.findings)
    atomic_write_json(dest.corpus_stats, stats)
    atomic_write_table(dest.features, tables.features)


def run_features(cfg: Config, baseline: str | None = None) -> dict:
    fcfg = cfg.features
    baseline = baseline or (fcfg.baseline if fcfg.baseline != "none" else None)
    source = baseline or "sae"
    m = open_rows(cfg)
    encode, d_sae = make_encoder(cfg, source, m.values, m.rows_by_split["train"], m.info)
    top = top_activations(encode, m.values, m.rows_by_split, d_sae, fcfg.top_n, fcfg.chunk_rows)
    tables = _find(cfg, m, encode, top, source)
    top_tbl, examples = top_records(top, d_sae, m.index)
    stats = _corpus_stats(cfg, m)
    _write(features_layout(cfg, baseline), tables, top_tbl, contexts_table(cfg, examples, m.index, m.models), stats)
    print_summary(tables.findings, tables.features, stats)
    features = tables.features
    return {
        "live_latents": len(set(features["latent"].to_pylist())), "feature_rows": features.num_rows,
        "kept": int(pc.sum(features["kept"]).as_py() or 0) if features.num_rows else 0,
        "findings": tables.findings.num_rows, "source": source,
    }
