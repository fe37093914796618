"""The run's output folder, and the resolved config saved in it."""

from __future__ import annotations

from pathlib import Path

from bbox_sae.config.schema import Config
from bbox_sae.errors import ConfigError


def ensure_output_dir(cfg: Config) -> Path:
    if cfg.out.exists() and not cfg.out.is_dir():
        raise ConfigError(f"output_dir {cfg.out}: exists and is not a directory")
    cfg.out.mkdir(parents=True, exist_ok=True)
    return cfg.out


def save_resolved(cfg: Config) -> Path:
    from bbox_sae.artifacts import atomic_write_text

    ensure_output_dir(cfg)
    path = cfg.paths.config
    atomic_write_text(path, cfg.to_yaml())
    return path
