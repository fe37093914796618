"""The real CLI entry point on the cases careful users hit, each as a regression test.

Runs `bbox_sae.cli.main` in this process (the same code path as the `bbox` command, without
starting Python for every case) on a project whose two models are users' log-prob Parquet
files, so a run up to build costs a fraction of a second. Every failure must be one line
`bbox: error: ...` naming the path or field, exit 2, no traceback.
"""

from __future__ import annotations

import errno
import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bbox_sae import __version__
from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.bookkeeping import run_lock
from bbox_sae.cli import main
from bbox_sae.layout import RunLayout
from bbox_sae.manifest import Manifest
from bbox_sae.stages import STAGE_NAMES
from helpers.cli import assert_one_line_error, bbox
from helpers.project import TEXTS, USER_OFFSET, make_project, write_corpus, write_logprobs

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture()
def project(tmp_path):
    return make_project(tmp_path)


def write_user_logprobs(project, texts: dict[str, str]) -> None:
    """Both users' log-prob files for `texts`, as make_project writes them."""
    for i, model in enumerate(("a", "b")):
        write_logprobs(project.logprob_file(model), texts, USER_OFFSET * i)


def run_until(capsys, project, stage: str = "build", *extra: str, out: Path | None = None) -> tuple[int, str]:
    return bbox(capsys, "run", "-c", str(project.config), "--until", stage, *(("-o", str(out)) if out else ()), *extra)


# Written with the run's time or the command's own config, not derived from the inputs.
_RUN = RunLayout(Path())
NOT_COMPARED = {_RUN.manifest.name, _RUN.config.name, _RUN.embedding_stats.name, _RUN.score_stats(0, 1).name}


def comparable(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name not in NOT_COMPARED and not p.name.startswith(".")
    }


def assert_equals_fresh(capsys, project, stage: str = "build") -> None:
    fresh = project.root / "fresh"
    code, err = run_until(capsys, project, stage, out=fresh)
    assert code == 0, err
    mine, theirs = comparable(project.out), comparable(fresh)
    assert sorted(mine) == sorted(theirs)
    assert [k for k in mine if mine[k] != theirs[k]] == []


# ---------------------------------------------------------------- edits between runs


def test_edited_document_same_word_count_is_re_embedded_and_rebuilt(project, capsys):
    assert run_until(capsys, project)[0] == 0
    edited = {**TEXTS, "d2": TEXTS["d2"].replace("wherefore", "whenceforth")}  # same word count
    write_corpus(project.corpus, edited)
    code, err = run_until(capsys, project)
    assert code == 0, err
    assert "embed: up to date" not in err and "build: up to date" not in err
    assert_equals_fresh(capsys, project)


def test_edited_document_other_word_count_never_wedges_the_run(project, capsys):
    assert run_until(capsys, project)[0] == 0
    edited = {**TEXTS, "d1": TEXTS["d1"] + " And more words follow here."}
    write_corpus(project.corpus, edited)
    write_user_logprobs(project, edited)
    for force in ([], ["--force", "embed"], ["--force", "score"]):
        code, err = run_until(capsys, project, "build", *force)
        assert code == 0, err
    assert_equals_fresh(capsys, project)


def test_changed_split_settings_reach_words_build_and_features(project, capsys):
    assert run_until(capsys, project)[0] == 0
    for override in ("corpus.holdout_fraction=0.6", "seed=3"):
        code, err = run_until(capsys, project, "build", "--set", override)
        assert code == 0, err
        documents, words = read_table(project.paths.documents), read_table(project.paths.words)
        split = dict(zip(documents["doc_id"].to_pylist(), documents["split"].to_pylist()))
        assert [split[d] for d in words["doc_id"].to_pylist()] == words["split"].to_pylist()
        index = read_table(project.paths.index)
        assert [split[d] for d in index["doc_id"].to_pylist()] == index["split"].to_pylist()
    # What the user saw: features after a split change differed from a fresh run's.
    small = ("--set", "seed=3", "--set", "sae.d_sae=16", "--set", "sae.k=2", "--set", "sae.epochs=2")
    assert run_until(capsys, project, "features", *small)[0] == 0
    assert run_until(capsys, project, "features", *small, out=project.root / "fresh")[0] == 0
    for name in ("features", "findings", "top_activations"):
        # Compared as JSON text: NaN statistics (too few holdout words) then compare equal.
        mine, fresh = (json.dumps(read_table(getattr(RunLayout(d), name)).to_pylist(), default=str) for d in (project.out, project.root / "fresh"))
        assert mine == fresh, name


