"""Embedding and build throughput.

- embed: the demo's MiniLM embedder (`load_embedder` with configs/demo.yaml's `embedding`) on demo
  documents, words/s; ours = `WordEmbedder.embed` on shard-sized lists with the configured
  batch_size; baseline = one document at a time, batch 1 (same model, same process, same words;
  the vectors are compared). The two alternate, best of --repeats.
- build: `run_build` rows/s on a synthetic run dir (words/, embeddings/ in float16 and two
  models' logprobs/, sharded like the demo); baseline = the obvious in-memory build (read every
  table whole, compute the scales, `np.save`), which needs the whole matrix in memory.

    .venv/bin/python benchmarks/bench_embed_build.py [--docs 40] [--rows 200000] [--quick]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DEMO_CONFIG,
    base_parser,
    load_snapshot,
    peak_rss_mb,
    print_table,
    results_header,
    setup_torch,
    write_results,
)

NAME = "embed_build"


def bench_embed(cfg, n_docs: int, device: str, repeats: int) -> dict:
    import numpy as np

    from bbox_sae.corpus.documents import load_documents
    from bbox_sae.embedding.stage import load_embedder

    docs = load_documents(cfg.corpus, seed=cfg.seed)
    step = max(1, len(docs) // n_docs)
    texts = [d.text for d in docs[::step][:n_docs]]
    start = time.perf_counter()
    embedder = load_embedder(cfg.embedding.model_copy(update={"device": device}))
    load_s = time.perf_counter() - start
    embedder.embed(["Warm-up: a short sentence."])
    batch_size = embedder.batch_size
    shard = cfg.corpus.shard_docs

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start

    base_times, ours_times = [], []
    for _ in range(repeats):  # alternate the two, best of `repeats`: load on a shared machine drifts
        # Baseline: one document per call, batch 1.
        embedder.batch_size = 1
        base, s = timed(lambda: [v for t in texts for v in embedder.embed([t])])
        base_times.append(s)
        # Ours: the stage's call pattern (one call per shard of documents) with the configured batch size.
        embedder.batch_size = batch_size
        ours, s = timed(lambda: [v for s in range(0, len(texts), shard) for v in embedder.embed(texts[s : s + shard])])
        ours_times.append(s)
    base_s, ours_s = min(base_times), min(ours_times)
    words = sum(len(v) for v in ours)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, base) if len(a))
    return {
        "documents": len(texts),
        "words": words,
        "encoder_windows_tokens": {"window": embedder.window, "stride": embedder.stride},
        "load_s": round(load_s, 2),
        "baseline": {"batch_size": 1, "seconds": round(base_s, 3), "words_per_s": round(words / base_s, 1), "all_seconds": [round(t, 3) for t in base_times]},
        "ours": {
            "batch_size": batch_size,
            "seconds": round(ours_s, 3),
            "words_per_s": round(words / ours_s, 1),
            "all_seconds": [round(t, 3) for t in ours_times],
        },
        "speedup": round(base_s / ours_s, 2),
        "max_abs_vector_diff": diff,
    }


def synthetic_run(out: Path, rows: int, words_per_doc: int = 200, dim: int = 384, shard_docs: int = 32, seed: int = 0):
    """A run dir with words/, embeddings/ and two models' logprobs/, as score + embed would leave it."""
    import numpy as np
    import pyarrow as pa

    from bbox_sae.artifacts import ShardedTable, atomic_write_table
    from bbox_sae.config import config_from_dict
    from bbox_sae.corpus.documents import shard_ranges, split_of
    from bbox_sae.embedding.stage import embeddings_table
    from bbox_sae.layout import RunLayout
    from bbox_sae.schemas import DOCUMENTS_SCHEMA, WORDS_SCHEMA
    from bbox_sae.scoring.stage import LOGPROB_SCHEMA

    rng = np.random.default_rng(seed)
    n_docs = max(1, rows // words_per_doc)
    doc_ids = [f"doc-{i:06d}" for i in range(n_docs)]
    out.mkdir(parents=True, exist_ok=True)
    documents = pa.table(
        {
            "doc_id": doc_ids,
            "text": [" word" * words_per_doc] * n_docs,
            "split": [split_of(d, 0.25, seed) for d in doc_ids],
            "domain": [""] * n_docs,
            "shard": pa.array([i // shard_docs for i in range(n_docs)], pa.int32()),
        },
        schema=DOCUMENTS_SCHEMA,
    )
    paths = RunLayout(out)
    atomic_write_table(paths.documents, documents)
    models = ["model-a", "model-b"]
    tables = {"words": ShardedTable(paths.words), "embeddings": ShardedTable(paths.embeddings)}
    for m in models:
        tables[m] = ShardedTable(paths.logprobs(m))
    for k, (a, b) in enumerate(shard_ranges(n_docs, shard_docs)):
        ids = doc_ids[a:b]
        n = len(ids) * words_per_doc
        col_ids = [d for d in ids for _ in range(words_per_doc)]
        idx = np.tile(np.arange(words_per_doc, dtype=np.int32), len(ids))
        words = pa.table(
            {
                "doc_id": col_ids,
                "word_idx": idx,
                "char_start": (idx * 5).astype(np.int64),
                "char_end": (idx * 5 + 4).astype(np.int64),
                "word": [" word"] * n,
                "split": [split_of(d, 0.25, seed) for d in col_ids],
                "domain": [""] * n,
            },
            schema=WORDS_SCHEMA,
        )
        tables["words"].write(k, words, "bench")
        vectors = [rng.normal(size=(words_per_doc, dim)).astype(np.float32) for _ in ids]
        tables["embeddings"].write(k, embeddings_table(ids, vectors, "float16"), "bench")
        for m in models:
            lp = -rng.gamma(2.0, 2.0, size=n)
            tables[m].write(k, pa.table({"doc_id": col_ids, "word_idx": idx, "logprob": lp}, schema=LOGPROB_SCHEMA), "bench")
    cfg = config_from_dict(
        {
            "output_dir": str(out),
            "corpus": {"path": "unused", "shard_docs": shard_docs},
            "models": [{"name": m, "source": "parquet", "path": "unused"} for m in models],
            "build": {"performance": "probs", "output_feature_weight": 0.7},
            "wandb": {"mode": "disabled"},
        }
    )
    return cfg, n_docs * words_per_doc


def naive_build(cfg) -> int:
    """Everything in memory at once: read, concatenate, scale, save."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bbox_sae.build.matrix import part_scales, performance_columns

    def whole(folder: Path) -> pa.Table:
        return pa.concat_tables([pq.read_table(p) for p in sorted(folder.glob("part-*.parquet"))])

    models = [m.name for m in cfg.models]
    words = whole(cfg.paths.words)
    emb_col = whole(cfg.paths.embeddings)["embedding"].combine_chunks()
    emb = emb_col.values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, emb_col.type.list_size)
    lp = np.stack([whole(cfg.paths.logprobs(m))["logprob"].to_numpy(zero_copy_only=False) for m in models], axis=1)
    valid = np.isfinite(emb).all(1) & np.isfinite(lp).all(1)
    e, p = emb[valid].astype(np.float64), performance_columns(lp[valid], cfg.build.performance)
    ne, np_ = (e**2).sum(1), (p**2).sum(1)
    a, b = part_scales(np.sqrt(ne).mean(), np.sqrt(np_).mean(), np.sqrt(ne + np_).mean(), cfg.build.output_feature_weight)
    matrix = np.concatenate([a * e, b * p], axis=1).astype(np.float32)
    out = cfg.out / "naive-build"
    out.mkdir(exist_ok=True)
    np.save(out / cfg.paths.matrix.name, matrix)
    index = words.filter(pa.array(valid)).select(["doc_id", "word_idx", "split"])
    index = index.append_column("row", pa.array(np.arange(index.num_rows)))
    pq.write_table(index, out / cfg.paths.index.name, compression="zstd")
    return int(valid.sum())


def bench_build(rows: int, repeats: int) -> dict:
    from bbox_sae.build.matrix import run_build

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        cfg, n = synthetic_run(Path(tmp) / "run", rows)
        make_s = time.perf_counter() - start
        ours_s, base_s = [], []
        for _ in range(repeats):  # alternate, best of `repeats`
            start = time.perf_counter()
            info = run_build(cfg)
            ours_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            base_rows = naive_build(cfg)
            base_s.append(time.perf_counter() - start)
        assert base_rows == info["rows"], (base_rows, info["rows"])
        o, b = min(ours_s), min(base_s)
        return {
            "rows": info["rows"],
            "d_in": info["d_in"],
            "shards": len(list(cfg.paths.words.glob("part-*.parquet"))),
            "chunk_rows": info["chunk_rows"],
            "synthetic_setup_s": round(make_s, 2),
            "ours": {"seconds": round(o, 3), "rows_per_s": round(info["rows"] / o, 1), "all_seconds": [round(s, 3) for s in ours_s]},
            "baseline": {"seconds": round(b, 3), "rows_per_s": round(info["rows"] / b, 1), "all_seconds": [round(s, 3) for s in base_s]},
            "speedup": round(b / o, 2),
        }


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--config", default=str(DEMO_CONFIG))
    p.add_argument("--docs", type=int, default=40, help="demo documents to embed")
    p.add_argument("--rows", type=int, default=200_000, help="rows of the synthetic build")
    p.add_argument("--repeats", type=int, default=2, help="alternating repeats of each measurement (best counts)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, e.g. embedding.model=DIR --set embedding.package=null",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.docs, args.rows, args.repeats = min(args.docs, 3), min(args.rows, 4000), 1
    threads = setup_torch(args.threads)
    from bbox_sae.config import load_config

    cfg = load_config(args.config, args.overrides)
    before = load_snapshot()
    print("[embed_build] embedding ...", file=sys.stderr, flush=True)
    embed = bench_embed(cfg, args.docs, args.device, args.repeats)
    print("[embed_build] build ...", file=sys.stderr, flush=True)
    build = bench_build(args.rows, args.repeats)
    after = load_snapshot()

    print_table(
        f"Embedding: {cfg.embedding.package or cfg.embedding.model} on {embed['documents']} demo documents ({embed['words']} words), "
        f"{threads} threads, {args.device}, best of {args.repeats}",
        ["method", "batch", "seconds", "words/s", "× baseline"],
        [
            ["baseline (1 doc/call)", 1, embed["baseline"]["seconds"], embed["baseline"]["words_per_s"], 1.0],
            ["ours (WordEmbedder)", embed["ours"]["batch_size"], embed["ours"]["seconds"], embed["ours"]["words_per_s"], embed["speedup"]],
        ],
        note=f"max |Δ vector| between the two: {embed['max_abs_vector_diff']:.2e}; model load {embed['load_s']} s (not counted)",
    )
    print_table(
        f"Build: {build['rows']} synthetic rows × {build['d_in']} ({build['shards']} shards), best of {args.repeats}",
        ["method", "seconds", "rows/s", "× baseline"],
        [
            ["baseline (in-memory)", build["baseline"]["seconds"], build["baseline"]["rows_per_s"], 1.0],
            ["ours (run_build, streamed)", build["ours"]["seconds"], build["ours"]["rows_per_s"], build["speedup"]],
        ],
        note="run_build verifies every shard's checksum and streams two passes in chunk_rows pieces (memory bounded); the baseline holds everything in memory.",
    )
    write_results(
        args,
        NAME,
        {
            **results_header(args, NAME, threads, args.device),
            "embedding_model": cfg.embedding.package or cfg.embedding.model,
            "embed": embed,
            "build": build,
            "ratios": {"embed_words_per_s_ours_over_baseline": embed["speedup"], "build_rows_per_s_ours_over_baseline": build["speedup"]},
            "peak_rss_mb": peak_rss_mb(),
            "load_before": before,
            "load_after": after,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
