"""Damaged shards: a shard whose bytes were flipped, that was truncated, or
whose sidecar is missing (a write killed between the two) is refused by every reader with an
ArtifactError naming it, and recomputed (alone) by the next run of its stage; a missing shard
is never silently skipped.
"""

from __future__ import annotations

import re
import shutil

import pytest

from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.build.matrix import open_matrix, run_build
from bbox_sae.errors import ArtifactError
from helpers.cli import bbox_process
from helpers.hardening import assert_same_outputs, build_reference, complete_shards, hardening_project, run_stage_in_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = hardening_project(tmp_path_factory.mktemp("shards"))
    build_reference(project.config, ["score", "embed"])
    return project


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _fresh_copy(project, name: str):
    """The config of a copy of the module's reference run, to damage."""
    work = project.root / name / "out"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(project.out, work)
    return project.load(output_dir=work)


@pytest.mark.parametrize(
    "table, stage, damage",
    [
        (lambda paths: paths.logprobs("gem"), "score", "flip"),
        (lambda paths: paths.embeddings, "embed", "truncate"),
        (lambda paths: paths.words, "score", "no-sidecar"),
    ],
    ids=["logprobs-flip", "embeddings-truncate", "words-no-sidecar"],
)
def test_damaged_shard_is_refused_by_readers_and_recomputed_by_its_stage(project, table, stage, damage):
    cfg = _fresh_copy(project, "damaged")
    ref, work = project.paths, cfg.paths
    damaged = table(work)
    victim = ShardedTable(damaged).shard_path(1)
    if damage == "flip":
        _flip_byte(victim)  # same size: only the checksum can tell
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-100])
    else:
        victim.with_suffix(".json").unlink()  # as a kill between the shard and its sidecar leaves it

    message = rf"{re.escape(str(damaged))}: (corrupted or truncated|incomplete) shard\(s\) part-00001.parquet"
    with pytest.raises(ArtifactError, match=message):
        read_table(damaged)
    with pytest.raises(ArtifactError, match=message):  # the build refuses it before reading a row of it
        run_build(cfg)

    victim_files = str(victim.relative_to(work.root).with_suffix(""))  # the shard and its sidecar
    others = {k: v for k, v in complete_shards(work.root).items() if not k.startswith(victim_files)}
    run_stage_in_process(stage, cfg)
    assert victim.read_bytes() == (table(ref) / victim.name).read_bytes()
    assert_same_outputs(work.root, ref.root, stage)
    after = complete_shards(work.root)
    assert [k for k, v in others.items() if after.get(k) != v] == [], "intact shards were recomputed"


def test_cli_names_the_damaged_shard_in_one_line(project):
    work = _fresh_copy(project, "damaged-cli").paths
    _flip_byte(ShardedTable(work.logprobs("smol")).shard_path(2))
    build = bbox_process("build", "--config", str(project.config), "--output-dir", str(work.root))
    assert build.returncode == 2 and "Traceback" not in build.stderr, build.stderr
    assert build.stderr.strip().splitlines() == [
        f"bbox: error: {work.logprobs('smol')}: corrupted or truncated shard(s) part-00002.parquet; re-run the stage to recompute them"
    ]


def test_build_refuses_a_missing_shard_instead_of_skipping_its_words(project):
    cfg = _fresh_copy(project, "missing")
    work = cfg.paths
    run_build(cfg)  # a good build, which must not be trusted after the failed one below
    last = ShardedTable(work.embeddings).shard_path(3)  # the last shard: no gap for read_table to see
    for f in (last, last.with_suffix(".json")):
        f.unlink()
    assert read_table(work.embeddings).num_rows < read_table(project.paths.embeddings).num_rows
    with pytest.raises(ArtifactError, match=r"embeddings: shard\(s\) \[3\] missing"):
        run_build(cfg)
    assert not work.build_info.exists()  # withdrawn: the old build is not trusted
    with pytest.raises(ArtifactError, match="build.json: not found"):
        open_matrix(cfg)


def test_damaged_documents_table_is_reingested_not_trusted(project):
    cfg = _fresh_copy(project, "documents")
    ref, work = project.paths, cfg.paths
    _flip_byte(work.documents)
    kept = complete_shards(work.root)
    run_stage_in_process("score", cfg)
    assert work.documents.read_bytes() == ref.documents.read_bytes()
    assert_same_outputs(work.root, ref.root, "score")
    after = complete_shards(work.root)
    assert [k for k, v in kept.items() if after.get(k) != v] == []  # no shard recomputed