def test_rewritten_user_logprobs_are_reimported_and_rebuilt(project, capsys):
    assert run_until(capsys, project)[0] == 0
    write_logprobs(project.logprob_file("a"), TEXTS, offset=2.0)  # same path, new values
    code, err = run_until(capsys, project)
    assert code == 0, err
    assert "score: up to date" not in err and "build: up to date" not in err
    index = read_table(project.paths.index)
    assert max(index["logprob__a"].to_pylist()) <= -3.0
    assert_equals_fresh(capsys, project)


def test_bbox_score_reimport_then_run_rebuilds(project, capsys):
    assert run_until(capsys, project)[0] == 0
    write_logprobs(project.logprob_file("a"), TEXTS, offset=2.0)
    assert bbox(capsys, "score", "-c", str(project.config))[0] == 0
    code, err = run_until(capsys, project)
    assert code == 0 and "build: up to date" not in err, err
    assert max(read_table(project.paths.index)["logprob__a"].to_pylist()) <= -3.0


def test_invalid_new_user_logprobs_stop_the_later_stages(project, capsys):
    assert run_until(capsys, project)[0] == 0
    (project.logprob_file("a")).write_text("not parquet")
    assert_one_line_error(*bbox(capsys, "score", "-c", str(project.config)), "a.parquet")
    # The previous log-probs are no longer current: build refuses them instead of exiting 0.
    assert_one_line_error(*bbox(capsys, "build", "-c", str(project.config)), "stage 'score'", "bbox score")


def test_stage_alone_refuses_inputs_out_of_date(project, capsys):
    assert run_until(capsys, project)[0] == 0
    write_corpus(project.corpus, {**TEXTS, "d0": "Edited."})
    assert_one_line_error(*bbox(capsys, "embed", "-c", str(project.config)), "stage 'ingest'", "out of date", project.paths.documents.name)


def test_refused_run_leaves_the_config_as_it_was(project, capsys):
    assert run_until(capsys, project, "ingest")[0] == 0
    before = (project.paths.config).read_bytes()
    with run_lock(project.out):
        assert_one_line_error(*run_until(capsys, project, "ingest", "--set", "sae.k=8"), "in use by another bbox run")
    assert (project.paths.config).read_bytes() == before


@pytest.mark.parametrize("command", [["build"], ["eval", "coherence"]])
def test_single_stage_command_refused_by_the_lock_leaves_the_config_as_it_was(project, capsys, command):
    assert run_until(capsys, project, "build")[0] == 0
    before = (project.paths.config).read_bytes()
    with run_lock(project.out):
        code, err = bbox(capsys, *command, "-c", str(project.config), "--set", "sae.k=8")
        assert_one_line_error(code, err, "in use by another bbox run")
    assert (project.paths.config).read_bytes() == before


def test_force_redoes_a_stage_and_those_after_it(project, capsys):
    assert run_until(capsys, project)[0] == 0
    code, err = run_until(capsys, project, "build", "--force", "embed")
    assert code == 0
    assert "ingest: up to date" in err and "score: up to date" in err
    assert "embed: done" in err and "build: done" in err


def test_stage_outputs_changed_by_hand_are_redone(project, capsys):
    assert run_until(capsys, project)[0] == 0
    (project.paths.index).unlink()
    code, err = run_until(capsys, project)
    assert code == 0 and "build: done" in err and "embed: up to date" in err
    assert_equals_fresh(capsys, project)


