"""The score stage: per-word log-probs for every model, on the words `corpus.ingest` wrote.

Artifacts (`cfg.paths.<name>`; files and columns in docs/artifacts.md):
- `logprobs(model)`: sharded; doc_id, word_idx, logprob (null where the model gave NaN/inf), and
  for a model scored in process top_tokens, top_logprobs (`ModelConfig.alternatives`)
Shard k holds documents [k * shard_docs, (k + 1) * shard_docs) of `documents` in every
table, so a killed run redoes only unfinished shards and sharded workers never collide.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm.auto import tqdm

from bbox_sae.artifacts import ShardedTable, atomic_write_json, read_table, require_columns, sha256_file
from bbox_sae.config import Config, ModelConfig, key_settings
from bbox_sae.corpus.documents import parse_shard, shard_key, shard_ranges
from bbox_sae.corpus.words import word_spans
from bbox_sae.errors import ArtifactError, ScoringError
from bbox_sae.schemas import LOGPROB_ALTERNATIVES_SCHEMA, LOGPROB_SCHEMA
from bbox_sae.scoring.align import align_logprobs, first_token_of_words
from bbox_sae.scoring.base import LOGPROB_RULE, Scorer, ScoringStats, TokenScores, largest_positive

log = logging.getLogger(__name__)


def make_scorer(model_cfg: ModelConfig, cfg: Config) -> Scorer:
    """Build the scorer a model's `source` names (loading weights for local models)."""
    if model_cfg.source == "endpoint":
        from bbox_sae.scoring.endpoint import EndpointScorer

        return EndpointScorer.from_config(model_cfg, cfg)
    import torch

    from bbox_sae.models import TORCH_DTYPES, causal_lm_location, load_causal_lm, resolve_device, resolve_head, resolve_scoring_dtype
    from bbox_sae.scoring.hf import HFScorer

    device = resolve_device(model_cfg.device, f"model '{model_cfg.name}': device")
    location = causal_lm_location(model_cfg.source, model_cfg.path, model_cfg.package, model_cfg.file, cfg.cache)
    dtype = resolve_scoring_dtype(model_cfg.dtype, device)
    head = resolve_head(model_cfg.head, device, dtype)
    body = None if dtype == "mixed" else TORCH_DTYPES[dtype]
    # An fp32 head (and `mixed`) needs the fp32 weights: the scorer keeps them, then converts the body.
    model, tokenizer = load_causal_lm(location, device, body if head == "model" and body else torch.float32, model_cfg.device_map)
    return HFScorer(
        model_cfg.name,
        model,
        tokenizer,
        start_token=model_cfg.start_token,
        window=model_cfg.window,
        stride=model_cfg.stride,
        batch_size=model_cfg.batch_size,
        logprob_chunk=model_cfg.logprob_chunk,
        dtype=body,
        bf16_matmuls=dtype == "mixed",
        head=head,
        refine_top=model_cfg.refine_top,
        alternatives=model_cfg.alternatives,
    )


def model_key(model_cfg: ModelConfig) -> str:
    """What one model's scores depend on: its key settings (config/keys.py), what `dtype: auto`
    means on this host, and the version of the rounding code where it is used."""
    relevant = key_settings(model_cfg)
    if model_cfg.dtype == "auto" and model_cfg.source in ("hf", "gguf"):
        from bbox_sae.models import SCORING_DTYPE_AUTO, cpu_has_native_bf16

        relevant["dtype_auto"] = SCORING_DTYPE_AUTO
        if not cpu_has_native_bf16():
            # auto means float32 on such a CPU: its scores are not those of `mixed`.
            relevant["cpu_native_bf16"] = False
    if model_cfg.source in ("hf", "gguf") and (model_cfg.dtype in ("auto", "mixed") or model_cfg.head == "refined"):
        from bbox_sae.scoring.precision import PRECISION_VERSION

        relevant["precision_version"] = PRECISION_VERSION
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def user_logprobs_path(model_cfg: ModelConfig) -> Path:
    src = Path(model_cfg.path).expanduser()
    if not src.exists():
        raise ArtifactError(f"model '{model_cfg.name}': {src}: log-prob file not found (models[].path of a `source: parquet` model)")
    return src


def user_logprobs_checksum(model_cfg: ModelConfig) -> str:
    """The content of a `source: parquet` model's file (a folder of Parquet files: all of them)."""
    src = user_logprobs_path(model_cfg)
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(src) if f != src else ''}\x00{sha256_file(f)}\x00".encode())
    return h.hexdigest()[:16]


