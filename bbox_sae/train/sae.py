"""SAE training with sae-lens: TopK or BatchTopK, streamed from the memory-mapped matrix.

sae-lens facts this module works around:
- it starts `b_dec` at zero, which leaves most latents dead on data with a mean offset:
  we initialise `b_dec` to the data mean (estimated on a sample of training rows);
- `lr_end` must be set (default lr / 10);
- `SAETrainer` never calls `wandb.init`: we open the run (tracking.wandb_run) around it;
- BatchTopK is saved for inference as JumpReLU; `SAE.load_from_disk` reads either.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from safetensors import SafetensorError

from bbox_sae.artifacts import atomic_write_json, atomic_write_text
from bbox_sae.config import Config, SAEConfig
from bbox_sae.build.matrix import ENCODE_CHUNK_ROWS, matrix_chunks, open_matrix
from bbox_sae.errors import ArtifactError, NumericalError
from bbox_sae.layout import SaeRunLayout, checkpoint_complete, logprob_column

log = logging.getLogger(__name__)


class RowBatches:
    """Endless fixed-size batches of the given rows of a (memory-mapped) matrix, reshuffled every epoch.

    Only one batch is read from disk at a time. The order depends only on (seed, epoch), so a
    resumed run skips the batches it already trained on and sees the same data as an
    uninterrupted one.
    """

    def __init__(self, matrix: np.ndarray, rows: np.ndarray, batch_size: int, seed: int, skip_batches: int = 0, weights: np.ndarray | None = None):
        if len(rows) == 0:
            raise ArtifactError("no training rows (is every document in the holdout split?)")
        self.matrix = matrix
        self.rows = np.asarray(rows, dtype=np.int64)
        self.p = None if weights is None else np.asarray(weights, dtype=np.float64) / np.sum(weights)
        self.batch_size = min(batch_size, len(self.rows))
        self.seed = seed
        self.per_epoch = len(self.rows) // self.batch_size
        self.position = skip_batches
        self.rows_read_max = 0

    def _batch_rows(self, position: int) -> np.ndarray:
        epoch, i = divmod(position, self.per_epoch)
        rng = np.random.default_rng([self.seed, epoch])
        # Weighted: an epoch is as many rows drawn (with replacement) in proportion to their weight.
        order = rng.permutation(len(self.rows)) if self.p is None else rng.choice(len(self.rows), size=len(self.rows), p=self.p)
        return np.sort(self.rows[order[i * self.batch_size : (i + 1) * self.batch_size]])

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        idx = self._batch_rows(self.position)
        self.position += 1
        self.rows_read_max = max(self.rows_read_max, len(idx))
        return torch.from_numpy(np.ascontiguousarray(self.matrix[idx], dtype=np.float32))


def sample_weights(cfg: Config, index, train: np.ndarray) -> np.ndarray | None:
    """`sae.sample_weighting: delta`: train rows drawn in proportion to max(|Δlog p|, median |Δlog p|)
    over the compared pairs, so the dictionary spends its capacity where the models differ while its
    input (with w = 0) stays pure context; the median floor keeps ordinary words in the mix."""
    if cfg.sae.sample_weighting == "none":
        return None
    gaps = [np.abs(index[logprob_column(a)].to_numpy() - index[logprob_column(b)].to_numpy())[train] for a, b in cfg.compare]
    gap = np.nan_to_num(np.max(gaps, axis=0), nan=0.0)
    return np.maximum(gap, max(float(np.median(gap)), 1e-6))


def make_training_sae(sae_cfg: SAEConfig, d_in: int, device: str):
    from sae_lens import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, TopKTrainingSAE, TopKTrainingSAEConfig

    common = dict(
        d_in=d_in,
        d_sae=sae_cfg.d_sae,
        k=sae_cfg.k,
        dtype=sae_cfg.dtype,
        device=device,
        aux_loss_coefficient=sae_cfg.aux_coefficient,
        decoder_init_norm=sae_cfg.decoder_init_norm,
        apply_b_dec_to_input=True,
        normalize_activations="none",
    )
    if sae_cfg.architecture == "batchtopk":
        return BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(**common))
    return TopKTrainingSAE(TopKTrainingSAEConfig(**common))


def load_training_sae(sae_cfg: SAEConfig, path: Path, device: str):
    from sae_lens import BatchTopKTrainingSAE, TopKTrainingSAE

    cls = BatchTopKTrainingSAE if sae_cfg.architecture == "batchtopk" else TopKTrainingSAE
    return cls.load_from_disk(path, device=device)


def load_sae(run_dir: Path, device: str = "cpu"):
    """The trained inference SAE (TopK, or JumpReLU for BatchTopK)."""
    from sae_lens import SAE

    marker = SaeRunLayout(run_dir).sae_config
    if not marker.exists():
        raise ArtifactError(f"{run_dir}: no trained SAE ({marker.name}); run `bbox train`")
    sae = SAE.load_from_disk(run_dir, device=device)
    sae.eval()
    return sae


def sample_mean(matrix: np.ndarray, rows: np.ndarray, seed: int, n: int = 65536) -> np.ndarray:
    pick = np.sort(np.random.default_rng(seed).choice(rows, size=min(n, len(rows)), replace=False))
    return np.asarray(matrix[pick], dtype=np.float64).mean(axis=0)


@torch.no_grad()
def evaluate(sae, matrix: np.ndarray, rows: np.ndarray, batch_size: int = ENCODE_CHUNK_ROWS) -> dict:
    """Explained variance, MSE, mean L0 and dead-latent fraction on the given rows.

    Rows go in a seeded random order: a training SAE (BatchTopK) ranks activations across its
    batch, so its batches must mix documents the way training batches do.
    """
    device = next(sae.parameters()).device
    if len(rows) == 0:
        return {"rows": 0}
    mean = torch.from_numpy(sample_mean(matrix, rows, seed=0)).float().to(device)
    order = np.random.default_rng(0).permutation(rows)
    # Each batch keeps its random members but is read in row order (memory-mapped reads).
    order = np.concatenate([np.sort(order[s : s + batch_size]) for s in range(0, len(order), batch_size)])
    sq_err = total_var = l0 = 0.0
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=device)
    for _, x in matrix_chunks(matrix, order, batch_size, device):
        acts = sae.encode(x)
        recon = sae.decode(acts)
        sq_err += float((recon - x).pow(2).sum())
        total_var += float((x - mean).pow(2).sum())
        l0 += float((acts > 0).sum())
        fired |= (acts > 0).any(0)
    n = len(rows)
    return {
        "rows": n,
        "explained_variance": 1.0 - sq_err / total_var if total_var > 0 else float("nan"),
        "mse": sq_err / (n * matrix.shape[1]),
        "mean_l0": l0 / n,
        "dead_fraction": float((~fired).float().mean()),
    }


@torch.no_grad()
def calibrate_batchtopk_threshold(sae, matrix: np.ndarray, rows: np.ndarray, batch_size: int = 4096) -> float:
    """The one threshold (shared by every latent) at which the saved JumpReLU model fires k latents
    per row on average over `rows`: between the (k*n)-th and (k*n+1)-th largest pre-activation.

    sae-lens saves instead a running average (rate 0.01, started at 0) of each batch's smallest kept
    activation; after a short run it is still far below that value, and the saved model fires 2-3x k
    latents and reconstructs worse than the mean. Only the top k*n+1 values are held, so memory does
    not grow with d_sae.
    """
    keep = int(round(sae.cfg.k * len(rows)))
    device = next(sae.parameters()).device
    top = torch.empty(0, device=device)
    for s in range(0, len(rows), batch_size):
        x = torch.from_numpy(np.asarray(matrix[rows[s : s + batch_size]], dtype=np.float32)).to(device)
        _, hidden_pre = sae.encode_with_hidden_pre(x)
        values = hidden_pre.flatten().double()
        values = values[values > 0]
        if len(top) > keep:
            values = values[values > top[-1]]
        top = torch.cat([top.double(), values])
        if len(top) > keep + 1:
            top = top.topk(keep + 1).values  # sorted, largest first
        else:
            top = top.sort(descending=True).values
    if len(top) <= keep:
        return 0.0  # fewer than k positive pre-activations per row: every one of them fires
    return float((top[keep - 1] + top[keep]) / 2)


def short_run_warnings(sae_cfg: SAEConfig, total_steps: int, batch: int) -> list[str]:
    """Why a run of `total_steps` steps is too short for its dead-latent statistics to mean anything.

    sae-lens counts a latent as dead only after `dead_feature_window` steps without firing, and only
    dead latents get the AuxK loss that revives them: a run shorter than twice the window spends
    most or all of its steps with no dead latent to revive, so its dead fraction stays at whatever
    the initialisation left.
    """
    window = sae_cfg.dead_feature_window
    if total_steps >= 2 * window:
        return []
    return [
        f"{total_steps} training steps < 2 x sae.dead_feature_window ({window}): latents count as dead, and AuxK starts "
        f"reviving them, only after {window} steps without firing; train longer (sae.total_rows >= {2 * window * batch}) "
        f"or lower sae.dead_feature_window to about {max(1, total_steps // 8)}"
    ]


# How a save fails on a full or read-only disk: torch.save as a RuntimeError ("enforce fail at
# inline_container.cc"), safetensors as its own error ("os error 28"), JSON writes as an OSError.
_SAVE_ERRORS = (OSError, RuntimeError, SafetensorError)


def _save_failure(err: Exception) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    if getattr(err, "errno", None) == errno.ENOSPC or "os error 28" in text or "No space left" in text:
        return f"no space left on device ({line})"
    return f"{line} (is the disk full or read-only?)"


def _trainer_class():
    from sae_lens.training.sae_trainer import SAETrainer

    class GuardedTrainer(SAETrainer):
        """Stops at the first non-finite loss, before the bad step can reach a checkpoint; a checkpoint
        that cannot be written stops training with one line naming it."""

        def save_checkpoint(self, checkpoint_name, *args, **kwargs):
            try:
                super().save_checkpoint(checkpoint_name, *args, **kwargs)
            except _SAVE_ERRORS as err:
                partial = Path(self.cfg.checkpoint_path) / checkpoint_name
                # Half written, maybe with its completion mark: resume must never pick it, and its space is wanted back.
                shutil.rmtree(partial, ignore_errors=True)
                raise ArtifactError(
                    f"{partial}: cannot write the training checkpoint: {_save_failure(err)}; "
                    "the last complete checkpoint is kept: free space, then `bbox train --resume`"
                ) from None

        def step(self, batch):
            output = super().step(batch)
            if not torch.isfinite(output.loss):
                raise NumericalError(
                    f"SAE loss became {float(output.loss)} at step {self.n_training_steps}; "
                    "training stopped, the last good checkpoint is kept (lower sae.lr, or check the matrix for NaN/inf)"
                )
            return output

    return GuardedTrainer


def _close_progress_bars() -> None:
    """sae-lens's fit() leaves its progress bar open when a step or a checkpoint fails; closed now, it
    ends its line before the one-line error instead of being drawn again after it."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def _latest_checkpoint(checkpoints: Path) -> Path | None:
    done = [p for p in checkpoints.glob("*") if p.is_dir() and checkpoint_complete(p).exists() and p.name.isdigit()]
    return max(done, key=lambda p: int(p.name)) if done else None


