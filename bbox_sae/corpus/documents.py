"""Corpus ingest: the corpus's documents (read by `corpus_files`) into documents and words.

Duplicate ids with the same text are deduplicated; with different text they are an error naming
both lines. Empty (or whitespace-only) documents are dropped and counted. Long documents are cut
into chunks; each document gets its split (train / holdout) from a hash of its id.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from bbox_sae.config import Config, CorpusConfig
from bbox_sae.corpus.files import Document, iter_documents, walk_files
from bbox_sae.corpus.words import word_spans
from bbox_sae.errors import ConfigError, CorpusError
from bbox_sae.schemas import DOCUMENTS_SCHEMA, WORDS_SCHEMA

log = logging.getLogger(__name__)


@dataclass
class IngestStats:
    documents: int = 0
    words: int = 0
    empty_dropped: int = 0
    duplicates_dropped: int = 0


def chunk_document(doc: Document, chunk_words: int) -> list[Document]:
    """Cut a document into pieces of about `chunk_words` words, at line ends when possible.

    The pieces concatenate back to the document; ids are `<id>#<k>`.
    """
    spans = word_spans(doc.text)
    if len(spans) <= chunk_words:
        return [doc]
    pieces, start, count = [], 0, 0
    for s, e in spans:
        count += 1
        at_line_end = "\n" in doc.text[s:e]
        if count >= chunk_words and (at_line_end or count >= 2 * chunk_words):
            pieces.append((start, e))
            start, count = e, 0
    if start < len(doc.text):
        if pieces and count < chunk_words // 4:
            pieces[-1] = (pieces[-1][0], len(doc.text))
        else:
            pieces.append((start, len(doc.text)))
    return [Document(f"{doc.id}#{k}", doc.text[a:b], doc.domain, doc.where) for k, (a, b) in enumerate(pieces)]


def split_of(doc_id: str, holdout_fraction: float, seed: int) -> str:
    digest = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "holdout" if u < holdout_fraction else "train"


def load_documents(cfg: CorpusConfig, seed: int = 0, stats: IngestStats | None = None, exclude: Iterable[Path] = ()) -> list[Document]:
    stats = stats if stats is not None else IngestStats()
    source = iter_documents(cfg, exclude)
    seen: dict[str, Document] = {}
    docs: list[Document] = []
    total_words = 0
    for doc in source:
        if doc.id in seen:
            first = seen[doc.id]
            if first.text != doc.text:
                raise CorpusError(f"{doc.where}: field '{cfg.id_field}': duplicate id {doc.id!r} with different text (first at {first.where})")
            stats.duplicates_dropped += 1
            continue
        seen[doc.id] = doc
        if not doc.text.strip():
            stats.empty_dropped += 1
            continue
        pieces = chunk_document(doc, cfg.chunk_words) if cfg.chunk_words else [doc]
        for piece in pieces:
            if cfg.max_docs is not None and len(docs) >= cfg.max_docs:
                break
            if cfg.max_words is not None and total_words >= cfg.max_words:
                break
            if not piece.text.strip():
                stats.empty_dropped += 1
                continue
            docs.append(piece)
            total_words += len(word_spans(piece.text))
        if (cfg.max_docs is not None and len(docs) >= cfg.max_docs) or (cfg.max_words is not None and total_words >= cfg.max_words):
            break
    if stats.empty_dropped:
        log.info("dropped %d empty document(s)", stats.empty_dropped)
    if stats.duplicates_dropped:
        log.info("dropped %d duplicate document(s) (same id, same text)", stats.duplicates_dropped)
    if not docs:
        raise CorpusError(f"{Path(cfg.path).expanduser()}: corpus holds no non-empty documents")
    stats.documents = len(docs)
    stats.words = total_words
    return docs


def documents_table(docs: list[Document], holdout_fraction: float, seed: int, shard_docs: int) -> pa.Table:
    return pa.table(
        {
            "doc_id": [d.id for d in docs],
            "text": [d.text for d in docs],
            "split": [split_of(d.id, holdout_fraction, seed) for d in docs],
            "domain": [d.domain for d in docs],
            "shard": [i // shard_docs for i in range(len(docs))],
        },
        schema=DOCUMENTS_SCHEMA,
    )


def words_table(documents: pa.Table) -> pa.Table:
    cols: dict[str, list] = {k: [] for k in WORDS_SCHEMA.names}
    for doc_id, text, split, domain in zip(
        documents["doc_id"].to_pylist(), documents["text"].to_pylist(), documents["split"].to_pylist(), documents["domain"].to_pylist()
    ):
        spans = word_spans(text)
        n = len(spans)
        cols["doc_id"].extend([doc_id] * n)
        cols["word_idx"].extend(range(n))
        cols["char_start"].extend(spans[:, 0].tolist())
        cols["char_end"].extend(spans[:, 1].tolist())
        cols["word"].extend(text[s:e] for s, e in spans)
        cols["split"].extend([split] * n)
        cols["domain"].extend([domain] * n)
    return pa.table(cols, schema=WORDS_SCHEMA)


def shard_key(documents: pa.Table, *settings: str, columns: tuple[str, ...] = ("doc_id", "text")) -> str:
    """Identity of a shard's input: the content of its documents (ids and texts, and whatever other
    columns shape the output) plus the settings that shape it. Ids alone are not enough: a document
    edited in place keeps its id, and a shard keyed on ids would keep the old text's results."""
    h = hashlib.sha256()
    h.update(json.dumps([list(settings), *(documents[c].to_pylist() for c in columns)]).encode())
    return h.hexdigest()[:16]


def run_dirs(cfg: Config) -> tuple[Path, Path]:
    """Where bbox writes (the run, the model cache): never corpus, even inside the corpus folder,
    or the next run would ingest its own artifacts."""
    return cfg.out, cfg.cache


def corpus_fingerprint(cfg: CorpusConfig, exclude: Iterable[Path] = ()) -> str:
    """Checksum of the corpus files' content (a hub dataset, which has no local files, by name).

    Content, not sizes and times: an edit that keeps the size within one timestamp tick must
    still be seen."""
    from bbox_sae.artifacts import sha256_file

    path = Path(cfg.path).expanduser()
    # The files ingest reads: symlinked folders too, or an edit inside one would go unseen.
    files = [path] if path.is_file() else walk_files(path, exclude)[0] if path.is_dir() else []
    h = hashlib.sha256(str(path).encode())
    for f in files:
        h.update(f"\x00{f.relative_to(path) if f != path else ''}\x00{sha256_file(f)}".encode())
    return h.hexdigest()[:16]


def shard_ranges(n_docs: int, shard_docs: int) -> list[tuple[int, int]]:
    return [(s, min(s + shard_docs, n_docs)) for s in range(0, n_docs, shard_docs)]


def parse_shard(spec: str | None) -> tuple[int, int]:
    """`--shard i/n` of a worker of a sharded stage: it does the document shards k with k % n == i."""
    if spec is None:
        return 0, 1
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ConfigError(f"--shard '{spec}': expected i/n, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"--shard '{spec}': need 0 <= i < n")
    return i, n
