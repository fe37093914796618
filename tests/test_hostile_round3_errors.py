"""Issue 30, items 8-18: hostile inputs and faults that ended in a traceback, a misleading line, or
silence. Each case runs the real CLI entry point in this process (as tests/test_cli.py does) on a
project whose models are users' log-prob Parquet files, and asserts what the user sees: the exit
code, one line naming the file or field, no traceback, and what is kept on disk."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bbox_sae.config import CorpusConfig
from bbox_sae.corpus.documents import corpus_fingerprint, load_documents
from bbox_sae.errors import ConfigError
from bbox_sae.layout import RunLayout
from bbox_sae.manifest import Manifest
from helpers.cli import assert_one_line_error, bbox
from helpers.fake_openai import FakeOpenAI, json_reply, user_text
from helpers.project import SMALL_FEATURES_RUN, TEXTS, Project, copy_of, make_project, run_through_features

SMALL = SMALL_FEATURES_RUN


@pytest.fixture()
def project(tmp_path) -> Project:
    return make_project(tmp_path, **SMALL)


@pytest.fixture(scope="module")
def through_features(tmp_path_factory) -> Project:
    """One run up to `features`, copied by each test that needs it (`copy_of`)."""
    return run_through_features(tmp_path_factory.mktemp("through-features"))


def cli(capsys, command: str, project: Project, *args: str, out: Path | None = None) -> tuple[int, str]:
    return bbox(capsys, command, "-c", str(project.config), *(("-o", str(out)) if out else ()), *args)


# ---------------------------------------------------------------- 8: an unreachable labeler


def closed_port_url() -> str:
    """A local URL where nothing listens: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def sensible_judge(body: dict, index: int):
    text = user_text(body)
    if '"matches"' in text:
        return json_reply({"matches": [1]})
    if '"correct"' in text:
        return json_reply({"correct": [1]})
    return json_reply({"coherent": True, "description": "words the judge names"})


def test_unreachable_labeler_keeps_the_offline_labels_fails_in_one_line_and_is_retried(through_features, tmp_path, capsys):
    out = copy_of(through_features, tmp_path)
    unreachable = closed_port_url()
    code, err = cli(capsys, "label", through_features, "--set", f"label.base_url={unreachable}", "--set", "label.model=x", out=out.root)
    line = assert_one_line_error(code, err, "label.base_url", unreachable, "every label request failed", "connection failed")
    labels = pq.read_table(out.labels).to_pylist()
    stats = json.loads(out.label_stats.read_text())
    # Latent findings are offered to the LLM too: the count covers latents and latent findings.
    n = stats["features"] + stats["findings_offered_to_llm"]
    assert stats["features"] > 0 and f"({n} of {n}: latents and latent findings)" in line
    assert stats["labels_failed"] == n and stats["labels_answered"] == 0
    assert sum(stats["label_errors"].values()) == n and all("connection failed" in why for why in stats["label_errors"])
    # The offline statements are kept as the labels, under their own source, saying why.
    assert labels and all(r["label"] and r["label_source"] in ("rule", "heuristic") for r in labels)
    assert all("llm:x gave no label, the offline one is kept" in r["label_reason"] for r in labels)
    # Not recorded as done: the report refuses, and the next run asks the labeler again.
    assert "label" not in Manifest.read(out.root).stages
    assert_one_line_error(*cli(capsys, "report", through_features, out=out.root), "stage 'label'", "has not finished")
    with FakeOpenAI(sensible_judge) as server:
        code, err = cli(capsys, "run", through_features, "--set", f"label.base_url={server.base_url}", "--set", "label.model=x", out=out.root)
    assert code == 0, err
    assert "label" in Manifest.read(out.root).stages and out.report_html.exists()
    assert {r["label"] for r in pq.read_table(out.labels).to_pylist()} == {"words the judge names"}


