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
    """Where each of the given latents fires, over every row of the matrix.

    Every chunk's firings go into one buffer, grown as it fills, and each latent's rows are cut
    from it once the pass is done. Kept as a small array per chunk and latent, they were placed by
    glibc in the space the chunk's freed ~25 MB temporaries had left, so no later chunk fitted
    there and the heap grew by about one chunk per chunk: 4.7 GB at 3M words, a matrix's worth
    (docs/scaling.md, measured with benchmarks/stage_memory.py)."""
    index_dtype = np.int32 if matrix.shape[0] < 2**31 else np.int64
    n_chunks = -(-matrix.shape[0] // chunk_rows)
    bounds = np.zeros((n_chunks, len(latents) + 1), dtype=np.int64)  # per chunk, where each latent's rows start in it
    starts = np.zeros(n_chunks + 1, dtype=np.int64)  # where each chunk's rows start in `found`
    found = np.empty(max(matrix.shape[0], 1), dtype=index_dtype)
    if latents:
        chunks = encode_rows(encode, matrix, np.arange(matrix.shape[0]), chunk_rows, desc="features: firing")
        for c, (idx, acts) in enumerate(chunks):
            # Column-major nonzeros: each latent's rows come out ascending.
            col, row = np.nonzero((acts[:, latents] > 0).numpy().T)
            bounds[c] = np.searchsorted(col, np.arange(len(latents) + 1))
            starts[c + 1] = starts[c] + len(row)
            if starts[c + 1] > len(found):
                # Room for the whole pass at the rate so far, with a tenth to spare.
                projected = int(1.1 * starts[c + 1] / (c + 1) * n_chunks)
                grown = np.empty(max(projected, starts[c + 1], len(found) * 5 // 4), dtype=index_dtype)
                grown[: starts[c]] = found[: starts[c]]
                found = grown
            found[starts[c] : starts[c + 1]] = idx[row]
    rows_of = [
        np.concatenate([found[starts[c] + bounds[c, j] : starts[c] + bounds[c, j + 1]] for c in range(n_chunks)] or [found[:0]]) for j in range(len(latents))
    ]
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
