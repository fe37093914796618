"""Reading corpus files: the layouts users have, into `Document`s, checked field by field.

Accepted: JSONL (plain, gzip or zstd; one file or a folder of shards, as Dolma and Paloma ship
them), Parquet (a file or a folder of shards), UTF-8 `.txt` files, a folder mixing these, a
`datasets` save_to_disk folder, and (format `hf`) anything `datasets.load_dataset` reads,
hub names included. Formats are told by content (magic bytes, first character) before the
file name; anything else is an error naming the file and what it looks like.

Bad input is a one-line `CorpusError` naming file, line (or row) and field.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bbox_sae.config import CorpusConfig
from bbox_sae.corpus.sniff import ACCEPTED, COMPRESSION_MAGIC, DELIMITED_SUFFIXES, FileKind, decompression_errors, open_compressed, sniff, unsupported
from bbox_sae.errors import CorpusError

# The public corpora bbox writes itself, and the command that writes each: a config naming one
# that is not there yet says how to make it.
BUNDLED_CORPORA = {"bbox_sae.corpus.demo": "shakespeare.jsonl", "bbox_sae.corpus.prose": "handbook.jsonl"}

PARQUET_BATCH_ROWS = 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    domain: str | None = None
    where: str = ""  # "file:line" for messages


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


def _json_lines(path: Path, compression: str | None) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of a JSONL file, decompressed on the fly: memory stays flat."""
    if compression is None:
        with open(path, "rb") as fh:
            yield from enumerate(fh, start=1)
        return
    lineno = 0
    try:
        with open_compressed(path, compression) as fh:
            for lineno, raw in enumerate(fh, start=1):
                yield lineno, raw
    except decompression_errors() as err:
        raise CorpusError(f"{path}:{lineno + 1}: corrupt {compression} data ({err})") from None


def read_jsonl(path: Path, cfg: CorpusConfig, compression: str | None = None) -> Iterator[Document]:
    for lineno, raw in _json_lines(path, compression):
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
        yield _document(obj, where, cfg, default_id=None)


def _document(row: dict, where: str, cfg: CorpusConfig, default_id: str | None) -> Document:
    """One record (a JSON object, a Parquet or dataset row) as a Document.

    `default_id` stands in for a missing id field: tabular sources (Parquet, datasets) often
    have none, and a row's position is a stable id there.
    """
    if cfg.text_field not in row:
        raise CorpusError(f"{where}: field '{cfg.text_field}': missing")
    if cfg.id_field in row:
        doc_id = _check_id(row[cfg.id_field], where, cfg.id_field)
    elif default_id is not None:
        doc_id = default_id
    else:
        raise CorpusError(f"{where}: field '{cfg.id_field}': missing")
    text = _check_text(row[cfg.text_field], where, cfg.text_field)
    domain = row.get(cfg.domain_field)
    if domain is not None:
        domain = _check_text(domain, where, cfg.domain_field)
    return Document(doc_id, text, domain, where)


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


