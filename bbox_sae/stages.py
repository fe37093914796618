"""The stage registry: every pipeline stage once, with what it reads and writes.

The CLI (one subcommand per stage), `bbox run` and the tests all read `STAGES`. A stage's key
is content-addressed: it hashes the config the stage reads (`settings`: only the fields the schema
marks as part of a key, `bbox_sae/config/keys.py`) and its code's `version`, the files outside
the output dir it reads (`sources`: the corpus, users' log-prob files, by checksum), and the
recorded digests of the stages whose outputs it reads (`inputs`). `manifest.json` records, for
each finished stage, its key and the checksums of its outputs; a stage is current when its key
is unchanged and its outputs are still the ones it wrote. Nothing else decides.

Running a stage first withdraws its record, so a stage that fails (or is killed) leaves no
claim that its old outputs are current: the stages after it refuse to run on them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bbox_sae.artifacts import sha256_file
from bbox_sae.config import Config, key_settings
from bbox_sae.errors import ArtifactError
from bbox_sae.manifest import describe_outputs, read_manifest, sharded_digest, write_entry


@dataclass(frozen=True)
class Stage:
    name: str
    help: str
    # (cfg, key, **options) -> result recorded in the manifest; options are the CLI's extras.
    run: Callable[..., dict | None]
    inputs: tuple[str, ...]
    settings: Callable[[Config], dict]
    outputs: Callable[[Config], list[Path]]
    sources: Callable[[Config], dict] = field(default=lambda cfg: {})
    # The version of the code that writes the outputs, by part: bump one when that code changes what
    # it writes for the same settings, and the runs made before are redone. `settings` puts it in
    # the key (the score stage's goes into the key of each model that uses that code, `model_key`,
    # so that only those are scored again). A stage whose code never changed its outputs has none.
    version: Mapping[str, int] = field(default_factory=dict)


def _key_sections(cfg: Config, *names: str) -> dict:
    """The named sections (or top-level fields) as keys hold them: without operational fields."""
    settings = key_settings(cfg)
    return {n: settings[n] for n in names}


def _version(stage: str) -> Mapping[str, int]:
    return BY_NAME[stage].version


# ---------------------------------------------------------------- what each stage runs


def _ingest(cfg: Config, key: str) -> dict:
    from bbox_sae.corpus.ingest import ingest

    ingest(cfg)
    return json.loads(cfg.paths.ingest_marker.read_text())


def _score(cfg: Config, key: str, models: list[str] | None = None, shard: str | None = None) -> dict:
    from bbox_sae.artifacts import read_table
    from bbox_sae.scoring.stage import score_documents
    from bbox_sae.tracking import wandb_run

    result = score_documents(cfg, read_table(cfg.paths.documents), models, shard)
    with wandb_run(cfg, "score", group=cfg.wandb.group or cfg.out.name) as run:
        if run is not None:
            run.summary.update({"scoring": result})
    return result


def _embed(cfg: Config, key: str, shard: str | None = None) -> dict:
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


def _features(cfg: Config, key: str, baseline: str | None = None) -> dict:
    from bbox_sae.features import run_features

    return run_features(cfg, baseline=baseline)


def _label(cfg: Config, key: str, baseline: str | None = None) -> dict:
    from bbox_sae.labeling import run_label

    return run_label(cfg, baseline=baseline)


def _report(cfg: Config, key: str) -> dict:
    from bbox_sae.report import run_report

    return run_report(cfg)


# ---------------------------------------------------------------- what each stage depends on


def _score_settings(cfg: Config) -> dict:
    from bbox_sae.scoring.stage import model_key

    return {"models": {m.name: model_key(m) for m in cfg.models}}


def _user_logprobs(cfg: Config) -> dict:
    from bbox_sae.scoring.stage import user_logprobs_checksum

    return {m.name: user_logprobs_checksum(m) for m in cfg.models if m.source == "parquet"}


def _corpus(cfg: Config) -> dict:
    from bbox_sae.corpus.documents import corpus_fingerprint, run_dirs

    return {"corpus": corpus_fingerprint(cfg.corpus, run_dirs(cfg))}


STAGES: list[Stage] = [
    Stage(
        "ingest",
        "read the corpus into documents and words, and split it into train / holdout",
        _ingest,
        inputs=(),
        settings=lambda c: _key_sections(c, "corpus", "seed"),
        outputs=lambda c: [c.paths.documents, c.paths.words],
        sources=_corpus,
    ),
    Stage(
        "score",
        "ingest the corpus and score every word with every model",
        _score,
        inputs=("ingest",),
        settings=_score_settings,
        # The rounding of `dtype: mixed` and of the refined head (scoring/precision.py). 2: the
        # refined head streams the vocabulary; 3: a tie at its top-k's edge may pick another logit.
        version={"precision": 3},
        outputs=lambda c: [c.paths.logprobs(m.name) for m in c.models],
        sources=_user_logprobs,
    ),
    Stage(
        "embed",
        "contextual word embeddings",
        _embed,
        inputs=("ingest",),
        settings=lambda c: _key_sections(c, "embedding"),
        outputs=lambda c: [c.paths.embeddings],
    ),
    Stage(
        "build",
        "performance-aware embedding matrix",
        _build,
        inputs=("ingest", "score", "embed"),
        settings=lambda c: {**_key_sections(c, "build"), "models": [m.name for m in c.models]},
        outputs=lambda c: [c.paths.matrix, c.paths.index, c.paths.build_info],
    ),
    Stage(
        "train",
        "train the sparse autoencoder with sae-lens",
        _train,
        inputs=("build",),
        settings=lambda c: _key_sections(c, "sae"),
        outputs=lambda c: [c.sae_paths.weights, c.sae_paths.sae_config],
    ),
    Stage(
        "features",
        "top activations, context rules tested on held-out text, findings",
        _features,
        inputs=("ingest", "build", "train"),
        settings=lambda c: {**_key_sections(c, "features", "compare"), **_version("features")},
        # How findings are grouped (features/grouping.py). 2: a nested group is said by its broadest
        # rule only when the words it adds differ too, and listed words after one listed word are one
        # finding. 3: a run of spaces is said in words. 4: latents' groups of words; findings join
        # only what nests, never by embedding similarity. 5: ending sets; same-context units that
        # share a proposing latent join. 6: a latent's carrying words above
        # latent_sets.FIT_WORDS are clustered by a k-means fitted on a sample of them. 7: every rule of
        # the grammar is a candidate (features.rule_search); rules of one place that a latent carries
        # join; the rule-search baseline is recorded. 8: a finding said by a member's word set keeps
        # that set's exclusions. 9: a left word joins like a layout; a latent's group that rules hold
        # and that mixes punctuation and words is not kept. 10: a place joins one kind of token.
        version={"findings": 26},
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
    ),
    Stage(
        "label",
        "label kept features (LLM endpoint or heuristic)",
        _label,
        # The negatives for validation are drawn here, from the matrix through the trained SAE.
        inputs=("ingest", "build", "train", "features"),
        settings=lambda c: {**_key_sections(c, "label", "seed"), **_version("label")},
        # The heuristic labeler (labeling/heuristic.py). 5: latents of latent findings are said by
        # their word sets; findings' statements are scored.
        version={"offline_labeler": 5},
        outputs=lambda c: [c.paths.labels, c.paths.finding_labels, c.paths.label_negatives, c.paths.label_stats],
    ),
    Stage(
        "report",
        "W&B tables, report.html and report.md",
        _report,
        # Everything it reads: documents' domains and text, the build index's log-probs (findings'
        # held-out contexts), the SAE's metrics, features, findings, contexts, corpus stats, labels.
        # A stage's key holds only its inputs' digests, so one left out here could change without
        # the report being redone.
        inputs=("ingest", "build", "train", "features", "label"),
        settings=lambda c: _key_sections(c, "report", "wandb"),
        outputs=lambda c: [c.paths.report_html, c.paths.report_md],
    ),
]
STAGE_NAMES = [s.name for s in STAGES]
BY_NAME = {s.name: s for s in STAGES}


def ancestors(name: str) -> list[str]:
    """Every stage whose outputs `name` depends on, directly or not, in pipeline order."""
    found: set[str] = set()
    todo = list(BY_NAME[name].inputs)
    while todo:
        dep = todo.pop()
        if dep not in found:
            found.add(dep)
            todo.extend(BY_NAME[dep].inputs)
    return [n for n in STAGE_NAMES if n in found]


def _outputs_unchanged(cfg: Config, stage: Stage, recorded: dict) -> bool:
    """The outputs are still the ones the stage wrote: shard checksums for tables; for single files
    size and time (each written by atomic rename, so any rewrite changes its time), and the
    checksum when only the time differs."""
    for p in stage.outputs(cfg):
        rel = str(p.relative_to(cfg.out))
        was = recorded.get(rel)
        if was is None or not p.exists():
            return False
        if "shards" in was:
            if not p.is_dir() or sharded_digest(p) != was["shards"]:
                return False
        else:
            st = p.stat()
            if st.st_size != was.get("size"):
                return False
            # A copied run (cp -r, rsync without -t) gives unchanged files new times; the checksum
            # decides then, so a copy is not recomputed from the build on.
            if st.st_mtime_ns != was.get("mtime_ns") and sha256_file(p) != was.get("sha256"):
                return False
    return True


def stage_key(stage: Stage, cfg: Config, manifest: dict) -> str | None:
    """None when an input stage has no finished record to take its digest from."""
    inputs = {}
    for dep in stage.inputs:
        entry = manifest["stages"].get(dep)
        if not entry or "digest" not in entry:
            return None
        inputs[dep] = entry["digest"]
    payload = {"stage": stage.name, "settings": stage.settings(cfg), "sources": stage.sources(cfg), "inputs": inputs}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def staleness(stage: Stage, cfg: Config, manifest: dict) -> str | None:
    """Why the stage's outputs are not current (None when they are)."""
    entry = manifest["stages"].get(stage.name)
    if not entry or "key" not in entry:
        return "has not finished"
    if entry["key"] != stage_key(stage, cfg, manifest):
        return "is out of date (its inputs or settings changed)"
    if not _outputs_unchanged(cfg, stage, entry.get("outputs", {})):
        return "has outputs that are missing or were changed since it finished"
    return None


