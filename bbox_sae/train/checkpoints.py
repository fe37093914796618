"""Checkpoints and the saved model: resume only from a checkpoint written under the same train
key, and save the inference model atomically."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import tempfile
from pathlib import Path

from safetensors import SafetensorError

from bbox_sae.artifacts import atomic_write_json, atomic_write_text
from bbox_sae.config import Config
from bbox_sae.errors import ArtifactError
from bbox_sae.layout import SaeRunLayout, checkpoint_complete

log = logging.getLogger(__name__)

# How a save fails on a full or read-only disk: torch.save as a RuntimeError ("enforce fail at
# inline_container.cc"), safetensors as its own error ("os error 28"), JSON writes as an OSError.
SAVE_ERRORS = (OSError, RuntimeError, SafetensorError)


def save_failure(err: Exception) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    if getattr(err, "errno", None) == errno.ENOSPC or "os error 28" in text or "No space left" in text:
        return f"no space left on device ({line})"
    return f"{line} (is the disk full or read-only?)"


def _latest_checkpoint(checkpoints: Path) -> Path | None:
    done = [p for p in checkpoints.glob("*") if p.is_dir() and checkpoint_complete(p).exists() and p.name.isdigit()]
    return max(done, key=lambda p: int(p.name)) if done else None


# Temp folders of `save_inference_model`, in the run dir so the final renames stay on one filesystem.
_SAVE_PREFIX = ".save."


def save_inference_model(sae, paths: SaeRunLayout) -> None:
    """sae-lens's save, made atomic: weights, then cfg.json (what `load_sae` and `bbox run` look
    for) last, each moved into place by rename, so a kill mid-save leaves no torn model. cfg.json
    is rewritten with sorted keys: sae-lens's key order varies between processes, and a re-run
    should give identical files."""
    tmp = Path(tempfile.mkdtemp(prefix=_SAVE_PREFIX, dir=paths.root))
    try:
        try:
            weights, cfg_path = sae.save_inference_model(tmp)
            with open(weights, "rb") as fh:
                os.fsync(fh.fileno())
        except SAVE_ERRORS as err:
            raise ArtifactError(f"{paths.weights}: cannot write the trained SAE: {save_failure(err)}; free space, then `bbox train --resume`") from None
        cfg_data = json.loads(Path(cfg_path).read_text())
        os.replace(weights, paths.weights)
        atomic_write_json(paths.sae_config, cfg_data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def withdraw_model(paths: SaeRunLayout) -> None:
    """Until this run saves its own model, nothing in the run dir claims to be a finished SAE
    (a killed run must not leave the old one looking current)."""
    for path in (paths.sae_config, paths.metrics):
        path.unlink(missing_ok=True)
    for stale in paths.root.glob(f"{_SAVE_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


def checkpoint_key(cfg: Config) -> str:
    """What checkpoints are written under when the train stage's key is not given (`train_sae` on a
    matrix built outside `bbox`): the train settings and the build's files as they are now."""
    import hashlib

    from bbox_sae.artifacts import sha256_file
    from bbox_sae.config import key_settings

    paths = cfg.paths
    build = {"build.json": sha256_file(paths.build_info), **{p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in (paths.matrix, paths.index)}}
    return hashlib.sha256(json.dumps({"settings": {"sae": key_settings(cfg.sae)}, "build": build}, sort_keys=True).encode()).hexdigest()[:16]


# What reading a damaged checkpoint raises: torch's zip reader (RuntimeError), the unpickler (a
# truncated stream, or a pickle asking for more than tensors and numbers), safetensors' reader.
_LOAD_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError, SafetensorError)


def damage(checkpoint: Path) -> str | None:
    """Why training cannot resume from `checkpoint` (a truncated `trainer_state.pt`, torn weights, a
    pickle that is not a trainer state), None when it can: read as the resume will read it, but
    before anything is trained or removed."""
    import torch
    from sae_lens.constants import SAE_WEIGHTS_FILENAME, TRAINER_STATE_FILENAME
    from safetensors.torch import load_file

    try:
        # weights_only: a trainer state holds tensors and numbers; code in a pickle is refused, not run.
        state = torch.load(checkpoint / TRAINER_STATE_FILENAME, map_location="cpu", weights_only=True)
        load_file(checkpoint / SAE_WEIGHTS_FILENAME)
    except _LOAD_ERRORS as err:
        text = " ".join(str(err).split())[:200] or type(err).__name__
        return f"{type(err).__name__}: {text}"
    if not isinstance(state, dict) or not {"optimizer", "n_training_samples"} <= set(state):
        return f"{TRAINER_STATE_FILENAME} is not a trainer state"
    return None


def resume_point(paths: SaeRunLayout, resume: bool, key: str) -> Path | None:
    """The checkpoint to resume from (None: start afresh, with the old checkpoints removed). Only
    checkpoints written under `key` are resumed: others were trained on another matrix or with other
    settings, and continuing them would pass their model off as this one. Claims the folder for `key`."""
    try:
        written_under = paths.checkpoint_key.read_text().strip()
    except OSError:
        written_under = None
    if resume and written_under != key and _latest_checkpoint(paths.checkpoints) is not None:
        log.warning("%s: not resuming: its checkpoints were written for another matrix or other sae settings; training afresh", paths.root.name)
    latest = _latest_checkpoint(paths.checkpoints) if resume and written_under == key else None
    why = damage(latest) if latest is not None else None
    if why is not None:
        # Only the newest complete checkpoint is kept: there is none older to fall back to. Left
        # in place, every later `bbox run` died on it until the user removed checkpoints/.
        log.warning("%s: checkpoint %s cannot be resumed from (%s); training afresh", paths.root.name, latest, why)
        latest = None
    if latest is None and paths.checkpoints.exists():
        shutil.rmtree(paths.checkpoints)
    atomic_write_text(paths.checkpoint_key, key + "\n")
    return latest
