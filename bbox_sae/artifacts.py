"""Atomic, checksummed, resumable Parquet artifacts.

A *sharded table* is a directory of `part-NNNNN.parquet` files, each with a sidecar
`part-NNNNN.json` holding its SHA-256 and row count. The sidecar is written (atomically)
only after its shard, so a shard without a sidecar is an interrupted write: it is
recomputed, never read. Sidecars instead of one manifest file let several workers
(`bbox score --shard i/n`) fill the same directory without a shared file to race on.
Readers accept a plain Parquet file too, so users can feed their own tables.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from bbox_sae.errors import ArtifactError

WORD_KEY = ["doc_id", "word_idx"]


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def naming_os_errors(path: str | Path) -> Iterator[None]:
    """OS errors that name no file (pyarrow's and numpy's writers on a full disk) are given `path`,
    so the one-line error says which file could not be written."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        # Named after the file being written, not the random temp name (a read-only output dir).
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        # A failed write (a full disk) names no file; the user needs to know which.
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def atomic_write_table(path: str | Path, table: pa.Table) -> str:
    """Write one Parquet file atomically; returns its SHA-256."""
    data = table_bytes(table)
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ShardedTable:
    """A directory of checksummed Parquet shards, written one shard at a time."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)

    def shard_path(self, index: int) -> Path:
        return self.dir / f"part-{index:05d}.parquet"

    def _sidecar(self, index: int) -> Path:
        return self.dir / f"part-{index:05d}.json"

    def has(self, index: int, key: str | None = None) -> bool:
        """A shard counts as done when its sidecar exists, names the same key and its checksum matches.

        `key` identifies what the shard was computed from (e.g. a hash of its document ids and
        the settings), so a shard computed for other inputs is redone rather than reused.
        The checksum (not just the size) is checked so that a shard corrupted on disk is
        recomputed by the next run of its stage instead of being kept and failing every reader.
        """
        sidecar = self._sidecar(index)
        path = self.shard_path(index)
        if not sidecar.exists() or not path.exists():
            return False
        try:
            meta = json.loads(sidecar.read_text())
        except (json.JSONDecodeError, OSError, UnicodeDecodeError):
            return False
        if not isinstance(meta, dict) or (key is not None and meta.get("key") != key):
            return False
        try:
            return meta.get("bytes") == path.stat().st_size and meta.get("sha256") == sha256_file(path)
        except OSError:
            return False

    def write(self, index: int, table: pa.Table, key: str | None = None) -> None:
        data = table_bytes(table)
        atomic_write_bytes(self.shard_path(index), data)
        atomic_write_json(self._sidecar(index), {"sha256": hashlib.sha256(data).hexdigest(), "rows": table.num_rows, "bytes": len(data), "key": key})

    def recorded_checksums(self) -> dict[int, str | None]:
        """Each finished shard's SHA-256 as its sidecar records it (None when the sidecar is unreadable)."""
        found = {}
        for i in self.indices():
            try:
                found[i] = json.loads(self._sidecar(i).read_text()).get("sha256")
            except (OSError, ValueError, AttributeError):
                found[i] = None
        return found

    def indices(self) -> list[int]:
        if not self.dir.exists():
            return []
        found = []
        for p in self.dir.glob("part-*.json"):
            try:
                found.append(int(p.stem.split("-")[1]))
            except ValueError:  # not one of ours (e.g. part-x.json); ignore rather than crash
                continue
        return sorted(found)

    def verify(self, indices: Iterable[int] | None = None) -> list[int]:
        """Return the shards whose content does not match their checksum.

        Read-only: the bad shard keeps its sidecar, so every reader keeps refusing it until its
        stage recomputes it (`has` checks the checksum). Dropping the sidecar here would turn the
        shard into a silent gap that a later reader could skip without noticing.
        """
        bad = []
        for i in self.indices() if indices is None else indices:
            sidecar, path = self._sidecar(i), self.shard_path(i)
            try:
                meta = json.loads(sidecar.read_text())
                ok = path.exists() and sha256_file(path) == meta["sha256"]
            except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                ok = False
            if not ok:
                bad.append(i)
        return bad

    def orphans(self) -> list[int]:
        """Shards whose Parquet file exists without a sidecar: a write interrupted before it finished."""
        if not self.dir.exists():
            return []
        done = set(self.indices())
        found = []
        for p in self.dir.glob("part-*.parquet"):
            try:
                i = int(p.stem.split("-")[1])
            except ValueError:
                continue
            if i not in done:
                found.append(i)
        return sorted(found)

    def remove_extra(self, keep: set[int]) -> None:
        # Orphans too: a killed run of a larger input may have left a shard file without sidecar.
        for i in sorted(set(self.indices()) | set(self.orphans())):
            if i not in keep:
                self._sidecar(i).unlink(missing_ok=True)
                self.shard_path(i).unlink(missing_ok=True)

    def files(self, indices: Iterable[int] | None = None) -> list[Path]:
        return [self.shard_path(i) for i in (self.indices() if indices is None else indices)]


def resolve_files(path: str | Path, verify: bool = True) -> list[Path]:
    """Files that make up a table: one Parquet file, or a sharded directory (checksums verified)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        table = ShardedTable(path)
        indices = table.indices()
        if not indices:
            raise ArtifactError(f"{path}: no complete shards (was the stage run?)")
        # Shards are numbered from 0 without gaps; a gap or a shard without its sidecar is
        # unfinished work, and reading around it would silently lose rows.
        gaps = sorted(set(range(indices[-1] + 1)) - set(indices))
        orphans = table.orphans()
        if gaps or orphans:
            names = ", ".join(table.shard_path(i).name for i in sorted(set(gaps) | set(orphans)))
            raise ArtifactError(f"{path}: incomplete shard(s) {names} (interrupted run?); re-run the stage to finish them")
        if verify:
            bad = table.verify(indices)
            if bad:
                names = ", ".join(table.shard_path(i).name for i in bad)
                raise ArtifactError(f"{path}: corrupted or truncated shard(s) {names}; re-run the stage to recompute them")
        return table.files(indices)
    raise ArtifactError(f"{path}: artifact not found (was the stage run?)")


def read_table(path: str | Path, columns: list[str] | None = None, verify: bool = True) -> pa.Table:
    files = resolve_files(path, verify=verify)
    try:
        return pads.dataset([str(f) for f in files], format="parquet").to_table(columns=columns)
    except (pa.ArrowInvalid, OSError) as err:
        raise ArtifactError(f"{path}: cannot read Parquet: {err}") from None
    except KeyError as err:
        raise ArtifactError(f"{path}: missing column {err}") from None


def require_columns(table: pa.Table, columns: Iterable[str], where: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ArtifactError(f"{where}: missing column(s) {missing}; has {table.column_names}")