def test_some_failed_labels_keep_their_offline_label_and_are_counted(through_features, tmp_path, capsys, caplog):
    out = copy_of(through_features, tmp_path)

    def first_label_fails(body, index):
        reply = sensible_judge(body, index)
        if '"matches"' not in user_text(body) and '"correct"' not in user_text(body) and index == 0:
            reply.status = 500
        return reply

    with FakeOpenAI(first_label_fails) as server, caplog.at_level(logging.WARNING):
        code, err = cli(capsys, "label", through_features, "--set", f"label.base_url={server.base_url}", "--set", "label.model=x", out=out.root)
    assert code == 0, err
    stats = json.loads(out.label_stats.read_text())
    assert stats["labels_failed"] == 1 and list(stats["label_errors"]) == ["label request failed after 1 attempt(s): HTTP 500: scripted 500"]
    rows = pq.read_table(out.labels).to_pylist()
    offline = [r for r in rows if r["label_source"] in ("rule", "heuristic")]
    assert len(offline) == 1 and "HTTP 500" in offline[0]["label_reason"] and offline[0]["label"]
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING and "LLM label" in r.getMessage()]


# ---------------------------------------------------------------- 9: disk full while training


def enforce_fail(*args, **kwargs):
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 768")


def safetensors_full(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize(
    "target, raiser, needle",
    [("torch.save", enforce_fail, "enforce fail at inline_container.cc:672"), ("sae_lens.saes.sae.save_file", safetensors_full, "no space left on device")],
)
def test_disk_full_while_checkpointing_is_one_line_and_training_resumes(project, capsys, monkeypatch, target, raiser, needle):
    assert cli(capsys, "run", project, "--until", "build")[0] == 0
    with monkeypatch.context() as m:
        m.setattr(target, raiser)
        line = assert_one_line_error(*cli(capsys, "train", project), "cannot write the training checkpoint", needle)
    checkpoints = project.load().sae_paths.checkpoints
    assert str(checkpoints) in line and "bbox train --resume" in line
    assert not [p for p in checkpoints.iterdir() if p.is_dir()]  # the half-written checkpoint is gone: resume can never pick it
    code, err = cli(capsys, "run", project, "--until", "train")  # space freed
    assert code == 0, err
    assert project.load().sae_paths.weights.exists()


def test_disk_full_while_saving_the_trained_sae_is_one_line(project, capsys, monkeypatch):
    assert cli(capsys, "run", project, "--until", "build")[0] == 0
    monkeypatch.setattr("sae_lens.saes.sae.save_file", safetensors_full)
    line = assert_one_line_error(*cli(capsys, "train", project, "--set", "sae.checkpoint_every=1000"), "no space left on device")
    assert str(project.load().sae_paths.weights) in line


# ---------------------------------------------------------------- 10, 11: encoder layer, devices


@pytest.mark.parametrize("layer", ["99", "-99"])
def test_embedding_layer_out_of_range_is_one_line_with_the_valid_range(project, capsys, tiny_encoder, layer):
    n = json.loads((Path(tiny_encoder) / "config.json").read_text())["num_hidden_layers"]
    line = assert_one_line_error(*cli(capsys, "run", project, "--until", "embed", "--set", f"embedding.layer={layer}"), f"embedding.layer {layer}")
    assert f"{-(n + 1)}..{n}" in line


def test_embedding_layers_at_both_ends_of_the_range_work(project, capsys, tiny_encoder):
    n = json.loads((Path(tiny_encoder) / "config.json").read_text())["num_hidden_layers"]
    for layer in (n, -(n + 1)):
        code, err = cli(capsys, "run", project, "--until", "embed", "--set", f"embedding.layer={layer}")
        assert code == 0, err


@pytest.mark.parametrize("command, field", [("embed", "embedding.device"), ("train", "sae.device")])
def test_a_cuda_device_without_cuda_is_one_line_naming_the_field(project, capsys, monkeypatch, command, field):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # Up to the stage before: the stage has work to do, so it needs its device.
    assert cli(capsys, "run", project, "--until", "score" if command == "embed" else "build")[0] == 0
    assert_one_line_error(*cli(capsys, command, project, "--set", f"{field}=cuda"), f"{field} 'cuda'", "'auto' or 'cpu'")
    # `auto` keeps working: it is the CPU here.
    code, err = cli(capsys, command, project, "--set", f"{field}=auto")
    assert code == 0, err


def test_a_cuda_device_index_past_the_visible_gpus_is_a_config_error(monkeypatch):
    from bbox_sae.models import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"sae.device 'cuda:3': only 1 CUDA device"):
        resolve_device("cuda:3", "sae.device")
    assert resolve_device("cuda:0", "sae.device") == torch.device("cuda:0")