def test_operational_settings_redo_nothing_and_key_settings_redo_their_stage(project, capsys):
    small = ("--set", "sae.d_sae=16", "--set", "sae.k=2", "--set", "sae.epochs=2")
    assert run_until(capsys, project, "features", *small)[0] == 0
    knobs = ("build.chunk_rows=3", "features.chunk_rows=2", "embedding.batch_size=1", "sae.checkpoint_every=7", "sae.device=cpu")
    code, err = run_until(capsys, project, "features", *small, *(a for knob in knobs for a in ("--set", knob)))
    assert code == 0 and all(f"{name}: up to date" in err for name in STAGE_NAMES[: STAGE_NAMES.index("features") + 1]), err
    code, err = run_until(capsys, project, "features", *small, "--set", "build.output_feature_weight=0.5")
    assert code == 0 and "embed: up to date" in err and "build: done" in err and "features: done" in err, err


# ---------------------------------------------------------------- OS errors: one line naming the path


def test_output_dir_that_is_a_file(project, capsys):
    project.out.write_text("a file")
    for command in ("run", "ingest"):
        assert_one_line_error(*bbox(capsys, command, "-c", str(project.config)), f"output_dir {project.out}: exists and is not a directory")


def test_output_dir_inside_a_file_is_one_line(project, capsys):
    (project.root / "blocker").write_text("a file")
    for command in ("run", "ingest"):
        line = assert_one_line_error(*bbox(capsys, command, "-c", str(project.config), "-o", str(project.root / "blocker" / "out")))
        assert str(project.root / "blocker") in line, line


@pytest.mark.parametrize(
    "code_, message", [(errno.EACCES, "Permission denied"), (errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system")]
)
def test_os_errors_are_one_line_naming_the_path_and_the_run_recovers(project, capsys, monkeypatch, code_, message):
    from bbox_sae import artifacts

    real = artifacts.os.replace

    def failing(src, dst):
        if str(dst).endswith(".parquet") and "words" in str(dst):
            raise OSError(code_, message)
        return real(src, dst)

    monkeypatch.setattr(artifacts.os, "replace", failing)
    line = assert_one_line_error(*run_until(capsys, project), message)
    assert str(ShardedTable(project.paths.words).shard_path(0)) in line
    assert not list(project.paths.words.glob(".*.tmp"))  # the temp file is cleaned up
    monkeypatch.setattr(artifacts.os, "replace", real)  # space freed / permission given back
    assert run_until(capsys, project)[0] == 0
    assert_equals_fresh(capsys, project)


def test_unwritable_output_dir_is_one_line(project, capsys):
    # /proc refuses new entries even to root, as a read-only or foreign mount would.
    assert_one_line_error(*bbox(capsys, "run", "-c", str(project.config), "-o", "/proc/bbox-out"), "/proc/bbox-out")


# ---------------------------------------------------------------- user data and --set values


@pytest.mark.parametrize(
    "override, needles",
    [
        ("sae.k=[1,", ["'sae.k'", "not valid YAML"]),
        ("corpus.path=*.jsonl", ["'corpus.path'", "not valid YAML", "quote"]),
        ("=3", ["does not name a config field"]),
        ("sae.epochs=true", ["'sae.epochs'", "got a boolean"]),
        ("sae.k=false", ["'sae.k'", "got a boolean"]),
    ],
)
def test_bad_set_values_are_one_line(project, capsys, override, needles):
    assert_one_line_error(*bbox(capsys, "ingest", "-c", str(project.config), "--set", override), *needles)


def test_boolean_fields_still_take_booleans(project):
    cfg = project.load("features.require_generalize=false", "label.json_mode=true")
    assert cfg.features.require_generalize is False and cfg.label.json_mode is True


SET_KEYS = st.sampled_from(
    [
        "sae.k",
        "sae.d_sae",
        "sae.epochs",
        "sae.lr",
        "corpus.holdout_fraction",
        "corpus.shard_docs",
        "corpus.max_docs",
        "seed",
        "build.performance",
        "sae",
        "corpus",
        "x",
        "models.0.window",
        "models.5",
        "",
    ]
)
SET_VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["[1,", "*.jsonl", "{a: 1", "true", "null", "1e999", "-1", "0", "0.5", "'x'", "&a", "!!python/object:os.system", "9" * 5000, "[" * 3000]),
)