def logprob_shard_keys(model_cfg: ModelConfig, documents: pa.Table, ranges: list[tuple[int, int]]) -> dict[int, str]:
    settings = [model_key(model_cfg)]
    if model_cfg.source == "parquet":
        # Imported, not computed: the shard is only as current as the user's file.
        settings.append("parquet:" + user_logprobs_checksum(model_cfg))
    return {k: shard_key(documents.slice(a, b - a), *settings) for k, (a, b) in enumerate(ranges)}


def _score_in_groups(scorer: Scorer, pairs: list[tuple[str, str]], model_cfg: ModelConfig):
    """Score a shard a few batches at a time, so the progress bar moves within a shard
    (scores do not depend on how documents are batched)."""
    in_flight = model_cfg.concurrency * len(model_cfg.endpoints) if model_cfg.source == "endpoint" else 1
    group = 2 * model_cfg.batch_size * in_flight
    for g in range(0, len(pairs), group):
        yield from scorer.score(pairs[g : g + group])


def word_logprob_rows(
    doc_id: str, text: str, offsets: np.ndarray, logprobs: np.ndarray, spans: np.ndarray | None = None
) -> tuple[list, np.ndarray, np.ndarray]:
    spans = word_spans(text) if spans is None else spans
    per_word = align_logprobs(offsets, logprobs, spans)
    return [doc_id] * len(spans), np.arange(len(spans), dtype=np.int32), per_word


def score_model(cfg: Config, model_cfg: ModelConfig, documents: pa.Table, shard: tuple[int, int] = (0, 1)) -> dict:
    table = ShardedTable(cfg.paths.logprobs(model_cfg.name))
    ranges = shard_ranges(documents.num_rows, cfg.corpus.shard_docs)
    mine = [k for k in range(len(ranges)) if k % shard[1] == shard[0]]
    keys = logprob_shard_keys(model_cfg, documents, ranges)
    todo = [k for k in mine if not table.has(k, keys[k])]
    stats = ScoringStats()
    if model_cfg.source == "parquet":
        _import_parquet(cfg, model_cfg, documents, table, ranges, keys)
        return stats.as_dict()
    if not todo:
        return stats.as_dict()
    scorer = make_scorer(model_cfg, cfg)
    start = time.perf_counter()
    try:
        _score_shards(model_cfg, scorer, documents, table, [(k, ranges[k], keys[k]) for k in todo], stats)
    except BaseException:
        log.warning("%s (aborted)", throughput_line(model_cfg.name, _finish(stats, scorer, start)))
        raise
    return _finish(stats, scorer, start)


def _finish(stats: ScoringStats, scorer: Scorer, start: float) -> dict:
    stats.seconds = time.perf_counter() - start
    stats.retries = getattr(scorer, "retries", 0)
    stats.failures = getattr(scorer, "failures", 0)
    stats.precision = getattr(scorer, "precision", None)
    return stats.as_dict()


def throughput_line(name: str, d: dict) -> str:
    return (
        f"score {name}: {d['documents']} documents, {d['tokens']} tokens in {d['seconds']:.1f} s "
        f"({d['tokens_per_s']:.1f} tokens/s), {d['retries']} retries, {d['failures']} failures"
        + (f"; scored in {d['precision']}" if d.get("precision") else "")
    )


