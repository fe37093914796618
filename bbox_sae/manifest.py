"""manifest.json: for each finished stage of a run, its key and the checksums of its outputs.

Read and written here; what counts as current is decided by the registry (`stages`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bbox_sae.artifacts import ShardedTable, atomic_write_json, sha256_file
from bbox_sae.config import Config
from bbox_sae.layout import RunLayout


def read_manifest(out: Path) -> dict:
    try:
        manifest = json.loads(RunLayout(out).manifest.read_text())
    except (OSError, ValueError):
        return {"stages": {}}
    if not isinstance(manifest, dict) or not isinstance(manifest.get("stages"), dict):
        return {"stages": {}}
    return manifest


def sharded_digest(directory: Path) -> str:
    """The shards' recorded checksums (their sidecars): cheap, and readers verify the shards themselves."""
    table = ShardedTable(directory)
    listing = {"shards": table.recorded_checksums(), "orphans": table.orphans()}
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


def describe_outputs(cfg: Config, paths: list[Path]) -> dict:
    described = {}
    for p in paths:
        rel = str(p.relative_to(cfg.out))
        if p.is_dir():
            described[rel] = {"shards": sharded_digest(p)}
        else:
            st = p.stat()
            described[rel] = {"sha256": sha256_file(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return described


def write_entry(cfg: Config, name: str, entry: dict | None) -> None:
    manifest = read_manifest(cfg.out)
    if entry is None:
        if name not in manifest["stages"]:
            return
        del manifest["stages"][name]
    else:
        manifest["stages"][name] = entry
    atomic_write_json(cfg.paths.manifest, manifest)
