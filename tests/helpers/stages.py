"""Stages run in this process as the `bbox` commands run them: through the stage table."""

from __future__ import annotations

from bbox_sae.config import Config
from bbox_sae.manifest import Manifest, StageRecord


def score(cfg: Config, models: list[str] | None = None, shard: str | None = None) -> dict:
    """`bbox score`: ingest, then the score stage (of `models`, or worker `shard`'s part)."""
    from bbox_sae.stages import SCORE, run_command

    return run_command(SCORE, cfg, Manifest.read(cfg.out), models=models, shard=shard)


def recorded(root, *names: str) -> Manifest:
    """A manifest (not written) in which the stages `names` finished, with the digests `digest-<name>`."""
    return Manifest(root, {n: StageRecord(key=f"key-{n}", digest=f"digest-{n}") for n in names})
