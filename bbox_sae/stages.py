"""The stage table: every pipeline stage once, with what it reads, takes and writes.

Above the stage packages (whose code it names, imported only when a stage runs or its key is
taken) and below the commands: the CLI (one subcommand per stage, its options from `Stage.options`),
`bbox run`, `bbox merge`, the evaluation, sweeps and the tests all read `STAGES`. What a `Stage`
is and when its outputs are current is `bbox_sae.bookkeeping`'s.
"""

from __future__ import annotations

import json

from bbox_sae.bookkeeping import Option, Stage, execute, require_current_inputs, staleness
from bbox_sae.config import Config, key_settings
from bbox_sae.manifest import Manifest

# ---------------------------------------------------------------- what each stage runs


def _ingest(cfg: Config, key: str) -> dict:
    from bbox_sae.corpus.ingest import ingest

    ingest(cfg)
    return json.loads(cfg.paths.ingest_marker.read_text())


def _score(cfg: Config, key: str | None, models: list[str] | None = None, shard: str | None = None) -> dict:
    from bbox_sae.artifacts import read_table
    from bbox_sae.scoring.stage import score_documents
    from bbox_sae.tracking import wandb_run

    result = score_documents(cfg, read_table(cfg.paths.documents), models, shard)
    with wandb_run(cfg, "score", group=cfg.wandb.group or cfg.out.name) as run:
        if run is not None:
            run.summary.update({"scoring": result})
    return result


def _embed(cfg: Config, key: str | None, shard: str | None = None) -> dict:
    from bbox_sae.embedding.stage import run_embed

    return run_embed(cfg, shard)


def _build(cfg: Config, key: str) -> dict:
    from bbox_sae.build.matrix import run_build

    return run_build(cfg)


def _train(cfg: Config, key: str, resume: bool | None = None) -> dict:
    """`resume` None (`bbox run`) or True (`bbox train --resume`): continue a killed run, but only
    from checkpoints written under this key (same matrix, same settings)."""
    from bbox_sae.train.sae import run_train

    return run_train(cfg, resume=resume is not False, wandb_group=cfg.wandb.group or cfg.out.name, resume_key=key)


def _features(cfg: Config, key: str) -> dict:
    from bbox_sae.features import run_features

    return run_features(cfg)


def _label(cfg: Config, key: str) -> dict:
    from bbox_sae.labeling import run_label

    return run_label(cfg)


def _report(cfg: Config, key: str) -> dict:
    from bbox_sae.report import run_report

    return run_report(cfg)


# ---------------------------------------------------------------- what each stage depends on


def _score_settings(cfg: Config) -> dict:
    """Each model by its own key (with what `dtype: auto` means on this host and the rounding code's
    version), so that a new model or a new setting of one rescores only that model."""
    from bbox_sae.scoring.stage import model_key

    settings = key_settings(cfg)
    return {"corpus": settings["corpus"], "seed": settings["seed"], "models": {m.name: model_key(m) for m in cfg.models}}


def _user_logprobs(cfg: Config) -> dict:
    from bbox_sae.scoring.stage import user_logprobs_checksum

    return {m.name: user_logprobs_checksum(m) for m in cfg.models if m.source == "parquet"}


def _corpus(cfg: Config) -> dict:
    from bbox_sae.corpus.documents import corpus_fingerprint, run_dirs

    return {"corpus": corpus_fingerprint(cfg.corpus, run_dirs(cfg))}


def _scores_complete(cfg: Config) -> None:
    from bbox_sae.scoring.stage import merge

    merge(cfg)


def _embeddings_complete(cfg: Config) -> None:
    from bbox_sae.embedding.stage import check_embeddings

    check_embeddings(cfg)


def _findings_version() -> dict:
    from bbox_sae.features.grouping import FINDINGS_VERSION

    return {"findings": FINDINGS_VERSION}


def _labeler_version() -> dict:
    from bbox_sae.labeling.heuristic import OFFLINE_LABELER_VERSION

    return {"offline_labeler": OFFLINE_LABELER_VERSION}


def _label_dry_run(cfg: Config) -> bool:
    """A label dry run prints the prompts and writes nothing: recorded, the next run (dry_run is not in
    the key) would skip the labeling it never did."""
    return cfg.label.dry_run and cfg.label.resolved_labeler() == "llm"


def _partial_shard(spec) -> bool:
    return spec not in (None, "0/1")