def withdraw(cfg: Config, name: str) -> None:
    """Before a stage touches its outputs: until it finishes, nothing claims they are current."""
    write_entry(cfg, name, None)


def record(cfg: Config, stage: Stage, key: str, seconds: float, result) -> None:
    outputs = describe_outputs(cfg, stage.outputs(cfg))
    digest = hashlib.sha256(json.dumps({k: v.get("sha256") or v.get("shards") for k, v in outputs.items()}, sort_keys=True).encode()).hexdigest()[:16]
    write_entry(
        cfg,
        stage.name,
        {"key": key, "digest": digest, "outputs": outputs, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(seconds, 2), "result": result},
    )


def require_current_inputs(stage: Stage, cfg: Config, reader: str | None = None) -> None:
    """A stage run on its own refuses inputs that are not current: it would turn stale into new-looking
    results. `reader`: the command that reads what `stage` reads (`eval coherence` reads the report's inputs)."""
    manifest = read_manifest(cfg.out)
    for dep in ancestors(stage.name):
        why = staleness(BY_NAME[dep], cfg, manifest)
        if why is not None:
            names = ", ".join(str(p.relative_to(cfg.out)) for p in BY_NAME[dep].outputs(cfg))
            raise ArtifactError(f"{cfg.out}: '{reader or stage.name}' reads {names} from stage '{dep}', which {why}; run `bbox {dep}` (or `bbox run`) first")


