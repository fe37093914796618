"""The evaluation's runs: model B's log-probs planted into a run whose other stages are the pipeline's,
every stage through the stage table, so each run's manifest says what it holds and a later
`bbox run` there redoes nothing that is current. Its variants (null-pair seeds, the w = 0 ablation)
are runs of their own that share its words (`bbox_sae.variants`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from bbox_sae.artifacts import atomic_write_table, read_table
from bbox_sae.bookkeeping import execute
from bbox_sae.config import Config
from bbox_sae.manifest import Manifest
from bbox_sae.stages import EMBED, INGEST, SCORE
from bbox_sae.variants import extract


def reading_b_from(cfg: Config, path: Path) -> Config:
    """`cfg` with model B's log-probs read from `path`, a file of the evaluation's own."""
    b_name = cfg.compare[0][1]
    return cfg.model_copy(update={"models": [m.model_copy(update={"path": str(path)}) if m.name == b_name else m for m in cfg.models]})


def models_but_b(cfg: Config) -> list[str]:
    return [m.name for m in cfg.models if m.name != cfg.compare[0][1]]


def score_model_a(cfg: Config, manifest: Manifest) -> tuple[pa.Table, np.ndarray]:
    """Ingest, every model's log-probs but B's (scored once, then cached) and the embeddings; returns
    the words and model A's log-probs. B's file is planted from A's log-probs, so the score stage
    runs here for the other models only, a partial run that records nothing; `plant` finishes it."""
    extract(cfg, manifest, (INGEST,))
    execute(SCORE, cfg, manifest, models=models_but_b(cfg))
    extract(cfg, manifest, (EMBED,))
    words = read_table(cfg.paths.words)
    lp_a = read_table(cfg.paths.logprobs(cfg.compare[0][0]))["logprob"].to_numpy(zero_copy_only=False)
    return words, np.nan_to_num(lp_a, nan=-30.0)


def plant(cfg: Config, manifest: Manifest, lp_b: np.ndarray, words: pa.Table) -> None:
    """Write model B's per-word log-probs to its file (one of the evaluation's own: `reading_b_from`)
    and run the score stage whole: the other models' log-probs are in already (scored by
    `score_model_a`, or linked from the parent run) and are kept, B's are imported."""
    b_model = cfg.model(cfg.compare[0][1])
    atomic_write_table(b_model.path, pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp_b}))
    execute(SCORE, cfg, manifest)
