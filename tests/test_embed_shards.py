"""`bbox embed --shard i/n`: workers of an array each embed their own shards of one output dir, and
`bbox merge --stage embed` checks the whole; the result is the unsharded run's, byte for byte."""

from __future__ import annotations

import json

import numpy as np

from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.bookkeeping import staleness
from bbox_sae.manifest import Manifest
from bbox_sae.stages import BY_NAME
from helpers.cli import assert_one_line_error, bbox
from helpers.project import make_project, sample_docs

N_DOCS = 7  # shard_docs 2: shards 0..3, the last one short


def _project(tmp_path):
    return make_project(tmp_path, sample_docs(N_DOCS, seed=3))


def _embeddings(out) -> dict:
    table = read_table(out / "embeddings").sort_by([("doc_id", "ascending"), ("word_idx", "ascending")])
    return {"keys": table.select(["doc_id", "word_idx"]).to_pydict(), "vectors": np.stack(table["embedding"].to_numpy(zero_copy_only=False))}


def test_shards_embedded_by_separate_workers_merge_into_the_unsharded_result(tmp_path, capsys):
    project = _project(tmp_path)
    cfg = project.load()
    whole = tmp_path / "whole"
    assert bbox(capsys, "ingest", "-c", str(project.config))[0] == 0
    assert bbox(capsys, "embed", "-c", str(project.config), "--shard", "1/2")[0] == 0
    # Worker 1 of 2 owns shards 1 and 3 and wrote nothing else; the stage is not finished yet.
    assert ShardedTable(cfg.paths.embeddings).indices() == [1, 3]
    assert staleness(BY_NAME["embed"], cfg, Manifest.read(cfg.out)) == "has not finished"
    stats = json.loads(cfg.paths.embedding_shard_stats(1, 2).read_text())
    assert stats["documents"] == 3  # documents 2-3 and 6
    assert bbox(capsys, "embed", "-c", str(project.config), "--shard", "0/2")[0] == 0
    assert bbox(capsys, "merge", "-c", str(project.config), "--stage", "embed") == (0, "")
    assert staleness(BY_NAME["embed"], cfg, Manifest.read(cfg.out)) is None

    assert bbox(capsys, "ingest", "-c", str(project.config), "-o", str(whole))[0] == 0
    assert bbox(capsys, "embed", "-c", str(project.config), "-o", str(whole))[0] == 0
    sharded, unsharded = ShardedTable(cfg.paths.embeddings), ShardedTable(whole / "embeddings")
    assert sharded.indices() == unsharded.indices() == [0, 1, 2, 3]
    for k in sharded.indices():
        assert sharded.shard_path(k).read_bytes() == unsharded.shard_path(k).read_bytes()
    a, b = _embeddings(cfg.out), _embeddings(whole)
    assert a["keys"] == b["keys"] and np.array_equal(a["vectors"], b["vectors"])


def test_merge_names_the_shard_no_worker_wrote(tmp_path, capsys):
    project = _project(tmp_path)
    cfg = project.load()
    assert bbox(capsys, "ingest", "-c", str(project.config))[0] == 0
    assert bbox(capsys, "embed", "-c", str(project.config), "--shard", "0/2")[0] == 0
    missing = ShardedTable(cfg.paths.embeddings).shard_path(1)
    assert_one_line_error(*bbox(capsys, "merge", "-c", str(project.config), "--stage", "embed"), "embeddings incomplete", "[1, 3]", str(missing))
    assert staleness(BY_NAME["embed"], cfg, Manifest.read(cfg.out)) == "has not finished"


def test_a_damaged_shard_is_refused_by_merge_and_redone_by_its_worker(tmp_path, capsys):
    project = _project(tmp_path)
    cfg = project.load()
    assert bbox(capsys, "ingest", "-c", str(project.config))[0] == 0
    for spec in ("0/2", "1/2"):
        assert bbox(capsys, "embed", "-c", str(project.config), "--shard", spec)[0] == 0
    shard = ShardedTable(cfg.paths.embeddings).shard_path(2)
    good = shard.read_bytes()
    shard.write_bytes(good[:-8] + b"\0" * 8)
    assert_one_line_error(*bbox(capsys, "merge", "-c", str(project.config), "--stage", "embed"), "[2]")
    untouched = ShardedTable(cfg.paths.embeddings).shard_path(1).stat().st_mtime_ns
    assert bbox(capsys, "embed", "-c", str(project.config), "--shard", "0/2")[0] == 0
    assert shard.read_bytes() == good
    assert ShardedTable(cfg.paths.embeddings).shard_path(1).stat().st_mtime_ns == untouched
    assert bbox(capsys, "merge", "-c", str(project.config), "--stage", "embed")[0] == 0


def test_a_bad_shard_spec_is_one_line(tmp_path, capsys):
    project = _project(tmp_path)
    assert bbox(capsys, "ingest", "-c", str(project.config))[0] == 0
    assert_one_line_error(*bbox(capsys, "embed", "-c", str(project.config), "--shard", "2/2"), "--shard '2/2'")