def read_parquet(path: Path, cfg: CorpusConfig, row_id_prefix: str = "") -> Iterator[Document]:
    """Rows of a Parquet file, a batch at a time; a row without an id column is `<prefix><row>`."""
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except (pa.ArrowException, OSError) as err:
        raise CorpusError(f"{path}: cannot read Parquet: {_first_line(err)}") from None
    if cfg.text_field not in names:
        raise CorpusError(f"{path}: field '{cfg.text_field}': not a column (columns: {names})")
    columns = list(dict.fromkeys(c for c in (cfg.id_field, cfg.text_field, cfg.domain_field) if c in names))
    i = 0
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
            for row in batch.to_pylist():
                yield _document(row, f"{path}:row {i}", cfg, default_id=f"{row_id_prefix}{i}")
                i += 1
    except (pa.ArrowException, OSError) as err:
        raise CorpusError(f"{path}:row {i}: cannot read Parquet: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _is_saved_dataset(path: Path) -> bool:
    """A `datasets` save_to_disk folder (a Dataset or a DatasetDict)."""
    return (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()


def read_hf(cfg: CorpusConfig) -> Iterator[Document]:
    """A saved dataset folder, a local data file or dataset repo folder, or a hub dataset name.

    Everything but a saved folder goes through `datasets.load_dataset`, so a hub name with
    `hf_config`, `hf_split` and `hf_streaming` takes the same path as the local files it is
    tested on.
    """
    import datasets

    local = Path(cfg.path).expanduser()
    try:
        if local.is_dir() and _is_saved_dataset(local):
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                if cfg.hf_split not in ds:
                    raise CorpusError(f"{cfg.path}: split '{cfg.hf_split}' not in the saved dataset (splits: {list(ds)})")
                ds = ds[cfg.hf_split]
        elif local.is_file():
            builder = {"parquet": "parquet", "jsonl": "json"}.get(sniff(local).format)
            if builder is None:
                raise CorpusError(f"{cfg.path}: format 'hf' reads a Parquet or JSONL file, a dataset folder or a hub name")
            # A data file given alone has one split, which `datasets` names "train".
            ds = datasets.load_dataset(builder, data_files=str(local), split="train", streaming=cfg.hf_streaming)
        else:
            ds = datasets.load_dataset(cfg.path, name=cfg.hf_config, split=cfg.hf_split, streaming=cfg.hf_streaming)
    except CorpusError:
        raise
    except Exception as err:  # datasets raises many types; the message is what users need
        raise CorpusError(f"{cfg.path}: cannot load Hugging Face dataset: {_first_line(err)}") from None
    # A streamed dataset may not know its columns before the first row: then each row is checked.
    columns = ds.column_names
    if columns is not None and cfg.text_field not in columns:
        raise CorpusError(f"{cfg.path}: field '{cfg.text_field}': not a column (columns: {columns})")
    for i, row in enumerate(ds):
        yield _document(row, f"{cfg.path}:row {i}", cfg, default_id=str(i))


def _hidden(rel: Path) -> bool:
    # Dot files (.DS_Store, .gitattributes) and Spark/Parquet bookkeeping (_SUCCESS, _metadata).
    return any(part.startswith((".", "_")) for part in rel.parts)


def _raise(err: OSError) -> None:
    raise err


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def walk_files(root: Path, exclude: Iterable[Path] = ()) -> tuple[list[Path], list[Path]]:
    """Every file below `root` in path order, symlinked folders followed, and the folders skipped
    because their real folder was already read (a link back up the tree would loop; a second link to
    a folder would read its documents twice). An unreadable folder is an error, not a silent gap.
    Folders in `exclude` (the run's output dir, the model cache) are not corpus, wherever they are."""
    files, repeats, seen = [], [], set()
    skip = {i for i in map(_identity, exclude) if i is not None}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=_raise):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in skip:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            repeats.append(Path(dirpath))
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames.sort()  # the first path to a folder, in path order, is the one read
        files.extend(Path(dirpath) / name for name in filenames)
    return sorted(f for f in files if f.is_file()), repeats


def read_folder(root: Path, fmt: str, cfg: CorpusConfig, exclude: Iterable[Path] = ()) -> Iterator[Document]:
    """Every corpus file under `root` (outside `exclude`), in path order, each read by its own format.

    Plain text is read only from `.txt` files, so a README or LICENSE beside the shards is
    skipped (and logged) rather than ingested as a document.
    """
    found, repeats = walk_files(root, exclude)
    for folder in repeats:
        log.warning("%s: skipped, it links to %s, which is read already", folder, folder.resolve())
    files = [p for p in found if not _hidden(p.relative_to(root))]
    chosen, skipped = [], []
    for f in files:
        kind = sniff(f)
        wanted = kind.format != "text" if fmt == "auto" else kind.format == fmt
        (chosen if wanted else skipped).append((f, kind))
    if skipped:
        names = ", ".join(str(f.relative_to(root)) for f, _ in skipped[:5])
        what = "corpus files" if fmt == "auto" else f"{fmt} files"
        log.warning("%s: skipped %d file(s) that are not %s: %s", root, len(skipped), what, names)
    if not chosen:
        what = "corpus files" if fmt == "auto" else f"{fmt} files"
        raise CorpusError(f"{root}: folder holds no {what} ({ACCEPTED})")
    for f, kind in chosen:
        name = str(f.relative_to(root).with_suffix("")) if kind.format in ("txt", "text") else str(f.relative_to(root))
        yield from _read_file(f, kind, cfg, name)


def _read_file(path: Path, kind: FileKind, cfg: CorpusConfig, name: str) -> Iterator[Document]:
    if kind.format == "jsonl":
        return read_jsonl(path, cfg, kind.compression)
    if kind.format == "parquet":
        return read_parquet(path, cfg, row_id_prefix=f"{name}:" if name else "")
    return iter([_read_txt_file(path, name or path.stem)])


def _file_kind(path: Path, fmt: str) -> FileKind:
    if fmt == "auto":
        return sniff(path)
    # An explicit format wins over the content, but compressed JSONL still needs decompressing.
    with open(path, "rb") as fh:
        head = fh.read(4)
    compression = next((c for magic, c in COMPRESSION_MAGIC if head.startswith(magic)), None)
    return FileKind(fmt, compression if fmt == "jsonl" else None)


def iter_documents(cfg: CorpusConfig, exclude: Iterable[Path] = ()) -> Iterator[Document]:
    """The corpus's documents in order, read lazily (a streamed hub dataset is never held whole).
    `exclude`: folders bbox writes (output dir, model cache), left out of a corpus folder."""
    path = Path(cfg.path).expanduser()
    if cfg.format == "hf" or (cfg.format == "auto" and path.is_dir() and _is_saved_dataset(path)):
        return read_hf(cfg)
    if not path.exists():
        writer = next((module for module, name in BUNDLED_CORPORA.items() if name == path.name), None)
        if writer:
            hint = f" (python -m {writer} {path.parent} writes it)"
        else:
            hint = " (for a hub dataset set corpus.format: hf)" if cfg.format == "auto" else ""
        raise CorpusError(f"{path}: corpus not found{hint}")
    if path.is_dir():
        written = [e for e in exclude if _identity(e) == _identity(path)]
        if written:
            raise CorpusError(f"{path}: the corpus folder is also where bbox writes ({written[0]}); give output_dir and cache_dir folders of their own")
        return read_folder(path, cfg.format, cfg, exclude)
    kind = _file_kind(path, cfg.format)
    if kind.format == "text" and path.suffix.lower() in DELIMITED_SUFFIXES:
        what = DELIMITED_SUFFIXES[path.suffix.lower()]
        raise unsupported(path, f"{what}; convert it to Parquet or JSONL with a '{cfg.text_field}' column")
    return _read_file(path, kind, cfg, name="")