# ---------------------------------------------------------------- 12: a GGUF that is not one


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"just some text, not a model\n", "not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00garbage", "cannot load GGUF"),  # the magic, then nothing a reader can parse
    ],
)
def test_a_file_that_is_not_gguf_is_one_line_naming_it(tmp_path, capsys, content, needle):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(content)
    project = make_project(tmp_path, models=["a", {"name": "g", "source": "gguf", "path": str(fake)}], **SMALL)
    line = assert_one_line_error(*cli(capsys, "score", project), needle)
    assert str(fake) in line


# ---------------------------------------------------------------- 13: an empty sweep axis


@pytest.mark.parametrize("axis", ["k", "d_sae"])
def test_an_empty_sweep_axis_is_one_line(project, capsys, axis):
    assert_one_line_error(*cli(capsys, "sweep", project, "--set", f"sae.{axis}=[]"), f"'sae.{axis}'", "empty list")


# ---------------------------------------------------------------- 14: malformed usage counts


def test_malformed_usage_in_a_reply_is_ignored_with_a_warning_and_the_label_stays(through_features, tmp_path, capsys, caplog):
    out = copy_of(through_features, tmp_path)

    def bad_usage(body, index):
        reply = sensible_judge(body, index)
        reply.usage = {"prompt_tokens": "x", "completion_tokens": 5}
        return reply

    with FakeOpenAI(bad_usage) as server, caplog.at_level(logging.WARNING):
        code, err = cli(capsys, "label", through_features, "--set", f"label.base_url={server.base_url}", "--set", "label.model=x", out=out.root)
    assert code == 0, err
    stats = json.loads(out.label_stats.read_text())
    assert stats["malformed_usage"] == len(server.requests) > 0 and stats["prompt_tokens"] == 0
    assert {r["label"] for r in pq.read_table(out.labels).to_pylist()} == {"words the judge names"}
    warnings = [r.getMessage() for r in caplog.records if "usage is not token counts" in r.getMessage()]
    assert len(warnings) == 1  # once per run, not once per reply


# ---------------------------------------------------------------- 15: disk full while building


def test_disk_full_while_writing_the_build_index_names_the_file(project, capsys, monkeypatch):
    assert cli(capsys, "run", project, "--until", "embed")[0] == 0
    real = pq.ParquetWriter.write_table

    def full(self, *args, **kwargs):
        raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    line = assert_one_line_error(*cli(capsys, "build", project), "No space left on device")
    assert line.startswith(f"bbox: error: {project.paths.index}: ")
    assert not [p.name for p in project.paths.build.iterdir() if ".tmp" in p.name]  # temp files removed
    monkeypatch.setattr(pq.ParquetWriter, "write_table", real)
    code, err = cli(capsys, "build", project)
    assert code == 0, err


# ---------------------------------------------------------------- 16: a folder of user log-probs


