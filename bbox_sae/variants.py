"""Runs made from a run: a variant (a null-pair seed, the w = 0 ablation, a baseline) is a run of
its own in a folder of its parent's, with its own config and manifest.

It reads the outputs of the stages it shares with its parent through links, and records those
stages by the same call as `bbox merge` (`bookkeeping.record_finished`): the outputs are the very
same files, so their records are the parent's but for the result. Its own stages run through the
stage table like those of any run, so a later `bbox run` there redoes nothing that is current.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bbox_sae.bookkeeping import Stage, execute, record_finished, staleness
from bbox_sae.config import Config, save_resolved
from bbox_sae.errors import ArtifactError
from bbox_sae.manifest import Manifest
from bbox_sae.stages import BUILD, EMBED, FEATURES, INGEST, LABEL, SCORE, TRAIN

# `features.baseline`: the same extraction from an untrained SAE of the same width, or k-means clusters of the matrix.
BASELINES = ("random", "kmeans")


def _link(source: Path, target: Path) -> None:
    """`target` a link to `source`; a link to anything else (a copied run's, to the original's files) is replaced."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() and target.resolve() != source.resolve():
        target.unlink()
    if not target.exists():
        os.symlink(source.resolve(), target)


def share_outputs(parent: Config, variant: Config, stages: Sequence[Stage], logprobs_of: Sequence[str] = ()) -> Manifest:
    """Make `variant` a run holding `parent`'s outputs of `stages` (in pipeline order; each must be
    current in the parent), and the log-probs of the models `logprobs_of` when the score stage is not
    shared whole (the others are written anew); returns the variant's manifest."""
    parent_manifest = Manifest.read(parent.out)
    for stage in stages:
        why = staleness(stage, parent, parent_manifest)
        if why is not None:
            raise ArtifactError(f"{parent.out}: stage '{stage.name}' {why}; run `bbox run` there first")
    variant.out.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        for source, target in zip(stage.outputs(parent), stage.outputs(variant)):
            _link(source, target)
    for name in logprobs_of:
        _link(parent.paths.logprobs(name), variant.paths.logprobs(name))
    save_resolved(variant)
    manifest = Manifest.read(variant.out)
    for stage in stages:
        if staleness(stage, variant, manifest) is not None:
            record_finished(stage, variant, manifest, {"shared_from": str(parent.out)})
    return manifest


def extract(cfg: Config, manifest: Manifest, stages: Sequence[Stage] = (BUILD, TRAIN, FEATURES, LABEL)) -> list[str]:
    """`stages` in order, skipping those that are current (the same planted log-probs and settings: a
    re-run after a change to the features stage retrains no SAE); returns the stages that ran."""
    ran = []
    for stage in stages:
        if staleness(stage, cfg, manifest) is None:
            continue
        execute(stage, cfg, manifest)
        ran.append(stage.name)
    return ran


def baseline_config(cfg: Config, baseline: str) -> Config:
    return cfg.model_copy(update={"output_dir": str(cfg.paths.baseline(baseline).root), "features": cfg.features.model_copy(update={"baseline": baseline})})


def run_baseline(cfg: Config, baseline: str, label: bool = False) -> list[str]:
    """`bbox features --baseline NAME`: the features (and, `label`, the labels) of a baseline, in
    `baselines/<NAME>/`, a run that shares this run's words, scores, matrix and SAE (its width)."""
    variant = baseline_config(cfg, baseline)
    manifest = share_outputs(cfg, variant, (INGEST, SCORE, EMBED, BUILD, TRAIN))
    return extract(variant, manifest, (FEATURES, LABEL) if label else (FEATURES,))