def _shard_option(what: str) -> Option:
    return Option("--shard", "shard", f"i/n: {what} a deterministic 1/n of the documents", partial=_partial_shard)


INGEST = Stage(
    "ingest",
    "read the corpus into documents and words, and split it into train / holdout",
    _ingest,
    inputs=(),
    reads=("corpus", "seed"),
    outputs=lambda c: [c.paths.documents, c.paths.words],
    sources=_corpus,
)
SCORE = Stage(
    "score",
    "ingest the corpus and score every word with every model",
    _score,
    inputs=(INGEST,),
    reads=("corpus", "seed", "models"),
    settings=_score_settings,
    outputs=lambda c: [c.paths.logprobs(m.name) for m in c.models],
    sources=_user_logprobs,
    options=(_shard_option("score"), Option("--model", "models", "only this model (repeatable)", {"action": "append"}, partial=bool)),
    check_shards=_scores_complete,
    runs_first=(INGEST,),
    logs=True,
)
EMBED = Stage(
    "embed",
    "contextual word embeddings",
    _embed,
    inputs=(INGEST,),
    reads=("corpus", "embedding"),
    outputs=lambda c: [c.paths.embeddings],
    options=(_shard_option("embed"),),
    check_shards=_embeddings_complete,
)
BUILD = Stage(
    "build",
    "performance-aware embedding matrix",
    _build,
    inputs=(INGEST, SCORE, EMBED),
    reads=("build", "models", "corpus"),
    outputs=lambda c: [c.paths.matrix, c.paths.index, c.paths.build_info],
)
TRAIN = Stage(
    "train",
    "train the sparse autoencoder with sae-lens",
    _train,
    inputs=(BUILD,),
    reads=("sae",),
    outputs=lambda c: [c.sae_paths.weights, c.sae_paths.sae_config],
    logs=True,
    options=(Option("--resume", "resume", "continue from the last checkpoint", {"action": "store_true"}),),
)
FEATURES = Stage(
    "features",
    "top activations, context rules tested on held-out text, findings",
    _features,
    inputs=(INGEST, BUILD, TRAIN),
    reads=("features", "compare", "seed", "sae"),
    version=_findings_version,
    outputs=lambda c: [
        c.paths.features,
        c.paths.findings,
        c.paths.finding_words,
        c.paths.rule_search,
        c.paths.rules,
        c.paths.contexts,
        c.paths.top_activations,
        c.paths.corpus_stats,
    ],
)
LABEL = Stage(
    "label",
    "label kept features (LLM endpoint or heuristic)",
    _label,
    # The negatives for validation are drawn here, from the matrix through the trained SAE.
    inputs=(INGEST, BUILD, TRAIN, FEATURES),
    reads=("label", "seed", "sae", "features"),
    version=_labeler_version,
    outputs=lambda c: [c.paths.labels, c.paths.finding_labels, c.paths.label_negatives, c.paths.label_stats],
    writes_nothing=_label_dry_run,
)
REPORT = Stage(
    "report",
    "W&B tables, report.html and report.md",
    _report,
    # Everything it reads: documents' domains and text, the tokens each model expected at a word
    # (the scores' `top_tokens`), the build index's log-probs (findings' held-out contexts), the
    # SAE's metrics, features, findings, contexts, corpus stats (with the features stage's
    # decisions), labels. A stage's key holds only its inputs' digests, so one left out here could
    # change without the report being redone.
    inputs=(INGEST, SCORE, BUILD, TRAIN, FEATURES, LABEL),
    reads=("report", "wandb", "sae"),
    outputs=lambda c: [c.paths.report_html, c.paths.report_md],
)

STAGES: list[Stage] = [INGEST, SCORE, EMBED, BUILD, TRAIN, FEATURES, LABEL, REPORT]
STAGE_NAMES = [s.name for s in STAGES]
BY_NAME = {s.name: s for s in STAGES}


def run_command(stage: Stage, cfg: Config, manifest: Manifest, **options) -> dict | None:
    """`bbox <stage>`: the stage alone, on inputs that must be current, after the stages it runs first
    where those are not (shard workers start together: each redoing the ingest would pull the
    documents from under the others)."""
    for first in stage.runs_first:
        if staleness(first, cfg, manifest) is not None:
            execute(first, cfg, manifest)
    require_current_inputs(stage, cfg, manifest)
    return execute(stage, cfg, manifest, **options)
