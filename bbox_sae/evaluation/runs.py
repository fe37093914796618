"""The evaluation's runs, every stage through the stage registry (`stages.execute`), so each run's
manifest says what it holds and a later `bbox run` there redoes nothing that is current.

A variant (a null-pair seed, the w = 0 ablation) is a run of its own in a folder of the evaluation's
run: it reads its parent's scored and embedded words through links, and takes over the records of
the stages that wrote them, since the outputs are the very same files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from bbox_sae.artifacts import atomic_write_table
from bbox_sae.config import Config, save_resolved
from bbox_sae.errors import ArtifactError
from bbox_sae.layout import RunLayout
from bbox_sae.stages import BY_NAME, execute, read_manifest, record, staleness, withdraw

EXTRACTION = ("build", "train", "features", "label")


def _link(src: Path, dst: Path, logprobs: list[str] | None) -> None:
    dst.mkdir(parents=True, exist_ok=True)

    def shared(paths: RunLayout) -> list[Path]:
        inputs = [paths.documents, paths.ingest_marker, paths.words, paths.embeddings]
        return inputs + ([paths.logprobs_root] if logprobs is None else [paths.logprobs(m) for m in logprobs])

    for source, target in zip(shared(RunLayout(src)), shared(RunLayout(dst))):
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.symlink(source.resolve(), target)


def share_inputs(parent: Config, variant: Config, logprobs: list[str] | None = None) -> None:
    """Make `variant` a run that shares `parent`'s ingested and embedded words and all models'
    log-probs (or only `logprobs`' models', when the others are written anew): links to the parent's
    files, the variant's config, and the parent's records of the stages that wrote them."""
    shared = ["ingest", "score", "embed"] if logprobs is None else ["ingest", "embed"]
    manifest = read_manifest(parent.out)
    for name in shared:
        why = staleness(BY_NAME[name], parent, manifest)
        if why is not None:
            raise ArtifactError(f"{parent.out}: stage '{name}' {why}; run `bbox run` there first")
    _link(parent.out, variant.out, logprobs)
    save_resolved(variant)
    for name in shared:
        record(variant, BY_NAME[name], manifest["stages"][name]["key"], 0.0, {"shared_from": str(parent.out)})


def extract(cfg: Config) -> list[str]:
    """Build → train → features → label, on a run whose scored and embedded words are recorded,
    skipping the stages that are current (the same planted log-probs and settings: a re-run after a
    change to the features stage retrains no SAE); returns the stages that ran."""
    ran = []
    for name in EXTRACTION:
        stage = BY_NAME[name]
        if staleness(stage, cfg, read_manifest(cfg.out)) is None:
            continue
        execute(stage, cfg)
        ran.append(name)
    return ran


def reading_b_from(cfg: Config, path: Path) -> Config:
    """`cfg` with model B's log-probs read from `path`, a file of the evaluation's own."""
    b_name = cfg.compare[0][1]
    return cfg.model_copy(update={"models": [m.model_copy(update={"path": str(path)}) if m.name == b_name else m for m in cfg.models]})


def models_but_b(cfg: Config) -> list[str]:
    return [m.name for m in cfg.models if m.name != cfg.compare[0][1]]


def score_model_a(cfg: Config) -> tuple[pa.Table, np.ndarray]:
    """Ingest, every model's log-probs but B's (scored once, then cached) and the embeddings; returns
    the words and model A's log-probs."""
    from bbox_sae.artifacts import read_table

    execute(BY_NAME["ingest"], cfg)
    # B's file is planted from A's log-probs, so the score stage's key (which reads B's file) cannot
    # be taken yet: this part of the stage runs as `execute(complete=False)` would, its old record
    # withdrawn and none written; `plant` finishes the stage.
    withdraw(cfg, "score")
    BY_NAME["score"].run(cfg, None, models=models_but_b(cfg))
    execute(BY_NAME["embed"], cfg)
    words = read_table(cfg.paths.words)
    lp_a = read_table(cfg.paths.logprobs(cfg.compare[0][0]))["logprob"].to_numpy(zero_copy_only=False)
    return words, np.nan_to_num(lp_a, nan=-30.0)


def plant(cfg: Config, lp_b: np.ndarray, words: pa.Table) -> None:
    """Write model B's per-word log-probs to its file (one of the evaluation's own: `reading_b_from`)
    and import them. The other models' log-probs are in already (scored by `score_model_a`, or linked
    from the parent run), so the score stage is then complete and recorded."""
    b_model = cfg.model(cfg.compare[0][1])
    atomic_write_table(b_model.path, pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp_b}))
    execute(BY_NAME["score"], cfg, models=[b_model.name])
