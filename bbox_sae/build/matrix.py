"""The build stage: join embeddings and every model's log-probs into the performance-aware matrix.

Row = one word: `[a * embedding, b * performance]`, where performance is each model's p(word)
at each power of `prob_powers` (`probs`, the paper's choice; p**0.25 too by default, so that a
difference on words neither model finds likely shows), log p (`logprobs`), or differences
(`delta`). With
`output_feature_weight` w, a and b make the mean row norms of the two parts (1-w)*M and w*M,
M being the mean norm of the unscaled concatenation. Two streaming passes over the shards
(statistics, then writing a memory-mapped `.npy`), never more than `chunk_rows` rows at once,
so the matrix can be far larger than memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from bbox_sae.artifacts import ShardedTable, atomic_write_json, naming_os_errors, read_table, resolve_files
from bbox_sae.config import Config
from bbox_sae.corpus.documents import shard_ranges
from bbox_sae.errors import ArtifactError
from bbox_sae.layout import logprob_column
from bbox_sae.schemas import index_schema

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def _deltas(logprobs: np.ndarray) -> np.ndarray:
    """A − B for two models; each model against the models' mean for more."""
    if logprobs.shape[1] == 2:
        return logprobs[:, :1] - logprobs[:, 1:]
    return logprobs - logprobs.mean(axis=1, keepdims=True)


def performance_columns(logprobs: np.ndarray, mode: str, embedding: np.ndarray | None = None, prob_powers: Sequence[float] = (1.0,)) -> np.ndarray:
    """(rows, n_models) log-probs -> performance features (rows, d_perf).

    `delta_context` is the context direction scaled by the signed difference (Δ ⊗ unit embedding):
    words where the same model wins in similar contexts point the same way, words of unrelated
    contexts do not, so there is no single "A wins" direction for unrelated differences to share."""
    if mode == "probs":
        return np.concatenate([np.exp(power * logprobs) for power in prob_powers], axis=1)
    if mode == "logprobs":
        return logprobs.copy()
    if mode == "delta":
        return _deltas(logprobs)
    unit = embedding / np.maximum(np.linalg.norm(embedding, axis=1, keepdims=True), 1e-12)
    d = _deltas(logprobs)
    return (d[:, :, None] * unit[:, None, :]).reshape(len(d), -1)


def performance_names(models: list[str], mode: str, d_embedding: int = 0, prob_powers: Sequence[float] = (1.0,)) -> list[str]:
    if mode in ("delta", "delta_context"):
        names = [f"delta__{models[0]}-{models[1]}"] if len(models) == 2 else [f"delta__{m}-mean" for m in models]
        return names if mode == "delta" else [f"{n}*e{i}" for n in names for i in range(d_embedding)]
    if mode == "probs":
        return [f"p__{m}" if power == 1 else f"p^{power:g}__{m}" for power in prob_powers for m in models]
    return [f"logprob__{m}" for m in models]


def part_scales(mean_norm_embedding: float, mean_norm_performance: float, mean_norm_joint: float, weight: float) -> tuple[float, float]:
    """Scale factors (a, b) giving mean part norms (1-w)*M and w*M."""
    a = (1 - weight) * mean_norm_joint / mean_norm_embedding if mean_norm_embedding > 0 else 0.0
    b = weight * mean_norm_joint / mean_norm_performance if mean_norm_performance > 0 else 0.0
    return a, b


@dataclass
class _Chunk:
    words: pa.Table
    embedding: np.ndarray
    logprobs: np.ndarray  # (rows, n_models) float64, NaN where missing
    valid: np.ndarray


@dataclass
class BuildStats:
    rows_in: int = 0
    rows: int = 0
    dropped_missing_logprob: int = 0
    dropped_nonfinite_embedding: int = 0
    max_chunk_rows: int = 0
    dropped_by_model: dict = field(default_factory=dict)


