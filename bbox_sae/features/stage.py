"""The features stage: top activations → Δ statistics → rules and findings → tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import atomic_write_json, atomic_write_table, read_table
from bbox_sae.config import Config
from bbox_sae.features.activations import TopActivations, top_activations, top_records
from bbox_sae.features.baseline import BASELINE_SCHEMA
from bbox_sae.features.contexts import contexts_table
from bbox_sae.features.domains import domain_stats
from bbox_sae.features.evidence import counted_once, first_of_identical_contexts
from bbox_sae.features.feature_table import apply_filters, corpus_stats, feature_rows, print_summary
from bbox_sae.features.grouping import FindingInputs, top_tested_findings
from bbox_sae.features.source import FeatureSource, Matrix, feature_source
from bbox_sae.features.tested_findings import rule_tested_findings
from bbox_sae.layout import RunLayout, logprob_column
from bbox_sae.schemas import FEATURE_SCHEMA, FINDING_SCHEMA, FINDING_WORDS_SCHEMA, FeatureRecord, FindingRecord, TestedRuleRecord, records_table


@dataclass(frozen=True)
class Tables:
    features: pa.Table
    findings: pa.Table
    tested_rules: pa.Table
    finding_words: pa.Table
    baseline: pa.Table


def _find(cfg: Config, src: FeatureSource, top: TopActivations) -> Tables:
    """Statistics per latent and pair, the filters, then rules, latent sets and findings."""
    fcfg, m = cfg.features, src.matrix
    lp_by_row = {model: m.index[logprob_column(model)].to_numpy() for model in m.models}
    d_emb = m.info["d_embedding"]

    def embedding_of(r: np.ndarray) -> np.ndarray:
        return np.asarray(m.values[np.sort(r), :d_emb], dtype=np.float64)

    pairs = [tuple(p) for p in cfg.compare]
    rows_by_split = counted_once(m.rows_by_split, first_of_identical_contexts(src.attrs, lp_by_row))
    _, doc_by_row = np.unique(m.index["doc_id"].to_numpy(zero_copy_only=False), return_inverse=True)
    feats = apply_filters(feature_rows(top, lp_by_row, src.words_of_row, embedding_of, pairs, fcfg, cfg.seed, src.name), fcfg)
    inputs = FindingInputs(
        top=top,
        fires_of=src.fires,
        attrs=src.attrs,
        rows_by_split=rows_by_split,
        lp_by_row=lp_by_row,
        doc_by_row=doc_by_row,
        words_by_row=src.words_of_row,
        context=m.values[:, :d_emb],
        fcfg=fcfg,
        seed=cfg.seed,
        pairs=tuple(pairs),
    )
    found = (rule_tested_findings if fcfg.test == "rule" else top_tested_findings)(feats, inputs)
    return Tables(
        features=records_table(found.features, FeatureRecord) if found.features else FEATURE_SCHEMA.empty_table(),
        findings=records_table(found.findings, FindingRecord) if found.findings else FINDING_SCHEMA.empty_table(),
        tested_rules=records_table(found.tested_rules, TestedRuleRecord),
        finding_words=finding_words_table(found.finding_words, m.index),
        baseline=found.baseline if found.baseline is not None else BASELINE_SCHEMA.empty_table(),
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
    # What the report says of the tests (thresholds, which test) is what decided them, not what the
    # config says now: a new q_threshold changes this file, and so the report's key.
    stats["features_settings"] = cfg.features.model_dump(mode="json")
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
    atomic_write_table(dest.rule_search, tables.baseline)
    atomic_write_table(dest.findings, tables.findings)
    atomic_write_json(dest.corpus_stats, stats)
    atomic_write_table(dest.features, tables.features)


def run_features(cfg: Config, into: RunLayout | None = None) -> dict:
    """`into`: where the tables go instead of the run's own (`bbox sweep`: each SAE's in its folder)."""
    fcfg = cfg.features
    src = feature_source(cfg, fcfg.source)
    m = src.matrix
    top = top_activations(src.encode, m.values, m.rows_by_split, src.d_sae, fcfg.top_n, fcfg.chunk_rows)
    tables = _find(cfg, src, top)
    top_tbl, examples = top_records(top, src.d_sae, m.index)
    stats = _corpus_stats(cfg, m)
    _write(into or cfg.paths, tables, top_tbl, contexts_table(cfg, examples, m.index, m.models), stats)
    print_summary(tables.findings, tables.features, stats)
    features = tables.features
    return {
        "live_latents": len(set(features["latent"].to_pylist())),
        "feature_rows": features.num_rows,
        "kept": int(pc.sum(features["kept"]).as_py() or 0) if features.num_rows else 0,
        "findings": tables.findings.num_rows,
        "source": src.name,
    }
