"""manifest.json: for each finished stage of a run, a `StageRecord`: its key and its outputs' checksums.

A command reads the manifest once (`Manifest.read`) and passes it along; recording or withdrawing a
stage writes that one record through to disk (`Manifest.put`), merged into the file as it is then,
so shard workers sharing an output dir do not undo each other's records. What counts as current
is decided by the bookkeeping (`bbox_sae.bookkeeping`) from these records.

On disk: `{"stages": {name: {"key", "digest", "outputs", "finished", "seconds", "result"}}}`;
an `outputs` entry is `{"sha256", "size", "mtime_ns"}` for a file, `{"shards"}` for a sharded table.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bbox_sae.artifacts import ShardedTable, atomic_write_json, sha256_file
from bbox_sae.layout import RunLayout


@dataclass(frozen=True)
class StageRecord:
    key: str
    # What the stages after it put in their keys: a hash of its outputs' checksums.
    digest: str
    outputs: dict[str, dict] = field(default_factory=dict)
    finished: str = ""
    seconds: float = 0.0
    result: dict | None = None

    @classmethod
    def finished_now(cls, root: Path, key: str, paths: list[Path], seconds: float, result: dict | None) -> StageRecord:
        outputs = describe_outputs(root, paths)
        digest = hashlib.sha256(json.dumps({k: v.get("sha256") or v.get("shards") for k, v in outputs.items()}, sort_keys=True).encode()).hexdigest()[:16]
        return cls(key, digest, outputs, time.strftime("%Y-%m-%dT%H:%M:%S%z"), round(seconds, 2), result)

    @classmethod
    def from_json(cls, raw) -> StageRecord | None:
        """None for an entry that is not a whole record (hand-edited, or written by a killed run)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("key"), str) or not isinstance(raw.get("digest"), str):
            return None
        outputs = raw.get("outputs")
        return cls(
            raw["key"],
            raw["digest"],
            outputs if isinstance(outputs, dict) else {},
            str(raw.get("finished", "")),
            float(raw.get("seconds") or 0.0),
            raw.get("result") if isinstance(raw.get("result"), dict) else None,
        )

    def outputs_unchanged(self, root: Path, paths: list[Path]) -> bool:
        """The outputs are still the ones the stage wrote: shard checksums for tables; for single files
        size and time (each written by atomic rename, so any rewrite changes its time), and the
        checksum when only the time differs."""
        for p in paths:
            was = self.outputs.get(str(p.relative_to(root)))
            if not isinstance(was, dict) or not p.exists():
                return False
            if "shards" in was:
                if not p.is_dir() or sharded_digest(p) != was["shards"]:
                    return False
                continue
            st = p.stat()
            if st.st_size != was.get("size"):
                return False
            # A copied run (cp -r, rsync without -t) gives unchanged files new times; the checksum
            # decides then, so a copy is not recomputed from the build on.
            if st.st_mtime_ns != was.get("mtime_ns") and sha256_file(p) != was.get("sha256"):
                return False
        return True


@dataclass
class Manifest:
    root: Path
    stages: dict[str, StageRecord] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path) -> Manifest:
        """An unreadable or malformed manifest records nothing: every stage is then redone."""
        try:
            raw = json.loads(RunLayout(root).manifest.read_text())
        except (OSError, ValueError):
            raw = {}
        entries = raw.get("stages") if isinstance(raw, dict) else None
        records = {name: StageRecord.from_json(e) for name, e in (entries.items() if isinstance(entries, dict) else [])}
        return cls(root, {name: r for name, r in records.items() if r is not None})

    def get(self, name: str) -> StageRecord | None:
        return self.stages.get(name)

    def put(self, name: str, record: StageRecord | None) -> None:
        """Record (or, None, withdraw) one stage, here and in the file; the file's other records are
        kept as they are on disk now."""
        if record is None:
            self.stages.pop(name, None)
        else:
            self.stages[name] = record
        on_disk = Manifest.read(self.root)
        if record is None and name not in on_disk.stages:
            return
        on_disk.stages[name] = record
        atomic_write_json(RunLayout(self.root).manifest, {"stages": {n: asdict(r) for n, r in on_disk.stages.items() if r is not None}})


def sharded_digest(directory: Path) -> str:
    """The shards' recorded checksums (their sidecars): cheap, and readers verify the shards themselves."""
    table = ShardedTable(directory)
    listing = {"shards": table.recorded_checksums(), "orphans": table.orphans()}
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


def describe_outputs(root: Path, paths: list[Path]) -> dict:
    described = {}
    for p in paths:
        rel = str(p.relative_to(root))
        if p.is_dir():
            described[rel] = {"shards": sharded_digest(p)}
        else:
            st = p.stat()
            described[rel] = {"sha256": sha256_file(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return described
