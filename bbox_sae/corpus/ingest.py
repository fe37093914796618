"""The ingest stage: the corpus read into `documents` and its canonical `words`.

Artifacts (`cfg.paths.<name>`; files and columns in docs/artifacts.md):
- `documents`: doc_id, text, split, domain, shard
- `words`: sharded; doc_id, word_idx, char_start, char_end, word, split, domain
Shard k holds documents [k * shard_docs, (k + 1) * shard_docs), as in every sharded table.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import ShardedTable, atomic_write_json, atomic_write_table
from bbox_sae.config import Config
from bbox_sae.corpus.documents import IngestStats, documents_table, load_documents, run_dirs, shard_key, shard_ranges, words_table

log = logging.getLogger(__name__)


def ingest(cfg: Config) -> pa.Table:
    """Read the corpus into `documents` and `words`. Whether that is needed is the stage table's call
    (its key holds the corpus's settings and checksum); `words` shards already written for the same
    documents are kept."""
    paths = cfg.paths
    # Withdraw the old documents first, so a failed ingest cannot leave the previous corpus's
    # documents beside this one's words.
    paths.ingest_marker.unlink(missing_ok=True)
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
        paths.ingest_marker,
        {
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
    return documents
