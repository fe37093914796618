"""Settings no machine holds, refused before any stage runs: the memory the SAE's training and the
features' bootstrap would ask for, estimated from the config alone (`sae.d_sae: 1e9` ran four
stages, then failed allocating 112 GB; `features.bootstrap_samples: 2e9` asked for 149 GiB)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bbox_sae.config.schema import Config
from bbox_sae.errors import ConfigError

# Per float32 parameter while training: the weight, its gradient and Adam's two moments.
_TRAIN_BYTES_PER_PARAM = 16
# Per batch row and latent: pre-activations, the top-k mask and their gradients (float32).
_TRAIN_BYTES_PER_ACTIVATION = 12
# Per resample and value: the int64 indices and the float64 values they pick (features/significance.py).
_BOOTSTRAP_BYTES_PER_VALUE = 16


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _embedding_dim(cfg: Config) -> int:
    """The encoder's width when its config is on disk (a local dir); 0, a lower bound, otherwise."""
    try:
        return int(json.loads((Path(cfg.embedding.model).expanduser() / "config.json").read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _performance_columns(cfg: Config) -> int:
    build = cfg.build
    if build.performance == "probs":
        return len(cfg.models) * len(build.prob_powers)
    if build.performance == "logprobs":
        return len(cfg.models)
    return 1  # differences: one column for two models, one per model otherwise (times the embedding, for delta_context)


def sae_training_bytes(cfg: Config) -> int:
    """A lower bound: the matrix's width is known only after the build when the encoder is not local."""
    d_in, d_sae = _embedding_dim(cfg) + _performance_columns(cfg), cfg.sae.d_sae
    params = 2 * d_in * d_sae + d_sae + d_in
    return _TRAIN_BYTES_PER_PARAM * params + _TRAIN_BYTES_PER_ACTIVATION * cfg.sae.batch_size * d_sae


def bootstrap_bytes(cfg: Config) -> int:
    from bbox_sae.features.significance import BOOTSTRAP_MAX_N  # values resampled at most

    return _BOOTSTRAP_BYTES_PER_VALUE * cfg.features.bootstrap_samples * BOOTSTRAP_MAX_N


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(cfg: Config, trains: bool, extracts: bool) -> None:
    """Refuse, in one line, a config whose SAE training (`trains`) or features bootstrap
    (`extracts`) needs more memory than this machine has."""
    have = physical_memory()
    if have is None:
        return
    if trains:
        need = sae_training_bytes(cfg)
        if need > have:
            raise ConfigError(
                f"sae.d_sae {cfg.sae.d_sae:,} with sae.batch_size {cfg.sae.batch_size:,}: training this SAE needs at least {_gib(need)} "
                f"(weights, gradients and Adam's moments, and a batch of activations); this machine has {_gib(have)}: lower sae.d_sae or sae.batch_size"
            )
    if extracts:
        need = bootstrap_bytes(cfg)
        if need > have:
            raise ConfigError(
                f"features.bootstrap_samples {cfg.features.bootstrap_samples:,}: the bootstrap needs up to {_gib(need)}; "
                f"this machine has {_gib(have)}: 1000 (the default) is plenty for a 95% interval"
            )