def writes_nothing(stage: Stage, cfg: Config) -> bool:
    """A label dry run prints the prompts and writes nothing, so its record is neither withdrawn nor
    renewed: recorded, the next run (dry_run is not in the key) would skip the labeling it never did."""
    return stage.name == "label" and cfg.label.dry_run and cfg.label.resolved_labeler() == "llm"


def execute(stage: Stage, cfg: Config, complete: bool = True, **options) -> dict | None:
    """Run one stage and record it. `complete` False: the run covers only part of the stage's
    work (some models, one worker's shards), so it withdraws the record and does not renew it."""
    key = stage_key(stage, cfg, read_manifest(cfg.out))
    if key is None:
        require_current_inputs(stage, cfg)  # names the input that is missing
    if writes_nothing(stage, cfg):
        return stage.run(cfg, key, **options)
    withdraw(cfg, stage.name)
    start = time.perf_counter()
    result = stage.run(cfg, key, **options)
    if complete:
        record(cfg, stage, key, time.perf_counter() - start, result)
    return result


def run_command(name: str, cfg: Config, **options) -> dict | None:
    """`bbox <stage>`: the stage alone, on inputs that must be current. `bbox score` ingests first,
    since scoring without the current corpus has no meaning."""
    if name == "score":
        execute(BY_NAME["ingest"], cfg)
    stage = BY_NAME[name]
    require_current_inputs(stage, cfg)
    partial = bool(options.get("models") or options.get("shard") not in (None, "0/1"))
    if options.get("baseline"):
        return stage.run(cfg, None, **options)  # features or label of a baseline: under baselines/, not the stage's outputs
    return execute(stage, cfg, complete=not partial, **options)


def record_merged(cfg: Config, name: str) -> None:
    """`bbox merge`: every worker's shards of stage `name` (score or embed) are complete, so the stage is finished."""
    stage = BY_NAME[name]
    require_current_inputs(stage, cfg)
    record(cfg, stage, stage_key(stage, cfg, read_manifest(cfg.out)), 0.0, {"merged": True})
