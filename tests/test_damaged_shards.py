"""Damaged shards: a shard whose bytes were flipped, that was truncated, or
whose sidecar is missing (a write killed between the two) is refused by every reader with an
ArtifactError naming it, and recomputed (alone) by the next run of its stage; a missing shard
is never silently skipped.
"""

from __future__ import annotations

import shutil

import pytest

from hardening import assert_same_outputs, build_reference, cli, complete_shards, run_stage_in_process, write_project

from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.config import load_config
from bbox_sae.build.matrix import open_matrix, run_build
from bbox_sae.errors import ArtifactError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_lm, tiny_encoder):
    root = tmp_path_factory.mktemp("shards")
    config = write_project(root, tiny_lm, tiny_encoder)
    counts = build_reference(config, ["score", "embed"])
    return root, config, counts


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _fresh_copy(root, name: str):
    """A copy of the module's reference run, to damage."""
    work = root / name / "out"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(root / "ref" / "out", work)
    return work


@pytest.mark.parametrize("table, damage", [("logprobs/gem", "flip"), ("embeddings", "truncate"), ("words", "no-sidecar")])
def test_damaged_shard_is_refused_by_readers_and_recomputed_by_its_stage(project, table, damage):
    root, config, _ = project
    ref, work = root / "ref" / "out", _fresh_copy(root, "damaged")
    cfg = load_config(config, output_dir=str(work))
    shard = ShardedTable(work / table)
    victim = shard.shard_path(1)
    if damage == "flip":
        _flip_byte(victim)  # same size: only the checksum can tell
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-100])
    else:
        victim.with_suffix(".json").unlink()  # as a kill between the shard and its sidecar leaves it

    message = rf"{table}: (corrupted or truncated|incomplete) shard\(s\) part-00001.parquet"
    with pytest.raises(ArtifactError, match=message):
        read_table(work / table)
    with pytest.raises(ArtifactError, match=message):  # the build refuses it before reading a row of it
        run_build(cfg)

    others = {k: v for k, v in complete_shards(work).items() if not k.startswith(f"{table}/part-00001")}
    stage = "embed" if table == "embeddings" else "score"
    run_stage_in_process(stage, cfg)
    assert victim.read_bytes() == (ref / table / victim.name).read_bytes()
    assert_same_outputs(work, ref, stage)
    after = complete_shards(work)
    assert [k for k, v in others.items() if after.get(k) != v] == [], "intact shards were recomputed"


def test_cli_names_the_damaged_shard_in_one_line(project):
    root, config, _ = project
    work = _fresh_copy(root, "damaged-cli")
    _flip_byte(work / "logprobs" / "smol" / "part-00002.parquet")
    build = cli("build", "--config", str(config), "--output-dir", str(work))
    assert build.returncode == 2 and "Traceback" not in build.stderr, build.stderr
    assert build.stderr.strip().splitlines() == [
        f"bbox: error: {work / 'logprobs' / 'smol'}: corrupted or truncated shard(s) part-00002.parquet; re-run the stage to recompute them"
    ]


def test_build_refuses_a_missing_shard_instead_of_skipping_its_words(project):
    root, config, _ = project
    ref, work = root / "ref" / "out", _fresh_copy(root, "missing")
    cfg = load_config(config, output_dir=str(work))
    run_build(cfg)  # a good build, which must not be trusted after the failed one below
    for f in ("part-00003.parquet", "part-00003.json"):  # the last shard: no gap for read_table to see
        (work / "embeddings" / f).unlink()
    assert read_table(work / "embeddings").num_rows < read_table(ref / "embeddings").num_rows
    with pytest.raises(ArtifactError, match=r"embeddings: shard\(s\) \[3\] missing"):
        run_build(cfg)
    assert not (work / "build" / "build.json").exists()  # withdrawn: the old build is not trusted
    with pytest.raises(ArtifactError, match="build.json: not found"):
        open_matrix(cfg)


def test_damaged_documents_table_is_reingested_not_trusted(project):
    root, config, _ = project
    ref, work = root / "ref" / "out", root / "documents" / "out"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(ref, work)
    _flip_byte(work / "documents.parquet")
    kept = complete_shards(work)
    run_stage_in_process("score", load_config(config, output_dir=str(work)))
    assert (work / "documents.parquet").read_bytes() == (ref / "documents.parquet").read_bytes()
    assert_same_outputs(work, ref, "score")
    after = complete_shards(work)
    assert [k for k, v in kept.items() if after.get(k) != v] == []  # no shard recomputed