@given(sets=st.lists(st.tuples(SET_KEYS, SET_VALUES), min_size=1, max_size=3))
@example(sets=[("sae.k", "[1,")])
@FUZZ
def test_set_fuzz_is_ok_or_one_line(project, capsys, sets):
    shutil.rmtree(project.out, ignore_errors=True)
    args = [a for key, value in sets for a in ("--set", f"{key}={value}")]
    code, err = bbox(capsys, "ingest", "-c", str(project.config), *args)
    if code != 0:
        assert_one_line_error(code, err)


COLUMN_VALUES = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=3),
    st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=3),
    st.lists(st.text(max_size=4), min_size=1, max_size=3),
    st.lists(st.none(), min_size=1, max_size=3),
    st.lists(st.booleans(), min_size=1, max_size=3),
)


@given(doc_id=COLUMN_VALUES, word_idx=COLUMN_VALUES, logprob=COLUMN_VALUES, drop=st.sampled_from([None, "doc_id", "word_idx", "logprob"]))
@example(doc_id=["d0"], word_idx=[0], logprob=["abc"], drop=None)
@example(doc_id=["d0"], word_idx=[3.5], logprob=[-1.0], drop=None)
@example(doc_id=["d0"], word_idx=[0], logprob=[math.inf], drop=None)
@FUZZ
def test_user_parquet_fuzz_is_ok_or_one_line(project, capsys, doc_id, word_idx, logprob, drop):
    n = min(len(doc_id), len(word_idx), len(logprob))
    columns = {"doc_id": doc_id[:n], "word_idx": word_idx[:n], "logprob": logprob[:n]}
    if drop:
        del columns[drop]
    pq.write_table(pa.table(columns), project.logprob_file("a"))
    code, err = bbox(capsys, "score", "-c", str(project.config))
    if code != 0:
        assert_one_line_error(code, err, "a.parquet")


@pytest.mark.parametrize(
    "logprob, word_idx, needles",
    [
        (["abc"], [0], ["column 'logprob'", "cannot be read as double"]),
        ([-1.0], [3.5], ["column 'word_idx'", "cannot be read as int32"]),
        ([math.inf], [0], ["log-prob inf > 0", "document 'd0' word 0"]),
        ([0.5], [0], ["log-prob 0.5 > 0"]),
    ],
)
def test_uncastable_or_positive_user_logprobs(project, capsys, logprob, word_idx, needles):
    pq.write_table(pa.table({"doc_id": ["d0"], "word_idx": word_idx, "logprob": logprob}), project.logprob_file("a"))
    assert_one_line_error(*bbox(capsys, "score", "-c", str(project.config)), str(project.logprob_file("a")), *needles)


def test_missing_user_parquet_is_named_as_such(project, capsys):
    (project.logprob_file("a")).unlink()
    line = assert_one_line_error(*bbox(capsys, "score", "-c", str(project.config)), str(project.logprob_file("a")), "log-prob file not found")
    assert "was the stage run" not in line


# ---------------------------------------------------------------- holdout edge cases


def test_all_documents_in_holdout_is_one_line(project, capsys):
    from bbox_sae.corpus.documents import split_of

    seed = next(s for s in range(1000) if all(split_of(d, 0.9, s) == "holdout" for d in TEXTS))
    assert_one_line_error(*run_until(capsys, project, "train", "--set", "corpus.holdout_fraction=0.9", "--set", f"seed={seed}"), "no training rows", "holdout")


