"""Encoders that turn matrix rows into latent activations, and the one chunked pass over rows.

The trained SAE, or a baseline of the same width (`random`: an untrained TopK SAE, `kmeans`:
cluster memberships), optionally behind the Δ-blind view of the rows (`features.ranking`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from bbox_sae.build.matrix import matrix_chunks
from bbox_sae.config import Config

Encoder = Callable[[torch.Tensor], torch.Tensor]


def sae_encoder(sae) -> Encoder:
    device = next(sae.parameters()).device

    @torch.no_grad()
    def encode(x: torch.Tensor) -> torch.Tensor:
        return sae.encode(x.to(device)).float().cpu()

    return encode


def random_sae_encoder(cfg: Config, d_in: int, mean: np.ndarray) -> Encoder:
    """An untrained TopK SAE of the trained one's shape (per-row top-k, so it can encode any row)."""
    from bbox_sae.train.model import make_training_sae

    torch.manual_seed(cfg.sae.seed)
    random_cfg = cfg.sae.model_copy(update={"architecture": "topk"})
    sae = make_training_sae(random_cfg, d_in, "cpu")
    with torch.no_grad():
        sae.b_dec.data = torch.from_numpy(mean).to(sae.b_dec)
    sae.eval()
    return sae_encoder(sae)


def kmeans_encoder(cfg: Config, matrix: np.ndarray, train_rows: np.ndarray) -> Encoder:
    """k-means with k = d_sae over training rows; a cluster's 'activation' is 1 / (1 + distance) on its members."""
    from sklearn.cluster import MiniBatchKMeans

    n_clusters = min(cfg.sae.d_sae, len(train_rows))
    sample = np.sort(np.random.default_rng(cfg.seed).choice(train_rows, size=min(len(train_rows), 200_000), replace=False))
    km = MiniBatchKMeans(n_clusters=n_clusters, random_state=cfg.seed, batch_size=4096, n_init=3).fit(np.asarray(matrix[sample], dtype=np.float32))
    centers = torch.from_numpy(km.cluster_centers_.astype(np.float32))

    def encode(x: torch.Tensor) -> torch.Tensor:
        dist = torch.cdist(x.float(), centers)
        nearest = dist.argmin(1)
        acts = torch.zeros((len(x), cfg.sae.d_sae))
        acts[torch.arange(len(x)), nearest] = 1.0 / (1.0 + dist[torch.arange(len(x)), nearest])
        return acts

    return encode


# ---------------------------------------------------------------- Δ-blind ranking


def blind_rows(x: torch.Tensor, d_embedding: int, performance: str, n_models: int) -> torch.Tensor:
    """The rows with the models made indistinguishable: each model's performance column replaced by
    the models' mean (per power of p, `build.prob_powers`; `delta` columns by 0), the context part
    unchanged.

    A latent's activation on such a row depends on the context and on how predictable the word is
    overall, never on which model predicted it better; so rows ranked by it can be tested on their
    Δ without circularity (swapping A and B on any word leaves the ranking unchanged, so under
    the null of exchangeable models the selected Δ are symmetric about 0)."""
    out = x.clone()
    perf = out[:, d_embedding:]
    if performance in ("delta", "delta_context"):
        perf.zero_()
    else:
        by_model = perf.reshape(len(perf), -1, n_models)  # one group of n_models columns per power
        perf.copy_(by_model.mean(dim=2, keepdim=True).expand_as(by_model).reshape(perf.shape))
    return out


def ranking_encoder(encode: Encoder, d_embedding: int, performance: str, ranking: str, n_models: int) -> Encoder:
    """The encoder whose activations choose a latent's examples (`features.ranking`)."""
    if ranking == "full":
        return encode
    return lambda x: encode(blind_rows(x, d_embedding, performance, n_models))


def encode_rows(encode: Encoder, matrix: np.ndarray, rows: np.ndarray, chunk_rows: int, desc: str | None = None) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """(row ids, activations) chunk by chunk."""
    for idx, x in matrix_chunks(matrix, rows, chunk_rows, desc=desc):
        yield idx, encode(x)


def make_encoder(cfg: Config, source: str, matrix: np.ndarray, train_rows: np.ndarray, info: dict) -> tuple[Encoder, int]:
    """The ranking encoder of a feature source (`sae`, `random`, `kmeans`) and its width: the
    activations the features stage chose examples by, so later stages see the same latents."""
    from bbox_sae.train.model import load_sae, sample_mean

    if source == "random":
        encode, d_sae = random_sae_encoder(cfg, matrix.shape[1], sample_mean(matrix, train_rows, cfg.sae.seed)), cfg.sae.d_sae
    elif source == "kmeans":
        encode, d_sae = kmeans_encoder(cfg, matrix, train_rows), cfg.sae.d_sae
    else:
        sae = load_sae(cfg.sae_paths.root)
        encode, d_sae = sae_encoder(sae), sae.cfg.d_sae
    return ranking_encoder(encode, info["d_embedding"], info["performance"], cfg.features.ranking, len(info["models"])), d_sae
