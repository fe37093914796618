"""The benchmark scripts run end to end in --quick mode and write their JSON (rates > 0, a ratio)."""

import json
import subprocess
import sys
from pathlib import Path

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
