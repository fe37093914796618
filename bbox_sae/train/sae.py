"""SAE training with sae-lens: TopK or BatchTopK, streamed from the memory-mapped matrix.

sae-lens facts this module works around:
- it starts `b_dec` at zero, which leaves most latents dead on data with a mean offset:
  we initialise `b_dec` to the data mean (estimated on a sample of training rows);
- `lr_end` must be set (default lr / 10);
- `SAETrainer` never calls `wandb.init`: we open the run (tracking.wandb_run) around it;
- BatchTopK is saved for inference as JumpReLU; `SAE.load_from_disk` reads either.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from bbox_sae.artifacts import atomic_write_json, atomic_write_text
from bbox_sae.build.matrix import open_matrix
from bbox_sae.config import Config, SAEConfig
from bbox_sae.errors import ArtifactError, NumericalError
from bbox_sae.layout import SaeRunLayout, checkpoint_complete, logprob_column
from bbox_sae.train.checkpoints import SAVE_ERRORS, checkpoint_key, resume_point, save_failure, save_inference_model, withdraw_model
from bbox_sae.train.model import activation_frequency, calibrate_batchtopk_threshold, evaluate, load_sae, load_training_sae, make_training_sae, sample_mean

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
        self._order_epoch, self._order = -1, np.zeros(0, dtype=np.int64)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        # Drawn once per epoch, not per batch: a batch then costs its own rows, not all the training rows.
        if epoch != self._order_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            # Weighted: an epoch is as many rows drawn (with replacement) in proportion to their weight.
            self._order = rng.permutation(len(self.rows)) if self.p is None else rng.choice(len(self.rows), size=len(self.rows), p=self.p)
            self._order_epoch = epoch
        return self._order

    def _batch_rows(self, position: int) -> np.ndarray:
        epoch, i = divmod(position, self.per_epoch)
        order = self._epoch_order(epoch)
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


def _trainer_class():
    from sae_lens.training.sae_trainer import SAETrainer

    class GuardedTrainer(SAETrainer):
        """Stops at the first non-finite loss, before the bad step can reach a checkpoint; a checkpoint
        that cannot be written stops training with one line naming it."""

        def save_checkpoint(self, checkpoint_name, *args, **kwargs):
            try:
                super().save_checkpoint(checkpoint_name, *args, **kwargs)
            except SAVE_ERRORS as err:
                partial = Path(self.cfg.checkpoint_path) / checkpoint_name
                # Half written, maybe with its completion mark: resume must never pick it, and its space is wanted back.
                shutil.rmtree(partial, ignore_errors=True)
                raise ArtifactError(
                    f"{partial}: cannot write the training checkpoint: {save_failure(err)}; "
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


def _split_rows(cfg: Config, index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The train-split mask of the index, and the train and holdout matrix rows."""
    split = index["split"].to_numpy(zero_copy_only=False)
    rows = index["row"].to_numpy()
    train = split == "train"
    train_rows, holdout_rows = rows[train], rows[split == "holdout"]
    if len(train_rows) == 0:
        raise ArtifactError(
            f"{cfg.paths.index}: no training rows: all {len(holdout_rows)} rows are in the holdout split; lower corpus.holdout_fraction or add documents"
        )
    return train, train_rows, holdout_rows


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
        logger=_metrics_only(LoggingConfig)(
            log_to_wandb=cfg.wandb.mode != "disabled",
            log_weights_to_wandb=False,
            wandb_log_frequency=max(1, min(10, total_steps // 20)),
            eval_every_n_wandb_logs=10**9,
        ),
    )


def _metrics_only(logging_config: type) -> type:
    """sae-lens's logging with its metrics and none of its per-checkpoint artifacts: it logs one
    at every checkpoint, which with `log_weights_to_wandb` off holds only cfg.json (the demo's
    train run had ten `sae_None_None_512`). The report logs the trained SAE once, as a model
    artifact with its metrics (`report.wandb_tables`)."""

    class MetricsOnly(logging_config):
        def log(self, *args, **kwargs) -> None:
            return None

    return MetricsOnly


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

    freq = activation_frequency(inference, matrix, train_rows)
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


def train_sae(cfg: Config, run_dir: Path, resume: bool = False, wandb_group: str | None = None, resume_key: str | None = None) -> dict:
    """Train one SAE into `run_dir`.

    `resume` continues from the last checkpoint, but only from checkpoints written under the same
    key (`resume_key`, default `checkpoint_key(cfg)`), i.e. for the same matrix and settings.
    """
    from bbox_sae.models import resolve_device
    from bbox_sae.tracking import wandb_run

    sae_cfg, paths = cfg.sae, SaeRunLayout(run_dir)
    # Before anything is withdrawn: a device this machine lacks must leave the old model as it was.
    device = str(resolve_device(sae_cfg.device, "sae.device"))
    withdraw_model(paths)
    torch.manual_seed(sae_cfg.seed)
    matrix, index, info = open_matrix(cfg)
    train, train_rows, holdout_rows = _split_rows(cfg, index)
    total_rows = sae_cfg.total_rows or int(math.ceil(sae_cfg.epochs * len(train_rows)))
    batch = min(sae_cfg.batch_size, len(train_rows))
    total_steps = max(1, total_rows // batch)
    warnings = short_run_warnings(sae_cfg, total_steps, batch)
    for w in warnings:
        log.warning("%s: %s", run_dir.name, w)
    latest = resume_point(paths, resume, resume_key or checkpoint_key(cfg))
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
        save_inference_model(sae, paths)
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
