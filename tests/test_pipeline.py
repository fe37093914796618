"""End-to-end `bbox run` on tiny random models built from the real SmolLM2 and Gemma tokenizers."""

import json
import subprocess
import sys

import pyarrow.compute as pc
import pytest

from bbox_sae.artifacts import read_table
from bbox_sae.labeling import labeled_features
from bbox_sae.pipeline import run_all
from bbox_sae.stages import STAGE_NAMES
from helpers.project import make_project, sample_docs, tiny_pair

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(
        tmp_path_factory.mktemp("e2e"),
        docs=sample_docs(24, sentences_per_doc=4, domains=("prose", "play")),
        models=tiny_pair(),
        corpus={"shard_docs": 8, "holdout_fraction": 0.25},
        embedding={"window": 32, "stride": 16},
        sae={"architecture": "topk", "d_sae": 32, "k": 4, "batch_size": 128, "epochs": 4, "lr": 0.003},
        features={"top_n": 10, "bootstrap_samples": 100},
        wandb={"mode": "offline"},
    )


def test_run_produces_consistent_artifacts_and_skips_what_is_up_to_date(project):
    cfg = project.load()
    first = run_all(cfg)
    assert first["ran"] == STAGE_NAMES
    paths = cfg.paths
    documents = read_table(paths.documents)
    words = read_table(paths.words)
    assert documents.num_rows == 24
    assert set(words["doc_id"].to_pylist()) == set(documents["doc_id"].to_pylist())
    for m in ("smol", "gem"):
        lp = read_table(paths.logprobs(m))
        assert lp.num_rows == words.num_rows
        assert lp["doc_id"].equals(words["doc_id"]) and lp["word_idx"].equals(words["word_idx"])
        # What the model expected at each word (its 3 likeliest tokens there), most likely first;
        # missing only where no token begins in the word.
        expected = [(t, p) for t, p in zip(lp["top_tokens"].to_pylist(), lp["top_logprobs"].to_pylist()) if t is not None]
        assert len(expected) >= 0.9 * lp.num_rows
        assert all(len(t) == len(p) == 3 and p == sorted(p, reverse=True) and p[0] <= 0 for t, p in expected)
    assert read_table(paths.embeddings).num_rows == words.num_rows
    build = json.loads(paths.build_info.read_text())
    index = read_table(paths.index)
    assert build["rows"] == index.num_rows == build["rows_in"] - build["dropped_missing_logprob"] - build["dropped_nonfinite_embedding"]
    features = labeled_features(paths)
    contexts = read_table(paths.contexts)
    assert features.num_rows > 0 and "label_source" in features.column_names
    assert set(contexts["latent"].to_pylist()) <= set(features["latent"].to_pylist())
    word_keys = set(zip(words["doc_id"].to_pylist(), words["word_idx"].to_pylist()))
    assert set(zip(contexts["doc_id"].to_pylist(), contexts["word_idx"].to_pylist())) <= word_keys
    kept = features.filter(pc.field("kept"))
    assert set(kept["label_source"].to_pylist()) <= {"heuristic", "rule", "word set"}  # offline labelers
    assert paths.report_html.stat().st_size > 1000 and paths.report_md.exists()
    assert "smol expected</th>" in paths.report_html.read_text() or not read_table(paths.findings).num_rows
    manifest = json.loads(paths.manifest.read_text())
    assert sorted(manifest["stages"]) == sorted(STAGE_NAMES)

    again = run_all(project.load())
    assert again["ran"] == []

    changed = run_all(project.load("sae.k=3"))
    assert changed["ran"] == ["train", "features", "label", "report"]

    # Fewer alternatives kept per word: the same log-probs, so the same matrix and findings, but
    # the report's panels read the tokens themselves and are redone.
    fewer = run_all(project.load("sae.k=3", "models.0.alternatives=2"))
    assert fewer["ran"][0] == "score" and fewer["ran"][-1] == "report" and "train" not in fewer["ran"]
    assert all(len(t) == 2 for t in read_table(paths.logprobs("smol"))["top_tokens"].to_pylist() if t is not None)


def test_cli_exit_codes(project):
    ok = subprocess.run([sys.executable, "-m", "bbox_sae", "run", "--config", str(project.config)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "up to date" in ok.stderr and "Report:" in ok.stderr
    bad = subprocess.run([sys.executable, "-m", "bbox_sae", "run", "--config", str(project.config), "--set", "sae.k=zero"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "'sae.k'" in bad.stderr


def test_final_summary_says_how_many_findings_it_does_not_list(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from rich.console import Console

    from bbox_sae import pipeline
    from bbox_sae.labeling import finding_statements

    rows = [
        {
            "finding": i,
            "better_model": "a" if i < 10 else "b",
            "latents": str(i),
            "statement": f"'w{i}'",
            "top_words": f"w{i} (3)",
            "kind": "rule" if i else "latent",
            "holdout_median_dlogp": 1.0,
            "holdout_ci_low": 0.5,
            "holdout_ci_high": 1.5,
            "holdout_n": 20 + i,
        }
        for i in range(12)
    ]
    monkeypatch.setattr(finding_statements, "labeled_findings", lambda paths: rows)
    console = Console(record=True, width=200)
    paths = SimpleNamespace(root=tmp_path, findings=tmp_path / "f", report_html=tmp_path / "r.html", rule_search=tmp_path / "rule_search.parquet")
    pipeline._final_summary(SimpleNamespace(paths=paths), console)
    text = console.export_text()
    assert "12 finding(s)" in text and "... and 2 more" in text  # model a: 10 findings, 8 listed
    assert "'w7'" in text and "'w8'" not in text and "'w11'" in text
    assert "latent group: 'w0'" in text and "latent group: 'w1'" not in text
    assert "n=27" in text and f"bbox findings {tmp_path}" in text

    # `bbox findings RUN` lists every one of them, or prints them as JSON lines.
    from bbox_sae.cli import main
    from bbox_sae.layout import RunLayout

    RunLayout(tmp_path).findings.write_bytes(b"")  # read through the patched labeled_findings
    console = Console(record=True, width=200)
    monkeypatch.setattr("rich.console.Console", lambda **kw: console)
    assert main(["findings", str(tmp_path)]) == 0
    listed = console.export_text()
    assert all(f"'w{i}'" in listed for i in range(12)) and "more" not in listed


def test_bbox_findings_prints_json_lines_and_refuses_a_folder_without_findings(monkeypatch, tmp_path, capsys):
    from bbox_sae.cli import main
    from bbox_sae.labeling import finding_statements
    from bbox_sae.layout import RunLayout

    assert main(["findings", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "findings.parquet" in err and "bbox run" in err
    row = {"finding": 0, "statement": "'w'", "better_model": "a", "holdout_median_dlogp": 1.5, "holdout_n": 9, "latents": "", "extra": 1}
    monkeypatch.setattr(finding_statements, "labeled_findings", lambda paths: [row])
    RunLayout(tmp_path).findings.write_bytes(b"")
    assert main(["findings", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["statement"] == "'w'" and printed["holdout_n"] == 9 and "extra" not in printed
