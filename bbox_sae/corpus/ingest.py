"""The ingest stage: the corpus read into `documents` and its canonical `words`.

Artifacts (`cfg.paths.<name>`; files and columns in docs/artifacts.md):
- `documents`: doc_id, text, split, domain, shard
- `words`: sharded; doc_id, word_idx, char_start, char_end, word, split, domain
Shard k holds documents [k * shard_docs, (k + 1) * shard_docs), as in every sharded table.
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import ShardedTable, atomic_write_json, atomic_write_table, read_table, sha256_file
from bbox_sae.config import Config
from bbox_sae.corpus.documents import IngestStats, corpus_fingerprint, documents_table, load_documents, run_dirs, shard_key, shard_ranges, words_table

log = logging.getLogger(__name__)


def ingest(cfg: Config) -> pa.Table:
    """Read the corpus into `documents` and `words` (skipped when up to date)."""
    paths = cfg.paths
    marker = paths.ingest_marker
    fingerprint = cfg.section_hash("corpus", "seed") + corpus_fingerprint(cfg.corpus, run_dirs(cfg))
    if marker.exists() and paths.documents.exists():
        try:
            meta = json.loads(marker.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            meta = {}
        words = ShardedTable(paths.words)
        # Reuse only intact output: `documents` as checksummed in the marker, every `words`
        # shard present and matching its checksum. Anything else is re-ingested (cheap, and
        # intact `words` shards are kept), never read.
        if (
            meta.get("fingerprint") == fingerprint
            and meta.get("documents_sha256") == sha256_file(paths.documents)
            and words.indices() == list(range(meta.get("shards", -1)))
            and not words.orphans()
            and not words.verify()
        ):
            return read_table(paths.documents)
    # The corpus changed (or the last ingest did not finish): withdraw the old claim first, so a
    # failed ingest cannot leave the previous corpus's documents looking current to later stages.
    marker.unlink(missing_ok=True)
    paths.documents.unlink(missing_ok=True)
    stats = IngestStats()
    docs = load_documents(cfg.corpus, seed=cfg.seed, stats=stats, exclude=run_dirs(cfg))
    documents = documents_table(docs, cfg.corpus.holdout_fraction, cfg.seed, cfg.corpus.shard_docs)
    words = ShardedTable(paths.words)
    ranges = shard_ranges(documents.num_rows, cfg.corpus.shard_docs)
    for k, (a, b) in enumerate(ranges):
        part = documents.slice(a, b - a)
        # The split and domain are columns of `words` too: a new holdout_fraction or seed must redo the shard.
        key = shard_key(part, columns=("doc_id", "text", "split", "domain"))
        if not words.has(k, key):
            words.write(k, words_table(part), key)
    words.remove_extra(set(range(len(ranges))))
    documents_sha256 = atomic_write_table(paths.documents, documents)
    n_holdout = int(pc.sum(pc.equal(documents["split"], "holdout")).as_py() or 0)
    atomic_write_json(
        marker,
        {
            "fingerprint": fingerprint,
            "documents_sha256": documents_sha256,
            "documents": stats.documents,
            "words": stats.words,
            "holdout_documents": n_holdout,
            "empty_dropped": stats.empty_dropped,
            "duplicates_dropped": stats.duplicates_dropped,
            "shards": len(ranges),
        },
    )
    log.info("ingested %d documents, %d words (%d holdout docs)", stats.documents, stats.words, n_holdout)
    if n_holdout == 0 and cfg.features.require_generalize:
        log.warning(
            "no holdout documents (corpus.holdout_fraction %s, %d documents): no feature can pass the holdout check, "
            "so none will be kept; raise corpus.holdout_fraction or set features.require_generalize=false",
            cfg.corpus.holdout_fraction,
            stats.documents,
        )
    return documents
