"""Corpus ingest: JSONL, .txt files/folders and Hugging Face datasets into documents and words.

Bad input is a one-line `CorpusError` naming file, line and field. Duplicate ids with the
same text are deduplicated; with different text they are an error naming both lines.
Empty (or whitespace-only) documents are dropped and counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from bbox_sae.config import CorpusConfig
from bbox_sae.errors import CorpusError
from bbox_sae.words import word_spans

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    domain: str | None = None
    where: str = ""  # "file:line" for messages


@dataclass
class IngestStats:
    documents: int = 0
    words: int = 0
    empty_dropped: int = 0
    duplicates_dropped: int = 0


def _check_text(text: object, where: str, field: str) -> str:
    if not isinstance(text, str):
        raise CorpusError(f"{where}: field '{field}': expected a string, got {type(text).__name__}")
    if "\x00" in text:
        raise CorpusError(f"{where}: field '{field}': contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise CorpusError(f"{where}: field '{field}': invalid unicode at character {err.start} (lone surrogate)") from None
    return text


def _check_id(value: object, where: str, field: str) -> str:
    # Integers are accepted as ids (common in exported corpora); floats and bools are not,
    # since 1.0 vs 1 or True vs 1 would silently collide.
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise CorpusError(f"{where}: field '{field}': expected a string or integer id, got {type(value).__name__}")
    value = str(value)
    if value == "":
        raise CorpusError(f"{where}: field '{field}': empty id")
    _check_text(value, where, field)
    return value


def read_jsonl(path: Path, cfg: CorpusConfig) -> Iterator[Document]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CorpusError(f"{where}: not valid UTF-8 (byte {err.start} of the line)") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"{where}: malformed JSON: {err.msg} (column {err.colno})") from None
            except RecursionError:
                raise CorpusError(f"{where}: malformed JSON: nested too deeply") from None
            except ValueError as err:
                # Not a JSONDecodeError: e.g. an integer past Python's 4300-digit parsing limit.
                raise CorpusError(f"{where}: malformed JSON: {str(err).split(';')[0]}") from None
            if not isinstance(obj, dict):
                raise CorpusError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            for field in (cfg.id_field, cfg.text_field):
                if field not in obj:
                    raise CorpusError(f"{where}: field '{field}': missing")
            doc_id = _check_id(obj[cfg.id_field], where, cfg.id_field)
            text = _check_text(obj[cfg.text_field], where, cfg.text_field)
            domain = obj.get(cfg.domain_field)
            if domain is not None:
                domain = _check_text(domain, where, cfg.domain_field)
            yield Document(doc_id, text, domain, where)


def _read_txt_file(path: Path, doc_id: str) -> Document:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise CorpusError(f"{path}:{line}: not valid UTF-8 (byte {err.start} of the file)") from None
    if "\x00" in text:
        # Name the line, as for JSONL; "field 'text'" would mean nothing for a plain text file.
        raise CorpusError(f"{path}:{text.count(chr(10), 0, text.index(chr(0))) + 1}: contains a NUL character")
    text = text.removeprefix("\ufeff")
    return Document(doc_id, _check_text(text, str(path), "text"), None, str(path))


def read_txt(path: Path) -> Iterator[Document]:
    if path.is_file():
        yield _read_txt_file(path, path.stem)
        return
    files = sorted(p for p in path.rglob("*.txt") if p.is_file())
    if not files:
        raise CorpusError(f"{path}: folder holds no .txt files")
    for f in files:
        yield _read_txt_file(f, str(f.relative_to(path).with_suffix("")))


def read_hf(path: str, cfg: CorpusConfig) -> Iterator[Document]:
    import datasets

    try:
        if Path(path).exists():
            ds = datasets.load_from_disk(path)
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[cfg.hf_split]
        else:
            ds = datasets.load_dataset(path, split=cfg.hf_split)
    except Exception as err:  # datasets raises many types; the message is what users need
        raise CorpusError(f"{path}: cannot load Hugging Face dataset: {err}") from None
    if cfg.text_field not in ds.column_names:
        raise CorpusError(f"{path}: field '{cfg.text_field}': not a column (columns: {ds.column_names})")
    has_id = cfg.id_field in ds.column_names
    has_domain = cfg.domain_field in ds.column_names
    for i, row in enumerate(ds):
        where = f"{path}:row {i}"
        doc_id = _check_id(row[cfg.id_field], where, cfg.id_field) if has_id else str(i)
        text = _check_text(row[cfg.text_field], where, cfg.text_field)
        domain = row[cfg.domain_field] if has_domain else None
        yield Document(doc_id, text, domain, where)


def detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.is_file():
        return "jsonl" if path.suffix in (".jsonl", ".json", ".ndjson") else "txt"
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return "hf"
        return "txt"
    raise CorpusError(f"{path}: corpus not found")


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


def load_documents(cfg: CorpusConfig, seed: int = 0, stats: IngestStats | None = None) -> list[Document]:
    stats = stats if stats is not None else IngestStats()
    path = Path(cfg.path).expanduser()
    fmt = detect_format(path, cfg.format) if (path.exists() or cfg.format == "auto") else cfg.format
    if fmt == "jsonl":
        if not path.is_file():
            raise CorpusError(f"{path}: corpus file not found")
        source: Iterator[Document] = read_jsonl(path, cfg)
    elif fmt == "txt":
        if not path.exists():
            raise CorpusError(f"{path}: corpus not found")
        source = read_txt(path)
    else:
        source = read_hf(cfg.path, cfg)

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
        if (cfg.max_docs is not None and len(docs) >= cfg.max_docs) or (
            cfg.max_words is not None and total_words >= cfg.max_words
        ):
            break
    if stats.empty_dropped:
        log.info("dropped %d empty document(s)", stats.empty_dropped)
    if stats.duplicates_dropped:
        log.info("dropped %d duplicate document(s) (same id, same text)", stats.duplicates_dropped)
    if not docs:
        raise CorpusError(f"{path}: corpus holds no non-empty documents")
    stats.documents = len(docs)
    stats.words = total_words
    return docs


DOCUMENTS_SCHEMA = pa.schema(
    [("doc_id", pa.string()), ("text", pa.string()), ("split", pa.string()), ("domain", pa.string()), ("shard", pa.int32())]
)
WORDS_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("word_idx", pa.int32()),
        ("char_start", pa.int64()),
        ("char_end", pa.int64()),
        ("word", pa.string()),
        ("split", pa.string()),
        ("domain", pa.string()),
    ]
)


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
        documents["doc_id"].to_pylist(),
        documents["text"].to_pylist(),
        documents["split"].to_pylist(),
        documents["domain"].to_pylist(),
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


def corpus_fingerprint(cfg: CorpusConfig) -> str:
    """Checksum of the corpus files' content (a hub dataset, which has no local files, by name).

    Content, not sizes and times: an edit that keeps the size within one timestamp tick must
    still be seen."""
    from bbox_sae.artifacts import sha256_file

    path = Path(cfg.path).expanduser()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    h = hashlib.sha256(str(path).encode())
    for f in files:
        h.update(f"\x00{f.relative_to(path) if f != path else ''}\x00{sha256_file(f)}".encode())
    return h.hexdigest()[:16]


def shard_ranges(n_docs: int, shard_docs: int) -> list[tuple[int, int]]:
    return [(s, min(s + shard_docs, n_docs)) for s in range(0, n_docs, shard_docs)]


def word_counts(documents: pa.Table) -> np.ndarray:
    return np.array([len(word_spans(t)) for t in documents["text"].to_pylist()], dtype=np.int64)