def _rebatch(path: Path, columns: list[str], chunk_rows: int) -> Iterator[pa.Table]:
    """Exactly `chunk_rows`-row tables (the last may be shorter) from a Parquet file, streamed."""
    buffer: list[pa.RecordBatch] = []
    held = 0
    # A read error is named here, so that the writer's naming below never claims it.
    with naming_os_errors(path):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows, columns=columns):
            buffer.append(batch)
            held += batch.num_rows
            while held >= chunk_rows:
                table = pa.Table.from_batches(buffer)
                yield table.slice(0, chunk_rows)
                rest = table.slice(chunk_rows)
                buffer = rest.to_batches()
                held = rest.num_rows
    if held:
        yield pa.Table.from_batches(buffer)


def _embedding_matrix(column: pa.ChunkedArray) -> np.ndarray:
    arr = column.combine_chunks()
    dim = arr.type.list_size
    return arr.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)


def _shard_tables(cfg: Config, models: list[str]) -> list[Path]:
    """The per-word tables the build joins: words, embeddings, then each model's log-probs."""
    return [cfg.paths.words, cfg.paths.embeddings, *[cfg.paths.logprobs(m) for m in models]]


def _chunks(cfg: Config, models: list[str], chunk_rows: int) -> Iterator[_Chunk]:
    words_path, emb_path, *lp_paths = _shard_tables(cfg, models)
    words_tbl, emb_tbl = ShardedTable(words_path), ShardedTable(emb_path)
    lp_tbls = [ShardedTable(p) for p in lp_paths]
    names = [str(p.relative_to(cfg.out)) for p in [emb_path, *lp_paths]]
    for k in words_tbl.indices():
        streams = [_rebatch(words_tbl.shard_path(k), ["doc_id", "word_idx", "split"], chunk_rows)]
        if not emb_tbl.shard_path(k).exists():
            raise ArtifactError(f"{names[0]}/ lacks shard {k}; run `bbox embed`")
        streams.append(_rebatch(emb_tbl.shard_path(k), ["doc_id", "word_idx", "embedding"], chunk_rows))
        for name, t in zip(names[1:], lp_tbls):
            if not t.shard_path(k).exists():
                raise ArtifactError(f"{name} lacks shard {k}; run `bbox score`")
            streams.append(_rebatch(t.shard_path(k), ["doc_id", "word_idx", "logprob"], chunk_rows))
        for parts in zip(*streams, strict=True):
            words = parts[0]
            for name, part in zip(names, parts[1:]):
                if part.num_rows != words.num_rows or not (part["word_idx"].equals(words["word_idx"]) and part["doc_id"].equals(words["doc_id"])):
                    raise ArtifactError(f"{name} shard {k} does not line up with {words_path.name}/ (re-run the stage that wrote it)")
            emb = _embedding_matrix(parts[1]["embedding"])
            lp = np.stack([p["logprob"].to_numpy(zero_copy_only=False).astype(np.float64) for p in parts[2:]], axis=1)
            valid = np.isfinite(emb).all(axis=1) & np.isfinite(lp).all(axis=1)
            yield _Chunk(words, emb, lp, valid)


def _temp_path(final: Path, pid: int) -> Path:
    """Where process `pid` writes `final` before renaming it into place."""
    return final.with_name(f".{final.name}.tmp{pid}")


def _remove_stale_temps(cfg: Config) -> None:
    """Temp files of builds killed mid-write (their pid is gone); a live build's are left alone."""
    for final in (cfg.paths.matrix, cfg.paths.index):
        for tmp in final.parent.glob(f".{final.name}.tmp*"):
            pid = tmp.name.rsplit(".tmp", 1)[-1]
            if pid.isdigit() and not _pid_alive(int(pid)):
                tmp.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_shards_complete(cfg: Config, models: list[str]) -> None:
    """Every input table is intact and has a shard for each shard of documents.parquet."""
    n_docs = read_table(cfg.paths.documents, columns=["doc_id"]).num_rows
    expected = set(range(len(shard_ranges(n_docs, cfg.corpus.shard_docs))))
    for path in _shard_tables(cfg, models):
        resolve_files(path)  # verifies every shard's checksum before we trust it
        # ... and every shard of documents.parquet must be there: a missing one is lost words.
        missing = sorted(expected - set(ShardedTable(path).indices()))
        if missing:
            raise ArtifactError(f"{path}: shard(s) {missing} missing (incomplete run?); re-run the stage that writes it")


