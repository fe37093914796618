"""The benchmark scripts run end to end in --quick mode and write their JSON (rates > 0, a ratio)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bbox_sae.stages import STAGE_NAMES
from helpers.project import SMALL_RUN, make_project, sample_docs, tiny_pair
from helpers.repo import REPO


def run_bench(script: str, tmp_path: Path, *extra: str) -> dict:
    cmd = [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--threads", "1", "--results-dir", str(tmp_path), *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(tmp_path.glob("*.quick.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def test_bench_sae_quick(tmp_path):
    result = run_bench("bench_sae.py", tmp_path)
    assert result["quick"] is True
    (row,) = result["results"]
    assert row["plain"]["rows_per_s"] > 0
    for arch in ("topk", "batchtopk"):
        assert row[f"ours_{arch}"]["rows_per_s"] > 0
        assert row[f"ours_{arch}"]["rows_trained"] == row["plain"]["rows_trained"]
        assert row[f"ratio_ours_{arch}_over_plain"] > 0
    assert set(result["ratios"]) == {f"{row['d_sae']}:{row['k']}:topk", f"{row['d_sae']}:{row['k']}:batchtopk"}


def test_bench_embed_build_quick(tmp_path, tiny_encoder):
    # The tiny random encoder and a small corpus keep this fast and independent of `make demo`'s
    # corpus download; the defaults are the demo's MiniLM and Shakespeare.
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"Speech {i}: if you were here, all would be well.\n" * 8}) + "\n" for i in range(30)))
    out = tmp_path / "results"
    out.mkdir()
    result = run_bench(
        "bench_embed_build.py", out, "--set", f"embedding.model={tiny_encoder}", "--set", "embedding.package=null", "--set", f"corpus.path={corpus}"
    )
    embed, build = result["embed"], result["build"]
    assert embed["words"] > 0 and embed["ours"]["words_per_s"] > 0 and embed["baseline"]["words_per_s"] > 0
    assert embed["max_abs_vector_diff"] < 1e-4  # batching does not change the vectors
    assert build["rows"] > 0 and build["ours"]["rows_per_s"] > 0 and build["baseline"]["rows_per_s"] > 0
    assert result["ratios"]["embed_words_per_s_ours_over_baseline"] > 0
    assert result["ratios"]["build_rows_per_s_ours_over_baseline"] > 0


@pytest.mark.slow
def test_gpu_check_runs_in_its_cpu_mode(tmp_path):
    # The same script a lent GPU runs, reduced: the SAE benchmark for a few steps and the whole
    # pipeline on a tiny project whose two random-weight models are scored in process.
    project = make_project(tmp_path / "p", sample_docs(6, seed=2), models=tiny_pair(), **SMALL_RUN)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CHECK_CONFIG": str(project.config), "PY": sys.executable, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--cpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pipeline = json.loads((out / "pipeline" / "pipeline.json").read_text())
    assert list(pipeline["stages"]) == STAGE_NAMES and all(s["seconds"] > 0 and s["peak_rss_mb"] > 0 for s in pipeline["stages"].values())
    assert set(pipeline["scoring_tokens_per_s"]) == {"smol", "gem"} and min(pipeline["scoring_tokens_per_s"].values()) > 0
    assert pipeline["sae_rows_per_s"] > 0 and pipeline["sae_device"] == "cpu" and pipeline["embed_words_per_s"] > 0
    log = (out / "gpu_check.log").read_text()
    assert "pipeline: ok" in log and "sae-fp32: ok" in log
    assert "pipeline scoring smol:" in log and "SAE sae-fp32 d_in 386 N=512 k=16" in log
