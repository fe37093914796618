"""benchmarks/bench_scale.py's parts: nested corpora, count-model log-probs a `source: parquet`
model accepts, and the growth ratio it reports (a full run is hours; `--quick` minutes)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.artifacts import read_table
from bbox_sae.corpus.ingest import ingest
from bbox_sae.corpus.words import word_spans
from helpers.project import make_project, sample_docs
from helpers.repo import load_script
from helpers.stages import score

bench = load_script("benchmarks/bench_scale.py")


def test_each_corpus_is_the_shortest_prefix_with_enough_words(tmp_path):
    docs = sample_docs(50, seed=4)
    sizes = [40, 200, 400]
    lines = []
    for n in sizes:
        path = tmp_path / f"{n}.jsonl"
        total = bench.write_corpus(path, docs, n)
        lines.append(path.read_text().splitlines())
        counts = [len(word_spans(d["text"])) for d in docs[: len(lines[-1])]]
        assert total == sum(counts) >= n > sum(counts[:-1])
    assert lines[0] == lines[1][: len(lines[0])] and lines[1] == lines[2][: len(lines[1])]


def test_count_models_score_every_word_as_a_parquet_model(tmp_path):
    project = make_project(tmp_path, sample_docs(8, seed=5))
    cfg = project.load()
    ingest(cfg)
    bench.write_count_model_logprobs(cfg, tmp_path)  # overwrites the project's a.parquet and b.parquet
    words = read_table(cfg.paths.words, columns=["doc_id", "word_idx", "word"])
    a, b = (pq.read_table(tmp_path / f"{m}.parquet") for m in ("a", "b"))
    for table in (a, b):
        assert table.select(["doc_id", "word_idx"]).to_pydict() == words.select(["doc_id", "word_idx"]).to_pydict()
        assert np.all(table["logprob"].to_numpy() < 0)
    # The unigram is a distribution over the corpus' lower-cased forms (add-one smoothing).
    forms = [w.lower() for w in words["word"].to_pylist()]
    first = dict(zip(forms, np.exp(a["logprob"].to_numpy())))
    assert abs(sum(first.values()) - 1) < 1e-9
    score(project.load())  # accepted as they are by the import


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(10, 10**7), st.floats(0.1, 1e4)), min_size=2, max_size=4, unique_by=lambda t: t[0]))
def test_growth_ratio_is_time_per_word_at_the_largest_size_over_the_next(points):
    sizes = {f"s{i}": {"words": w, "stages": {stage: {"seconds": s} for stage in [*bench.STAGES, "count models"]}} for i, (w, s) in enumerate(points)}
    growth = bench.growth(sizes)
    ordered = sorted(points)
    (w1, s1), (w2, s2) = ordered[-2:]
    for stage in bench.STAGES:
        assert np.isclose(growth[stage]["ratio"]["value"], round((s2 / w2) / (s1 / w1), 3), atol=1e-3)


@pytest.mark.slow
def test_from_stage_remeasures_that_stage_and_after_and_keeps_the_rest(tmp_path):
    """After a code change, `--from-stage` re-runs the later stages on each size's existing run:
    the corpus and the earlier stages' numbers stay as measured, the later ones are new."""
    import json
    import subprocess
    import sys

    from helpers.repo import REPO

    work = tmp_path / "work"
    # A corpus of its own: the shipped ones exist only after `make demo` (a clean clone has none).
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in sample_docs(600, seed=1)))
    # One size: what --from-stage keeps and redoes is per size (the growth between sizes has its own test above).
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_scale.py"),
        "--quick",
        "--sizes",
        "0.002",
        "--threads",
        "1",
        "--results-dir",
        str(tmp_path),
        "--work-dir",
        str(work),
    ]
    cmd += ["--corpus", str(corpus)]

    def measured(*extra: str) -> dict:
        proc = subprocess.run([*cmd, *extra], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((tmp_path / "scale.quick.json").read_text())["sizes"]

    first = measured()
    corpora = {label: (work / label / "corpus.jsonl").read_text() for label in first}
    again = measured("--from-stage", "label")
    assert set(again) == set(first)
    for label, size in first.items():
        assert (work / label / "corpus.jsonl").read_text() == corpora[label]
        before = bench.STAGES.index("label")
        for stage in ["count models", *bench.STAGES[:before]]:
            assert again[label]["stages"][stage] == size["stages"][stage]
        for stage in bench.STAGES[before:]:
            assert again[label]["stages"][stage]["seconds"] > 0
        assert again[label]["words"] == size["words"]
