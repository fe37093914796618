"""What a corpus file is, told by its content (magic bytes, first character) before its name;
anything unsupported is named in the error."""

from __future__ import annotations

import codecs
import gzip
import io
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from bbox_sae.errors import CorpusError

SNIFF_BYTES = 4096
ACCEPTED = "accepted: JSONL (plain, .gz or .zst), Parquet, UTF-8 .txt, a saved Hugging Face dataset folder"
# Formats recognised by their first bytes only to be named in the error.
UNSUPPORTED_MAGIC = [
    (b"PK\x03\x04", "zip archive"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"7z\xbc\xaf\x27\x1c", "7z archive"),
    (b"\x04\x22\x4d\x18", "lz4-compressed"),
    (b"ARROW1", "Arrow IPC file"),
    (b"SQLite format 3\x00", "SQLite database"),
    (b"%PDF-", "PDF"),
    (b"\xff\xfe", "UTF-16 text"),
    (b"\xfe\xff", "UTF-16 text"),
]
COMPRESSION_MAGIC = [(b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd")]
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
# Tables as text: read as a plain text file they would be one document of raw rows.
DELIMITED_SUFFIXES = {".csv": "CSV", ".tsv": "TSV"}
NAMED_BINARY_SUFFIXES = {".parquet": "Parquet", ".gz": "gzip data", ".zst": "zstd data"}


@dataclass(frozen=True)
class FileKind:
    format: str  # parquet | jsonl | txt | text (UTF-8 text not named .txt: a document alone, skipped in folders)
    compression: str | None = None


def unsupported(path: Path, what: str) -> CorpusError:
    return CorpusError(f"{path}: unsupported corpus file ({what}); {ACCEPTED}")


def _is_bzip2(head: bytes) -> bool:
    return head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90")


def _has_parquet_footer(path: Path) -> bool:
    if path.stat().st_size < 8:
        return False
    with open(path, "rb") as fh:
        fh.seek(-4, io.SEEK_END)
        return fh.read(4) == b"PAR1"


def _starts_like_json_object(head: bytes) -> bool:
    return head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"{"


def _is_utf8_text(head: bytes) -> bool:
    try:
        # Not final: the head may end inside a multi-byte character.
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return b"\x00" not in head


def sniff(path: Path) -> FileKind:
    """A corpus file's format from its first bytes, then its name; an unsupported one is an error naming it.

    The readable binary formats (Parquet, gzip, zstd) are told by content whatever the name; a
    file named .jsonl or .txt is otherwise read as such, so its errors name the line.
    """
    with open(path, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    suffix = path.suffix.lower()
    if head.startswith(b"PAR1") and _has_parquet_footer(path):
        return FileKind("parquet")
    for magic, compression in COMPRESSION_MAGIC:
        if head.startswith(magic):
            try:
                _check_frame_header(head, compression)
                with open_compressed(path, compression) as fh:
                    inner = fh.read(SNIFF_BYTES)
            except decompression_errors() as err:
                raise CorpusError(f"{path}:1: corrupt {compression} data ({err})") from None
            if inner.strip() and not _starts_like_json_object(inner):
                raise unsupported(path, f"{compression}-compressed, but not JSONL")
            return FileKind("jsonl", compression)
    if suffix == ".parquet" and head.startswith(b"PAR1"):
        raise CorpusError(f"{path}: truncated Parquet file (no footer); was it still being written?")
    if suffix in NAMED_BINARY_SUFFIXES:
        # A name promising a binary format the content lacks is a mistake worth naming.
        first = head[:8].hex(" ") or "none: empty file"
        raise CorpusError(f"{path}: named {suffix} but not {NAMED_BINARY_SUFFIXES[suffix]} (first bytes {first})")
    if suffix in JSONL_SUFFIXES:
        return FileKind("jsonl")
    if suffix == ".txt":
        return FileKind("txt")
    if _is_bzip2(head):
        raise unsupported(path, "bzip2-compressed")
    for magic, what in UNSUPPORTED_MAGIC:
        if head.startswith(magic):
            raise unsupported(path, what)
    if _is_utf8_text(head):
        return FileKind("jsonl" if _starts_like_json_object(head) else "text")
    raise unsupported(path, f"binary, first bytes {head[:8].hex(' ')}")


def open_compressed(path: Path, compression: str) -> BinaryIO:
    if compression == "gzip":
        return gzip.open(path, "rb")
    import zstandard

    # Shards written by several zstd processes (and `cat`-joined ones) hold several frames.
    reader = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True, closefd=True)
    return io.BufferedReader(reader)


def _check_frame_header(head: bytes, compression: str) -> None:
    """A zstd frame whose header cannot be parsed: its stream reader reads nothing and raises
    nothing, so 4 bytes of zstd magic before other text read as a corpus with no documents."""
    if compression == "zstd":
        import zstandard

        zstandard.get_frame_parameters(head)


def decompression_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    # gzip.BadGzipFile is an OSError; a truncated stream raises EOFError.
    return (OSError, EOFError, zlib.error, zstandard.ZstdError)
