"""Weights & Biases runs: offline by default, files under the run's output dir, never $HOME."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bbox_sae.config import Config


def run_id(cfg: Config, job: str) -> str:
    """Deterministic id per (output dir, job): re-running a stage updates its run instead of adding one."""
    digest = hashlib.sha256(str(cfg.out.resolve()).encode()).hexdigest()[:10]
    return f"{job}-{digest}"


@contextmanager
def wandb_run(cfg: Config, job: str, config: dict | None = None, group: str | None = None, name: str | None = None) -> Iterator[object | None]:
    """Yield a wandb run (or None when `wandb.mode` is disabled)."""
    if cfg.wandb.mode == "disabled":
        yield None
        return
    import wandb

    wandb_dir = cfg.paths.wandb
    wandb_dir.mkdir(parents=True, exist_ok=True)
    # wandb also writes caches and settings under $HOME unless told otherwise.
    os.environ.setdefault("WANDB_CACHE_DIR", str(wandb_dir / ".cache"))
    os.environ.setdefault("WANDB_CONFIG_DIR", str(wandb_dir / ".config"))
    os.environ.setdefault("WANDB_DATA_DIR", str(wandb_dir / ".data"))
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        group=group or cfg.wandb.group or cfg.out.name,
        job_type=job,
        name=name or job,
        id=run_id(cfg, name or job),
        resume="allow",
        dir=str(wandb_dir),
        mode=cfg.wandb.mode,
        config=config if config is not None else cfg.model_dump(mode="json"),
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
    )
    try:
        yield run
    finally:
        run.finish()


def run_dirs(cfg: Config) -> list[Path]:
    found = [*cfg.paths.wandb.rglob("offline-run-*"), *cfg.paths.wandb.rglob("run-*")]
    return sorted(p for p in found if p.is_dir())
