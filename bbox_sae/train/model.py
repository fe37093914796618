"""The SAE itself: sae-lens training and inference models, and what we measure on them
(explained variance, L0, dead latents, activation frequency, the BatchTopK threshold)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bbox_sae.build.matrix import ENCODE_CHUNK_ROWS, matrix_chunks
from bbox_sae.config import SAEConfig
from bbox_sae.errors import ArtifactError
from bbox_sae.layout import SaeRunLayout


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


@torch.no_grad()
def activation_frequency(sae, matrix: np.ndarray, rows: np.ndarray, n: int = 20000) -> np.ndarray:
    pick = np.sort(np.random.default_rng(1).choice(rows, size=min(n, len(rows)), replace=False))
    device = next(sae.parameters()).device
    counts = torch.zeros(sae.cfg.d_sae, device=device)
    for _, x in matrix_chunks(matrix, pick, device=device):
        counts += (sae.encode(x) > 0).float().sum(0)
    return (counts / len(pick)).cpu().numpy()