def _score_shards(model_cfg: ModelConfig, scorer: Scorer, documents: pa.Table, table: ShardedTable, todo: list, stats: ScoringStats) -> None:
    total_docs = sum(b - a for _, (a, b), _ in todo)
    with tqdm(total=total_docs, desc=f"score {model_cfg.name}", unit="doc", leave=False) as bar:
        for k, (a, b), key in todo:
            part = documents.slice(a, b - a)
            ids_col, idx_col, lp_col, top_tokens, top_lp = [], [], [], [], []
            kept_alternatives = False
            pairs = list(zip(part["doc_id"].to_pylist(), part["text"].to_pylist()))
            for (doc_id, text), scores in zip(pairs, _score_in_groups(scorer, pairs, model_cfg)):
                if scores.doc_id != doc_id:
                    raise ScoringError(f"model '{model_cfg.name}': scorer returned '{scores.doc_id}' for '{doc_id}'")
                spans = word_spans(text)
                ids, idx, lp = word_logprob_rows(doc_id, text, scores.offsets, scores.logprobs, spans)
                if not np.all(np.isfinite(scores.logprobs)):
                    log.warning("model '%s': non-finite log-probs in document '%s'; its words are excluded", model_cfg.name, doc_id)
                    lp = np.full(len(lp), np.nan)
                ids_col.extend(ids)
                idx_col.append(idx)
                lp_col.append(lp)
                if scores.top_tokens is not None:
                    kept_alternatives = True
                    tokens, logprobs = word_alternatives(spans, scores)
                    top_tokens.extend(tokens)
                    top_lp.extend(logprobs)
                stats.documents += 1
                stats.tokens += len(scores.logprobs)
                bar.update(1)
            lp_all = np.concatenate(lp_col) if lp_col else np.zeros(0)
            columns = {
                "doc_id": pa.array(ids_col, pa.string()),
                "word_idx": pa.array(np.concatenate(idx_col) if idx_col else np.zeros(0, np.int32), pa.int32()),
                "logprob": pa.array(lp_all, pa.float64(), from_pandas=True),
            }
            if kept_alternatives:
                columns |= {"top_tokens": pa.array(top_tokens, pa.list_(pa.string())), "top_logprobs": pa.array(top_lp, pa.list_(pa.float32()))}
            table.write(k, pa.table(columns, schema=LOGPROB_ALTERNATIVES_SCHEMA if len(columns) > 3 else LOGPROB_SCHEMA), key)


def word_alternatives(spans: np.ndarray, scores: TokenScores) -> tuple[list, list]:
    """Per word (its character `spans`), the tokens the model expected most at the word's first
    token and their log-probs (`TokenScores.top_tokens`); None for a word no token begins in."""
    at = first_token_of_words(scores.offsets, spans)
    tokens = [None if t < 0 else scores.top_tokens[t] for t in at]
    logprobs = [None if t < 0 else scores.top_logprobs[t].tolist() for t in at]
    return tokens, logprobs


def _null_nonfinite(name: str, src: Path, theirs: pa.Table) -> pa.Table:
    """NaN / -inf in users' log-probs become nulls (as for our own scorers), with a warning naming the
    documents; a positive log-prob, +inf included, is an error, as from a server (`largest_positive`)."""
    values = theirs["logprob"].to_numpy(zero_copy_only=False).astype(np.float64)  # nulls read as NaN
    stored = theirs["logprob"].is_valid().to_numpy(zero_copy_only=False)
    finite = np.isfinite(values)
    i = largest_positive(values)
    if i is not None:
        raise ArtifactError(
            f"{src}: log-prob {values[i]:.4g} > 0 for document '{theirs['doc_id'][i].as_py()}' word {theirs['word_idx'][i].as_py()}; "
            f"{LOGPROB_RULE}; are these negative log-likelihoods?"
        )
    fault = stored & ~finite
    if not fault.any():
        return theirs
    docs = sorted({d for d, f in zip(theirs["doc_id"].to_pylist(), fault) if f})
    log.warning(
        "model '%s': %d non-finite log-prob(s) (NaN/inf) in %s, in document(s) %s; those words are excluded",
        name,
        int(fault.sum()),
        src,
        ", ".join(docs[:10]) + (f" and {len(docs) - 10} more" if len(docs) > 10 else ""),
    )
    return theirs.set_column(2, LOGPROB_SCHEMA.field("logprob"), pa.array(np.where(finite, values, np.nan), pa.float64(), from_pandas=True))


def _cast_user_columns(src: Path, theirs: pa.Table) -> pa.Table:
    columns = []
    for field in LOGPROB_SCHEMA:
        try:
            columns.append(theirs[field.name].cast(field.type))  # safe cast: 3.5 is no word index, 'abc' no log-prob
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            problem = str(err).splitlines()[0]
            raise ArtifactError(f"{src}: column '{field.name}' ({theirs.schema.field(field.name).type}) cannot be read as {field.type}: {problem}") from None
    return pa.table(columns, schema=LOGPROB_SCHEMA)


def _user_files(src: Path) -> list[Path]:
    """A `source: parquet` model's file, or the Parquet files below its folder in path order (dot- and
    `_`-files, such as Spark's `_SUCCESS` or a temp file, left out)."""
    if not src.is_dir():
        return [src]
    files = sorted(p for p in src.rglob("*.parquet") if p.is_file() and not any(part.startswith((".", "_")) for part in p.relative_to(src).parts))
    if not files:
        raise ArtifactError(f"{src}: folder holds no .parquet files (models[].path of a `source: parquet` model: a Parquet file or a folder of them)")
    return files


