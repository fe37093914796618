"""Each latent's top activations per split, streamed over the matrix, and where latents fire."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from bbox_sae.features.encoders import Encoder, encode_rows
from bbox_sae.features.significance import StreamingTopN, percentile_rule


@dataclass
class TopActivations:
    values: dict[str, np.ndarray]  # split -> (d_sae, N), -inf for empty slots
    rows: dict[str, np.ndarray]
    fire_counts: np.ndarray  # (d_sae,) rows with activation > 0, all splits
    n_rows: int


def top_activations(encode: Encoder, matrix: np.ndarray, rows_by_split: dict[str, np.ndarray], d_sae: int, top_n: int, chunk_rows: int) -> TopActivations:
    fire = torch.zeros(d_sae, dtype=torch.long)
    values, rows = {}, {}
    for split, split_rows in rows_by_split.items():
        top = StreamingTopN(d_sae, top_n)
        for idx, acts in encode_rows(encode, matrix, split_rows, chunk_rows, desc=f"features: encode {split}"):
            fire += (acts > 0).sum(0)
            top.update(acts, torch.from_numpy(idx))
        values[split], rows[split] = top.result()
    return TopActivations(values, rows, fire.numpy(), sum(len(r) for r in rows_by_split.values()))


class Firing:
    """Where each of some latents fires over every row (rows × latents, bool), kept per latent as
    the rows it fires on. A top-k SAE fires about k latents a row, so this holds about k row ids a
    row however many latents are asked for: at 3M rows and 512 latents the dense array is 1.5 GB,
    at the paper's 3,000 latents 9 GB. Indexed like that dense array for the reads the pipeline
    makes: `[rows, j]`, `[rows, [j, ...]]` and `[np.ix_(rows, [j, ...])]`."""

    def __init__(self, n_rows: int, rows_of: list[np.ndarray]):
        self.shape = (n_rows, len(rows_of))
        self._rows_of = rows_of

    def column(self, j: int) -> np.ndarray:
        out = np.zeros(self.shape[0], dtype=bool)
        out[self._rows_of[j]] = True
        return out

    def __getitem__(self, key: tuple) -> np.ndarray:
        rows, cols = key
        if isinstance(rows, np.ndarray) and rows.ndim == 2:  # np.ix_(rows, cols)
            rows, cols = rows.ravel(), np.ravel(cols)
        if np.ndim(cols) == 0:
            return self.column(int(cols))[rows]
        n_selected = len(np.zeros(self.shape[0], dtype=bool)[rows])
        return np.stack([self.column(int(j))[rows] for j in cols], axis=1) if len(cols) else np.zeros((n_selected, 0), dtype=bool)


def firing(encode: Encoder, matrix: np.ndarray, latents: list[int], chunk_rows: int) -> Firing:
    """Where each of the given latents fires, over every row of the matrix."""
    index_dtype = np.int32 if matrix.shape[0] < 2**31 else np.int64
    parts: list[list[np.ndarray]] = [[] for _ in latents]
    if latents:
        for idx, acts in encode_rows(encode, matrix, np.arange(matrix.shape[0]), chunk_rows, desc="features: firing"):
            # Column-major nonzeros: each latent's rows come out ascending, chunk after chunk.
            col, row = np.nonzero((acts[:, latents] > 0).numpy().T)
            bounds = np.searchsorted(col, np.arange(len(latents) + 1))
            for j in np.flatnonzero(np.diff(bounds)):
                parts[j].append(idx[row[bounds[j] : bounds[j + 1]]].astype(index_dtype))
    rows_of = [np.concatenate(p) if p else np.zeros(0, dtype=index_dtype) for p in parts]
    return Firing(matrix.shape[0], rows_of)


def _latent_examples(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positive = values > 0
    return values[positive], rows[positive]


def top_words(top: TopActivations, split: str, latent: int) -> np.ndarray:
    """A latent's top rows on a split after the paper's percentile rule."""
    acts, rows = _latent_examples(top.values[split][latent], top.rows[split][latent])
    return rows[percentile_rule(acts)]


def top_records(top: TopActivations, d_sae: int, index: pa.Table) -> tuple[pa.Table, list]:
    """The top activations table and the (latent, split, rank, row, activation, in_top) examples."""
    records, examples = [], []
    for split_name in ("train", "holdout"):
        for latent in range(d_sae):
            acts, rws = _latent_examples(top.values[split_name][latent], top.rows[split_name][latent])
            in_top = percentile_rule(acts)
            for rank, (a, r, t) in enumerate(zip(acts, rws, in_top)):
                records.append((latent, split_name, rank, int(r), float(a)))
                examples.append((latent, split_name, rank, int(r), float(a), bool(t)))
    row_ids = pa.array([t[3] for t in records], pa.int64())
    table = pa.table(
        {
            "latent": pa.array([t[0] for t in records], pa.int32()),
            "split": pa.array([t[1] for t in records], pa.string()),
            "rank": pa.array([t[2] for t in records], pa.int32()),
            "doc_id": index["doc_id"].take(row_ids),
            "word_idx": index["word_idx"].take(row_ids),
            "row": row_ids,
            "activation": pa.array([t[4] for t in records], pa.float32()),
        }
    )
    return table, examples