# Temp folders of `_save_inference_model`, in the run dir so the final renames stay on one filesystem.
_SAVE_PREFIX = ".save."


def _save_inference_model(sae, paths: SaeRunLayout) -> None:
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
        except _SAVE_ERRORS as err:
            raise ArtifactError(
                f"{paths.weights}: cannot write the trained SAE: {_save_failure(err)}; free space, then `bbox train --resume`"
            ) from None
        cfg_data = json.loads(Path(cfg_path).read_text())
        os.replace(weights, paths.weights)
        atomic_write_json(paths.sae_config, cfg_data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _withdraw_model(paths: SaeRunLayout) -> None:
    """Until this run saves its own model, nothing in the run dir claims to be a finished SAE
    (a killed run must not leave the old one looking current)."""
    for path in (paths.sae_config, paths.metrics):
        path.unlink(missing_ok=True)
    for stale in paths.root.glob(f"{_SAVE_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


def _split_rows(cfg: Config, index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The train-split mask of the index, and the train and holdout matrix rows."""
    split = index["split"].to_numpy(zero_copy_only=False)
    rows = index["row"].to_numpy()
    train = split == "train"
    train_rows, holdout_rows = rows[train], rows[split == "holdout"]
    if len(train_rows) == 0:
        raise ArtifactError(
            f"{cfg.paths.index}: no training rows: all {len(holdout_rows)} rows are in the holdout split; "
            "lower corpus.holdout_fraction or add documents"
        )
    return train, train_rows, holdout_rows


def checkpoint_key(cfg: Config) -> str:
    """What checkpoints are written under: the train stage's key (the build's recorded digest and
    the train settings), or, where no manifest records the build (`train_sae` on a matrix built
    outside `bbox`), the settings and the build's files as they are now."""
    import hashlib

    from bbox_sae.artifacts import sha256_file
    from bbox_sae.stages import BY_NAME, read_manifest, stage_key

    stage = BY_NAME["train"]
    key = stage_key(stage, cfg, read_manifest(cfg.out))
    if key is not None:
        return key
    paths = cfg.paths
    build = {"build.json": sha256_file(paths.build_info), **{p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in (paths.matrix, paths.index)}}
    return hashlib.sha256(json.dumps({"settings": stage.settings(cfg), "build": build}, sort_keys=True).encode()).hexdigest()[:16]


def _resume_point(paths: SaeRunLayout, resume: bool, key: str) -> Path | None:
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
    if latest is None and paths.checkpoints.exists():
        shutil.rmtree(paths.checkpoints)
    atomic_write_text(paths.checkpoint_key, key + "\n")
    return latest


def _starting_sae(sae_cfg: SAEConfig, latest: Path | None, matrix: np.ndarray, train_rows: np.ndarray, device: str):
    if latest is not None:
        return load_training_sae(sae_cfg, latest, device)
    sae = make_training_sae(sae_cfg, matrix.shape[1], device)
    with torch.no_grad():
        sae.b_dec.data = torch.from_numpy(sample_mean(matrix, train_rows, sae_cfg.seed)).to(sae.b_dec)
    return sae


def _trainer_config(cfg: Config, total_steps: int, batch: int, device: str, checkpoints: Path):
    from sae_lens.config import LoggingConfig, SAETrainerConfig

    sae_cfg = cfg.sae
    return SAETrainerConfig(
        total_training_samples=total_steps * batch,
        train_batch_size_samples=batch,
        lr=sae_cfg.lr,
        lr_end=sae_cfg.lr_end if sae_cfg.lr_end is not None else sae_cfg.lr / 10,
        lr_scheduler_name=sae_cfg.lr_scheduler,
        lr_warm_up_steps=sae_cfg.lr_warm_up_steps,
        lr_decay_steps=sae_cfg.lr_decay_steps,
        device=device,
        dead_feature_window=sae_cfg.dead_feature_window,
        feature_sampling_window=max(1, min(2000, total_steps // 4)),
        n_checkpoints=0,
        checkpoint_path=str(checkpoints),
        logger=LoggingConfig(
            log_to_wandb=cfg.wandb.mode != "disabled",
            log_weights_to_wandb=False,
            wandb_log_frequency=max(1, min(10, total_steps // 20)),
            eval_every_n_wandb_logs=10**9,
        ),
    )


def _make_trainer(cfg: Config, sae, provider: RowBatches, total_steps: int, batch: int, device: str, paths: SaeRunLayout, latest: Path | None):
    """The guarded trainer, at `latest`'s step when resuming, checkpointing every `sae.checkpoint_every` steps."""

    def mark_complete(checkpoint_path: Path | None) -> None:
        # A checkpoint counts only once all its files are written (resume ignores partial ones).
        if checkpoint_path is not None:
            checkpoint_complete(Path(checkpoint_path)).write_text(str(trainer.n_training_steps + 1))
            # Resume needs only the newest complete checkpoint; older ones would pile up without bound.
            for old in paths.checkpoints.iterdir():
                if old.is_dir() and old != Path(checkpoint_path):
                    shutil.rmtree(old, ignore_errors=True)

    trainer_cfg = _trainer_config(cfg, total_steps, batch, device, paths.checkpoints)
    trainer = _trainer_class()(trainer_cfg, sae, provider, save_checkpoint_fn=mark_complete)
    if latest is not None:
        trainer.load_trainer_state(latest)
        # sae-lens saves mid-step: the sample count includes the checkpointed step, the step count does not.
        trainer.n_training_steps = trainer.n_training_samples // batch
        provider.position = trainer.n_training_steps
        log.info("resuming %s from step %d", paths.root.name, trainer.n_training_steps)
    every = cfg.sae.checkpoint_every * batch
    # sae-lens checkpoints once the sample count exceeds a threshold: t - 1 lands exactly on every N steps.
    trainer.checkpoint_thresholds = [t - 1 for t in range(every, total_steps * batch, every) if t > trainer.n_training_samples]
    return trainer


def _calibrate(sae, sae_cfg: SAEConfig, matrix: np.ndarray, train_sample: np.ndarray) -> dict | None:
    """BatchTopK only: replace sae-lens's running threshold by the calibrated one before saving."""
    if sae_cfg.architecture != "batchtopk":
        return None
    threshold = {"trained": float(sae.topk_threshold), "calibrated": calibrate_batchtopk_threshold(sae, matrix, train_sample)}
    sae.topk_threshold.fill_(threshold["calibrated"])
    return threshold


def _log_run(run, inference, matrix: np.ndarray, train_rows: np.ndarray, metrics: dict) -> None:
    import wandb

    freq = _activation_frequency(inference, matrix, train_rows)
    holdout, training_mode = metrics["holdout"], metrics["training_mode"]["holdout"]
    run.log(
        {
            "eval/holdout_explained_variance": holdout.get("explained_variance"),
            "eval/holdout_mse": holdout.get("mse"),
            "eval/holdout_mean_l0": holdout.get("mean_l0"),
            "eval/holdout_dead_fraction": holdout.get("dead_fraction"),
            "eval/holdout_explained_variance_training_mode": training_mode.get("explained_variance"),
            "eval/holdout_mean_l0_training_mode": training_mode.get("mean_l0"),
            "eval/log10_activation_frequency": wandb.Histogram(np.log10(freq + 1e-10)),
            "perf/rows_per_s": metrics["rows_per_s"],
        }
    )
    run.summary.update({"metrics": metrics})
    metrics["wandb_run_id"] = run.id


def train_sae(
    cfg: Config, run_dir: Path, resume: bool = False, wandb_group: str | None = None, resume_key: str | None = None
) -> dict:
    """Train one SAE into `run_dir`.

    `resume` continues from the last checkpoint, but only from checkpoints written under the same
    key (`resume_key`, default `checkpoint_key(cfg)`), i.e. for the same matrix and settings.
    """
    from bbox_sae.models import resolve_device
    from bbox_sae.tracking import wandb_run

    sae_cfg, paths = cfg.sae, SaeRunLayout(run_dir)
    # Before anything is withdrawn: a device this machine lacks must leave the old model as it was.
    device = str(resolve_device(sae_cfg.device, "sae.device"))
    _withdraw_model(paths)
    torch.manual_seed(sae_cfg.seed)
    matrix, index, info = open_matrix(cfg)
    train, train_rows, holdout_rows = _split_rows(cfg, index)
    total_rows = sae_cfg.total_rows or int(math.ceil(sae_cfg.epochs * len(train_rows)))
    batch = min(sae_cfg.batch_size, len(train_rows))
    total_steps = max(1, total_rows // batch)
    warnings = short_run_warnings(sae_cfg, total_steps, batch)
    for w in warnings:
        log.warning("%s: %s", run_dir.name, w)
    latest = _resume_point(paths, resume, resume_key or checkpoint_key(cfg))
    sae = _starting_sae(sae_cfg, latest, matrix, train_rows, device)
    provider = RowBatches(matrix, train_rows, batch, sae_cfg.seed, weights=sample_weights(cfg, index, train))
    trainer = _make_trainer(cfg, sae, provider, total_steps, batch, device, paths, latest)
    steps_before = trainer.n_training_steps
    run_config = {"sae": sae_cfg.model_dump(mode="json"), "build": info, "d_in": matrix.shape[1], "train_rows": len(train_rows)}
    with wandb_run(cfg, "train", config=run_config, group=wandb_group, name=f"train-{run_dir.name}") as run:
        start = time.perf_counter()
        try:
            trainer.fit()
        except BaseException:
            _close_progress_bars()
            raise
        seconds = time.perf_counter() - start
        trained_rows = (trainer.n_training_steps - steps_before) * batch
        train_sample = np.sort(np.random.default_rng(0).choice(train_rows, size=min(20000, len(train_rows)), replace=False))
        threshold = _calibrate(sae, sae_cfg, matrix, train_sample)
        training_mode = {
            "holdout": evaluate(sae, matrix, holdout_rows, batch_size=batch),
            "train_sample": evaluate(sae, matrix, train_sample, batch_size=batch),
        }
        _save_inference_model(sae, paths)
        inference = load_sae(run_dir, device)
        metrics = {
            "run_name": run_dir.name,
            "device": device,
            "k": sae_cfg.k,
            "d_sae": sae_cfg.d_sae,
            "steps": trainer.n_training_steps,
            "resumed_from_step": steps_before if latest is not None else None,
            "train_rows": int(len(train_rows)),
            "rows_trained": int(trained_rows),
            "rows_seen": int(trainer.n_training_steps * batch),
            "epochs_seen": round(trainer.n_training_steps * batch / len(train_rows), 3),
            "warnings": warnings,
            "seconds": round(seconds, 3),
            "rows_per_s": round(trained_rows / seconds, 1) if seconds > 0 else None,
            "batch_rows_read_max": provider.rows_read_max,
            "batchtopk_threshold": threshold,
            "holdout": evaluate(inference, matrix, holdout_rows),
            "train_sample": evaluate(inference, matrix, train_sample),
            "training_mode": training_mode,
        }
        if run is not None:
            _log_run(run, inference, matrix, train_rows, metrics)
    atomic_write_json(paths.metrics, metrics)
    atomic_write_text(paths.run_config, cfg.to_yaml())
    # Finished: only an interrupted run is resumed automatically (`bbox run --force train` retrains).
    paths.checkpoint_key.unlink(missing_ok=True)
    return metrics


@torch.no_grad()
def _activation_frequency(sae, matrix: np.ndarray, rows: np.ndarray, n: int = 20000) -> np.ndarray:
    pick = np.sort(np.random.default_rng(1).choice(rows, size=min(n, len(rows)), replace=False))
    device = next(sae.parameters()).device
    counts = torch.zeros(sae.cfg.d_sae, device=device)
    for _, x in matrix_chunks(matrix, pick, device=device):
        counts += (sae.encode(x) > 0).float().sum(0)
    return (counts / len(pick)).cpu().numpy()


def run_dir_for(cfg: Config) -> Path:
    return cfg.sae_paths.root


def run_train(cfg: Config, resume: bool = False, wandb_group: str | None = None, resume_key: str | None = None) -> dict:
    run_dir = run_dir_for(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = train_sae(cfg, run_dir, resume=resume, wandb_group=wandb_group, resume_key=resume_key)
    print(
        f"trained {run_dir.name} on {metrics['device']}: {metrics['rows_per_s']} rows/s, "
        f"holdout EV {metrics['holdout'].get('explained_variance', float('nan')):.3f}, "
        f"L0 {metrics['holdout'].get('mean_l0', float('nan')):.1f} (k {metrics['k']}), dead {metrics['holdout'].get('dead_fraction', float('nan')):.2%}"
    )
    return metrics

