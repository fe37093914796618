"""A report-ready run whose held-out words carry a known gap (`add_gap_tables`): eight held-out
plays in two domains and two train plays, scored so that alpha wins every 'fool' and beta every
'king', most of all in the tragedies. Written on top of an output dir with the features stage's
other tables (tests/test_report.py's `build_output_dir`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.config import FeaturesConfig
from bbox_sae.corpus.words import word_spans
from bbox_sae.layout import RunLayout
from bbox_sae.schemas import FINDING_SCHEMA, FINDING_WORDS_SCHEMA

TEXT = "Enter the FOOL.\n\nThe fool sings, and the king weeps.\nThe king hath 3 crowns; the fool none.\n"
HELD = [f"comedy-{i}" for i in range(4)] + [f"tragedy-{i}" for i in range(4)]
TRAIN = ["train-0", "train-1"]
FOOL_DELTA = 2.0
KING_DELTA = {"comedy": -0.5, "tragedy": -1.5, "train": -1.0}
# (finding, better model, statement, which held-out 'king' / 'fool' words it covers)
FINDINGS = [
    (0, "alpha", "'fool'", lambda form, domain: form == "fool"),
    (1, "beta", "'king' in a tragedy", lambda form, domain: form == "king" and domain == "tragedy"),
    (2, "beta", "'king'", lambda form, domain: form == "king"),
]


def domain_of(doc: str) -> str:
    return doc.split("-")[0]


def word_delta(form: str, doc: str, position: int) -> float:
    """Δ (alpha − beta) of one word: the planted forms', else a small lean that differs by play
    (so documents differ) and by position (so words differ)."""
    if form == "fool":
        return FOOL_DELTA
    if form == "king":
        return KING_DELTA[domain_of(doc)]
    return 0.05 * (int(doc.rsplit("-", 1)[1]) - 1.5) + 0.1 * ((position % 3) - 1)


def _finding_row(finding: int, better: str, statement: str, n: int) -> dict:
    row = {name: None for name in FINDING_SCHEMA.names}
    sign = 1.0 if better == "alpha" else -1.0
    row |= {
        "finding": finding, "model_a": "alpha", "model_b": "beta", "better_model": better, "kind": "rule", "statement": statement,
        "rule": statement, "latents": "0" if finding == 0 else "", "n_latents": 1 if finding == 0 else 0, "proposer": "rule search",
        "n_units": 1, "q_value": 0.001, "single_rule": True, "n_top": 10, "holdout_n": n, "median_dlogp": sign, "mean_dlogp": sign,
        "median_dp": 0.1 * sign, "ci_low": sign - 0.2, "ci_high": sign + 0.2, "consistency": 1.0, "holdout_median_dlogp": sign,
        "holdout_ci_low": sign - 0.2, "holdout_ci_high": sign + 0.2, "holdout_p_value": 1e-4, "top_words": statement,
    }  # fmt: skip
    return row


def add_gap_tables(out: Path) -> Path:
    """words/, build/index.parquet, documents.parquet, findings.parquet, finding_words.parquet and
    corpus_stats.json's pairs and domains, for the held-out plays above."""
    paths = RunLayout(out)
    words, index, finding_words = [], [], []
    for doc in TRAIN + HELD:
        split = "train" if doc in TRAIN else "holdout"
        for idx, (start, end) in enumerate(word_spans(TEXT)):
            word = TEXT[start:end]
            form = word.strip().lower()
            words.append(
                {"doc_id": doc, "word_idx": idx, "char_start": int(start), "char_end": int(end), "word": word, "split": split, "domain": domain_of(doc)}
            )
            row = len(index)
            lp_alpha = -2.0 - 0.1 * (idx % 5)
            index.append(
                {"row": row, "doc_id": doc, "word_idx": idx, "split": split, "logprob__alpha": lp_alpha, "logprob__beta": lp_alpha - word_delta(form, doc, idx)}
            )
            for finding, _, _, covers in FINDINGS:
                if split == "holdout" and covers(form, domain_of(doc)):
                    finding_words.append({"finding": finding, "split": "holdout", "row": row, "doc_id": doc, "word_idx": idx})
    ShardedTable(paths.words).write(0, pa.Table.from_pylist(words))
    paths.build.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(index), paths.index)
    pq.write_table(pa.Table.from_pylist(finding_words, schema=FINDING_WORDS_SCHEMA), paths.finding_words)
    counts = {f: sum(w["finding"] == f for w in finding_words) for f, *_ in FINDINGS}
    findings = [_finding_row(f, better, statement, counts[f]) for f, better, statement, _ in FINDINGS]
    pq.write_table(pa.Table.from_pylist(findings, schema=FINDING_SCHEMA), paths.findings)
    docs = [{"doc_id": d, "text": TEXT, "split": "train" if d in TRAIN else "holdout", "domain": domain_of(d), "shard": 0} for d in TRAIN + HELD]
    existing = read_table(paths.documents).to_pylist() if paths.documents.exists() else []
    pq.write_table(pa.Table.from_pylist(existing + docs), paths.documents)
    stats = json.loads(paths.corpus_stats.read_text()) if paths.corpus_stats.exists() else {"features_settings": FeaturesConfig().model_dump(mode="json")}
    stats["pairs"] = [["alpha", "beta"]]
    paths.corpus_stats.write_text(json.dumps(stats))
    return out


def held_out_deltas(out: Path) -> tuple[np.ndarray, list[str], list[str]]:
    """Δ of every held-out word with its document and word, read straight from the tables: what a
    test checks the account against."""
    paths = RunLayout(out)
    index = read_table(paths.index).to_pylist()
    words = {(w["doc_id"], w["word_idx"]): w["word"] for w in read_table(paths.words).to_pylist()}
    held = [r for r in index if r["split"] == "holdout"]
    delta = np.array([r["logprob__alpha"] - r["logprob__beta"] for r in held])
    return delta, [r["doc_id"] for r in held], [words[(r["doc_id"], r["word_idx"])] for r in held]