def _read_user_logprobs(src: Path) -> pa.Table:
    """Each file read and checked alone, so an error names the file at fault."""
    tables = []
    for f in _user_files(src):
        theirs = read_table(f)
        require_columns(theirs, LOGPROB_SCHEMA.names, str(f))
        tables.append(_cast_user_columns(f, theirs.select(LOGPROB_SCHEMA.names)))
    return pa.concat_tables(tables)


def _import_parquet(cfg: Config, model_cfg: ModelConfig, documents: pa.Table, table: ShardedTable, ranges, keys) -> None:
    """Users' own per-word log-probs: validated against `words` and re-sharded like ours."""
    src = user_logprobs_path(model_cfg)
    theirs = _read_user_logprobs(src)
    words = read_table(cfg.paths.words, columns=["doc_id", "word_idx"])
    theirs = _null_nonfinite(model_cfg.name, src, theirs)
    joined = words.join(theirs, keys=["doc_id", "word_idx"], join_type="left outer")
    n_missing = joined["logprob"].null_count
    if theirs.num_rows != theirs.group_by(["doc_id", "word_idx"]).aggregate([]).num_rows:
        raise ArtifactError(f"{src}: duplicate (doc_id, word_idx) rows")
    # Rows that name a word: counted on the keys, since a matched word may carry a null log-prob.
    matched = words.join(theirs.select(["doc_id", "word_idx"]), keys=["doc_id", "word_idx"], join_type="inner").num_rows
    extra = theirs.num_rows - matched
    if extra:
        raise ArtifactError(f"{src}: {extra} row(s) name words not in {cfg.paths.words} (different segmentation or corpus?)")
    if n_missing:
        log.warning("model '%s': %d word(s) have no log-prob in %s; they are excluded", model_cfg.name, n_missing, src)
    # One sort into document order, then each shard is a slice: not a scan of every word per shard.
    rank = pc.index_in(joined["doc_id"], value_set=documents["doc_id"]).to_numpy()
    perm = np.lexsort((joined["word_idx"].to_numpy(), rank))
    ordered = joined.take(pa.array(perm)).cast(LOGPROB_SCHEMA)
    bounds = np.searchsorted(rank[perm], [a for a, _ in ranges] + [documents.num_rows])
    for k in range(len(ranges)):
        table.write(k, ordered.slice(bounds[k], bounds[k + 1] - bounds[k]), keys[k])


def check_complete(cfg: Config, documents: pa.Table, models: list[ModelConfig] | None = None) -> dict[str, list[int]]:
    """Shards still missing per model (empty lists when every shard of every model is done)."""
    ranges = shard_ranges(documents.num_rows, cfg.corpus.shard_docs)
    missing = {}
    for m in models or cfg.models:
        table = ShardedTable(cfg.paths.logprobs(m.name))
        keys = logprob_shard_keys(m, documents, ranges)
        missing[m.name] = [k for k in range(len(ranges)) if not table.has(k, keys[k])]
    return missing


def score_documents(cfg: Config, documents: pa.Table, models: list[str] | None = None, shard_spec: str | None = None) -> dict:
    shard = parse_shard(shard_spec)
    chosen = [cfg.model(n) for n in models] if models else cfg.models
    report = {}
    for m in chosen:
        report[m.name] = score_model(cfg, m, documents, shard)
        tqdm.write(throughput_line(m.name, report[m.name]), file=sys.stderr)
        table = ShardedTable(cfg.paths.logprobs(m.name))
        table.remove_extra(set(range(len(shard_ranges(documents.num_rows, cfg.corpus.shard_docs)))))
    if shard == (0, 1):
        require_complete(cfg, documents, chosen, "re-run `bbox score`")
    atomic_write_json(cfg.paths.score_stats(*shard), report)
    return report


def require_complete(cfg: Config, documents: pa.Table, models: list[ModelConfig], remedy: str) -> None:
    """Every shard of every one of `models` is written for the current documents and settings, and intact."""
    missing = {k: v for k, v in check_complete(cfg, documents, models).items() if v}
    if missing:
        raise ArtifactError(f"scoring incomplete: missing shards {missing}")
    for m in models:
        bad = ShardedTable(cfg.paths.logprobs(m.name)).verify()
        if bad:
            raise ArtifactError(f"{cfg.paths.logprobs(m.name)}: shard(s) {bad} failed their checksum; {remedy}")


def merge(cfg: Config) -> None:
    """Check that every worker's shards are complete and intact (`bbox merge`)."""
    require_complete(cfg, read_table(cfg.paths.documents), cfg.models, "re-run the worker that owns them")
