"""The run's output folder, and the resolved config saved in it."""

from __future__ import annotations

from pathlib import Path

import yaml

from bbox_sae.config.loading import config_from_dict
from bbox_sae.config.schema import Config
from bbox_sae.errors import ConfigError

# The first line of every config.yaml the tool saves: it tells a run's own record (rewritten by
# each command) from a user's config that happens to sit in the output dir (never written over).
SAVED_HEADER = "# bbox-sae: the resolved config of the last command run in this output dir (rewritten by each command)\n"


def _check_dir(out: Path) -> None:
    if out.is_symlink() and not out.exists():
        # mkdir would say only "File exists".
        raise ConfigError(f"output_dir {out}: is a symlink to {out.readlink()}, which does not resolve (dangling, or a loop)")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out}: exists and is not a directory")


def ensure_output_dir(cfg: Config) -> Path:
    _check_dir(cfg.out)
    cfg.out.mkdir(parents=True, exist_ok=True)
    return cfg.out


def _written_by_bbox(text: str) -> bool:
    if text.startswith(SAVED_HEADER):
        return True
    # Saved before the header existed: exactly the canonical dump of the config it holds.
    try:
        return config_from_dict(yaml.safe_load(text)).to_yaml() == text
    except (yaml.YAMLError, ConfigError, RecursionError, ValueError):
        return False


def check_saved_config(cfg: Config) -> None:
    """Refuse an output dir whose config.yaml the tool did not write (a user's own config, e.g.
    `bbox run -c config.yaml -o .`): saving the resolved config would destroy it."""
    _check_dir(cfg.out)
    path = cfg.paths.config
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except UnicodeDecodeError:
        text = ""
    if not _written_by_bbox(text):
        raise ConfigError(
            f"output_dir {cfg.out}: holds {path.name}, which bbox did not write (a config of your own?); a run saves its resolved "
            f"config there and would overwrite it: choose another output dir (-o), or move {path} away"
        )


def save_resolved(cfg: Config) -> Path:
    from bbox_sae.artifacts import atomic_write_text

    ensure_output_dir(cfg)
    check_saved_config(cfg)
    path = cfg.paths.config
    atomic_write_text(path, SAVED_HEADER + cfg.to_yaml())
    return path