def test_a_folder_of_parquet_files_is_read_as_one_source_parquet_model(project, capsys):
    whole = pq.read_table(project.logprob_file("b"))
    folder = project.root / "b-parts"
    folder.mkdir()
    half = whole.num_rows // 2
    pq.write_table(whole.slice(0, half), folder / "part-0.parquet")
    pq.write_table(whole.slice(half), folder / "part-1.parquet")
    (folder / "_SUCCESS").write_text("")
    code, err = cli(capsys, "run", project, "--until", "build")
    assert code == 0, err
    from_file = pq.read_table(project.paths.index)
    from_folder = RunLayout(project.root / "from-folder")
    code, err = cli(capsys, "run", project, "--until", "build", "--set", f"models.1.path={folder}", out=from_folder.root)
    assert code == 0, err
    assert pq.read_table(from_folder.index).equals(from_file)


def test_a_folder_without_parquet_files_says_a_file_or_folder_of_them_is_expected(project, capsys):
    (project.root / "empty").mkdir()
    line = assert_one_line_error(*cli(capsys, "run", project, "--until", "score", "--set", f"models.1.path={project.root / 'empty'}"), "no .parquet files")
    assert "was the stage run" not in line and str(project.root / "empty") in line


def test_a_bad_file_in_a_user_folder_is_named(project, capsys):
    folder = project.root / "b-parts"
    folder.mkdir()
    shutil.copy(project.logprob_file("b"), folder / "part-0.parquet")
    pq.write_table(pa.table({"doc_id": ["d0"], "word_idx": pa.array([0], pa.int32())}), folder / "part-1.parquet")
    assert_one_line_error(*cli(capsys, "run", project, "--until", "score", "--set", f"models.1.path={folder}"), str(folder / "part-1.parquet"), "logprob")


# ---------------------------------------------------------------- 17: a CSV corpus


def test_a_csv_corpus_is_refused_in_one_line(project, capsys):
    csv = project.root / "corpus.csv"
    csv.write_text("id,text\n" + "".join(f"{d},{t.replace(',', '')}\n" for d, t in TEXTS.items()))
    line = assert_one_line_error(*cli(capsys, "run", project, "--until", "score", "--set", f"corpus.path={csv}"), str(csv), "CSV")
    assert "Parquet or JSONL" in line
    assert not project.paths.documents.exists()


# ---------------------------------------------------------------- 18: symlinked folders in a corpus


def linked_corpus(tmp_path: Path) -> Path:
    """6 documents in corpus/, 6 in elsewhere/, which corpus/more links to."""
    root, elsewhere = tmp_path / "corpus", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    for i in range(6):
        (root / f"a{i}.txt").write_text(f"Here is document a{i}.")
        (elsewhere / f"b{i}.txt").write_text(f"There is document b{i}.")
    os.symlink(elsewhere, root / "more")
    return root


def test_a_symlinked_subfolder_is_read_and_its_edits_are_seen(tmp_path):
    cfg = CorpusConfig(path=str(linked_corpus(tmp_path)))
    docs = load_documents(cfg)
    assert sorted(d.id for d in docs) == [f"a{i}" for i in range(6)] + [f"more/b{i}" for i in range(6)]
    before = corpus_fingerprint(cfg)
    (tmp_path / "elsewhere" / "b3.txt").write_text("There is document b3, edited.")
    assert corpus_fingerprint(cfg) != before  # an edit behind the link re-ingests


def test_a_symlink_loop_in_a_corpus_is_read_once_with_a_warning(tmp_path, caplog):
    root = linked_corpus(tmp_path)
    os.symlink(root, root / "loop")  # back up the tree
    os.symlink(tmp_path / "elsewhere", root / "again")  # a second way into elsewhere/
    with caplog.at_level(logging.WARNING):
        docs = load_documents(CorpusConfig(path=str(root)))
    # Path order: again/ comes before more/, so elsewhere/ is read as again/.
    assert sorted(d.id for d in docs) == [f"a{i}" for i in range(6)] + [f"again/b{i}" for i in range(6)]
    skipped = sorted(r.getMessage().split(":")[0] for r in caplog.records if "is read already" in r.getMessage())
    assert skipped == [str(root / "loop"), str(root / "more")]