def test_no_holdout_documents_says_why_nothing_will_be_kept(project, capsys, caplog):
    assert run_until(capsys, project, "ingest", "--set", "corpus.holdout_fraction=0")[0] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("no holdout documents" in m and "features.require_generalize" in m for m in warnings), warnings
    caplog.clear()
    overrides = ["--set", "corpus.holdout_fraction=0", "--set", "features.require_generalize=false", "--force", "ingest"]
    assert run_until(capsys, project, "ingest", *overrides)[0] == 0
    assert not [r for r in caplog.records if "no holdout documents" in r.getMessage()]


# ---------------------------------------------------------------- smaller promises


def test_a_finished_runs_own_config_serves_when_no_config_is_given(project, capsys):
    """`bbox report -o runs/demo` on a run made before: its saved config.yaml is the config."""
    assert run_until(capsys, project)[0] == 0
    code, err = bbox(capsys, "build", "-o", str(project.out))
    assert code == 0, err
    assert_one_line_error(*bbox(capsys, "build"), "--config", "--output-dir")
    assert_one_line_error(*bbox(capsys, "build", "-o", str(project.root / "nowhere")), "config.yaml", "nowhere")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"bbox-sae {__version__}"


def test_relative_paths_resolve_against_the_working_directory(project, capsys, monkeypatch):
    cfg = yaml.safe_load(project.config.read_text())
    cfg["corpus"]["path"] = "c.jsonl"
    cfg["output_dir"] = "rel-out"
    (project.root / "rel.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True))
    monkeypatch.chdir(project.root)
    assert bbox(capsys, "ingest", "-c", "rel.yaml")[0] == 0
    assert RunLayout(project.root / "rel-out").documents.exists()
    elsewhere = project.root / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert_one_line_error(*bbox(capsys, "ingest", "-c", str(project.root / "rel.yaml")), "c.jsonl", "not found")


def test_documented_pyarrow_recipe_reads_a_sharded_table(project, capsys):
    import pyarrow.dataset as pads

    assert run_until(capsys, project, "ingest")[0] == 0
    doc = (Path(__file__).parents[1] / "docs" / "artifacts.md").read_text()
    assert 'pyarrow.dataset.dataset(path, format="parquet", exclude_invalid_files=True)' in doc
    words = project.paths.words
    assert list(words.glob("*.json"))  # the sidecars that broke the bare call
    table = pads.dataset(str(words), format="parquet", exclude_invalid_files=True).to_table()
    assert table.sort_by([("doc_id", "ascending"), ("word_idx", "ascending")]).equals(
        read_table(words).sort_by([("doc_id", "ascending"), ("word_idx", "ascending")])
    )


def test_every_stage_has_a_command_and_run_runs_them_in_registry_order(project, capsys):
    from bbox_sae.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert set(STAGE_NAMES) <= set(commands)
    code, err = run_until(capsys, project)
    assert code == 0
    order = [line.split("]")[1].split(":")[0].strip() for line in err.splitlines() if line.startswith("[") and ": done" in line]
    assert order == STAGE_NAMES[: STAGE_NAMES.index("build") + 1]
    assert sorted(Manifest.read(project.out).stages) == sorted(order)


def test_manifest_records_are_withdrawn_while_a_stage_runs(project, capsys, monkeypatch):
    """A stage that fails leaves no record: its old outputs can no longer pass for current."""
    from bbox_sae.embedding import stage as embedding

    assert run_until(capsys, project)[0] == 0

    def broken(cfg, shard=None):
        raise OSError(errno.EIO, "Input/output error", str(cfg.paths.embeddings))

    monkeypatch.setattr(embedding, "run_embed", broken)
    assert_one_line_error(*run_until(capsys, project, "build", "--force", "embed"), "embeddings", "Input/output error")
    assert "embed" not in Manifest.read(project.out).stages
    assert_one_line_error(*bbox(capsys, "build", "-c", str(project.config)), "stage 'embed'", "has not finished")