@dataclass
class _Norms:
    """Mean row norms of the embedding part, the performance part and their concatenation."""

    embedding: float
    performance: float
    joint: float
    d_embedding: int


def _statistics_pass(cfg: Config, models: list[str], stats: BuildStats) -> _Norms:
    """Pass 1: counts of kept and dropped rows (into `stats`) and the mean norms of the parts."""
    mode = cfg.build.performance
    sum_e = sum_p = sum_j = 0.0
    d_emb = None
    for chunk in tqdm(_chunks(cfg, models, cfg.build.chunk_rows), desc="build: statistics", unit="chunk", leave=False):
        stats.max_chunk_rows = max(stats.max_chunk_rows, chunk.words.num_rows)
        stats.rows_in += chunk.words.num_rows
        stats.dropped_nonfinite_embedding += int((~np.isfinite(chunk.embedding).all(axis=1)).sum())
        for i, m in enumerate(models):
            stats.dropped_by_model[m] += int((~np.isfinite(chunk.logprobs[:, i])).sum())
        e = chunk.embedding[chunk.valid].astype(np.float64)
        p = performance_columns(chunk.logprobs[chunk.valid], mode, e, cfg.build.prob_powers)
        ne, np_ = (e**2).sum(1), (p**2).sum(1)
        sum_e += np.sqrt(ne).sum()
        sum_p += np.sqrt(np_).sum()
        sum_j += np.sqrt(ne + np_).sum()
        stats.rows += int(chunk.valid.sum())
        d_emb = chunk.embedding.shape[1]
    if stats.rows == 0:
        raise ArtifactError("build: no word has an embedding and a log-prob from every model")
    stats.dropped_missing_logprob = stats.rows_in - stats.rows - stats.dropped_nonfinite_embedding
    return _Norms(sum_e / stats.rows, sum_p / stats.rows, sum_j / stats.rows, d_emb)


def _write_pass(cfg: Config, models: list[str], rows: int, d_emb: int, d_total: int, a: float, b: float) -> None:
    """Pass 2: scaled rows into a memory-mapped .npy, index rows into a streamed Parquet file,
    each written under a temp name and renamed into place."""
    mode = cfg.build.performance
    tmp_matrix = _temp_path(cfg.paths.matrix, os.getpid())
    tmp_index = _temp_path(cfg.paths.index, os.getpid())
    with naming_os_errors(cfg.paths.matrix):
        matrix = np.lib.format.open_memmap(tmp_matrix, mode="w+", dtype=np.dtype(cfg.build.dtype), shape=(rows, d_total))
    schema = index_schema(models)
    row = 0
    try:
        with naming_os_errors(cfg.paths.index), pq.ParquetWriter(tmp_index, schema, compression="zstd") as writer:
            for chunk in tqdm(_chunks(cfg, models, cfg.build.chunk_rows), desc="build: write", unit="chunk", leave=False):
                v = chunk.valid
                n = int(v.sum())
                if n == 0:
                    continue
                matrix[row : row + n, :d_emb] = a * chunk.embedding[v]
                matrix[row : row + n, d_emb:] = b * performance_columns(chunk.logprobs[v], mode, chunk.embedding[v], cfg.build.prob_powers)
                words = chunk.words.filter(pa.array(v))
                cols = {"row": pa.array(np.arange(row, row + n), pa.int64()), "doc_id": words["doc_id"], "word_idx": words["word_idx"], "split": words["split"]}
                for i, m in enumerate(models):
                    cols[logprob_column(m)] = pa.array(chunk.logprobs[v, i])
                writer.write_table(pa.table(cols, schema=schema))
                row += n
        with naming_os_errors(cfg.paths.matrix):
            matrix.flush()
        del matrix
        os.replace(tmp_matrix, cfg.paths.matrix)
        os.replace(tmp_index, cfg.paths.index)
    except BaseException:
        tmp_matrix.unlink(missing_ok=True)
        tmp_index.unlink(missing_ok=True)
        raise


def run_build(cfg: Config) -> dict:
    cfg.paths.build.mkdir(parents=True, exist_ok=True)
    # build.json is written last and withdrawn first: while it is absent (a build running or
    # killed between replacing matrix.npy and index.parquet) `open_matrix` refuses the pair.
    cfg.paths.build_info.unlink(missing_ok=True)
    _remove_stale_temps(cfg)
    models = [m.name for m in cfg.models]
    _check_shards_complete(cfg, models)
    mode, weight = cfg.build.performance, cfg.build.output_feature_weight
    stats = BuildStats(dropped_by_model={m: 0 for m in models})
    norms = _statistics_pass(cfg, models, stats)
    a, b = part_scales(norms.embedding, norms.performance, norms.joint, weight)
    perf_names = performance_names(models, mode, norms.d_embedding, cfg.build.prob_powers)
    d_total = norms.d_embedding + len(perf_names)
    _write_pass(cfg, models, stats.rows, norms.d_embedding, d_total, a, b)
    info = {
        "rows": stats.rows,
        "rows_in": stats.rows_in,
        "dropped_missing_logprob": stats.dropped_missing_logprob,
        "dropped_nonfinite_embedding": stats.dropped_nonfinite_embedding,
        "missing_logprob_by_model": stats.dropped_by_model,
        "d_embedding": norms.d_embedding,
        "d_in": d_total,
        "performance": mode,
        "prob_powers": cfg.build.prob_powers,
        "performance_columns": perf_names,
        "models": models,
        "output_feature_weight": weight,
        "dtype": cfg.build.dtype,
        "scale_embedding": a,
        "scale_performance": b,
        "mean_norm_embedding": norms.embedding,
        "mean_norm_performance": norms.performance,
        "mean_norm_joint": norms.joint,
        "chunk_rows": cfg.build.chunk_rows,
        "max_chunk_rows": stats.max_chunk_rows,
    }
    atomic_write_json(cfg.paths.build_info, info)
    if stats.rows < stats.rows_in:
        log.info("build: dropped %d of %d words (missing log-prob or non-finite embedding)", stats.rows_in - stats.rows, stats.rows_in)
    return info


# Rows per chunk when a pass encodes the matrix: memory stays at chunk × d_sae activations.
ENCODE_CHUNK_ROWS = 8192


def matrix_chunks(
    matrix: np.ndarray, rows: np.ndarray, chunk_rows: int = ENCODE_CHUNK_ROWS, device: str | None = None, desc: str | None = None
) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """(row ids, those rows as a float32 tensor on `device`) chunk by chunk, in the order of
    `rows`: the one loop every pass over the matrix uses."""
    import torch

    bar = tqdm(total=len(rows), desc=desc, unit="row", leave=False, disable=desc is None)
    for s in range(0, len(rows), chunk_rows):
        idx = rows[s : s + chunk_rows]
        yield idx, torch.from_numpy(np.asarray(matrix[idx], dtype=np.float32)).to(device)
        bar.update(len(idx))
    bar.close()


def open_matrix(cfg: Config) -> tuple[np.ndarray, pa.Table, dict]:
    """The built matrix (memory-mapped, read-only), its index table, and build.json."""
    import json

    paths = cfg.paths
    out = paths.build
    for path in (paths.matrix, paths.index, paths.build_info):
        if not path.exists():
            # build.json is the last file a build writes: without it the build did not finish.
            raise ArtifactError(f"{path}: not found (build not run, or interrupted); run `bbox build`")
    try:
        info = json.loads(paths.build_info.read_text())
        matrix = np.load(paths.matrix, mmap_mode="r")
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{out}: cannot read the built matrix: {err}; re-run `bbox build`") from None
    index = read_table(paths.index)
    rows = info.get("rows", matrix.shape[0]) if isinstance(info, dict) else -1
    if not (matrix.shape[0] == index.num_rows == rows):
        raise ArtifactError(f"{out}: matrix has {matrix.shape[0]} rows, index {index.num_rows}, build.json {rows}; re-run `bbox build`")
    return matrix, index, info
