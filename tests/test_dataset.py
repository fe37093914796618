import numpy as np
import pyarrow as pa
import pytest

from bbox_sae.artifacts import ShardedTable, atomic_write_table
from bbox_sae.build.matrix import open_matrix, part_scales, performance_columns, run_build
from bbox_sae.corpus.documents import Document, documents_table, shard_ranges, words_table
from bbox_sae.embedding.stage import embeddings_table
from bbox_sae.layout import logprob_column
from helpers.project import make_project


def make_run(tmp_path, n_docs=12, dim=8, weight=0.7, mode="probs", chunk_rows=7, nan_doc=None, dtype="float32"):
    rng = np.random.default_rng(0)
    # The scored words of a run, written here as ingest, score and embed would write them.
    cfg = make_project(
        tmp_path,
        docs=None,
        models=("a", "b", "c"),
        corpus={"shard_docs": 5},
        build={"output_feature_weight": weight, "performance": mode, "chunk_rows": chunk_rows, "dtype": dtype},
    ).load()
    docs = [Document(f"d{i}", " ".join(f"w{j}" for j in range(rng.integers(1, 9)))) for i in range(n_docs)]
    documents = documents_table(docs, 0.3, 0, 5)
    atomic_write_table(cfg.paths.documents, documents)
    for k, (s, e) in enumerate(shard_ranges(len(docs), 5)):
        part = documents.slice(s, e - s)
        words = words_table(part)
        ShardedTable(cfg.paths.words).write(k, words)
        vecs = [rng.normal(size=(int(np.sum(np.array(words["doc_id"].to_pylist()) == d)), dim)).astype(np.float32) for d in part["doc_id"].to_pylist()]
        ShardedTable(cfg.paths.embeddings).write(k, embeddings_table(part["doc_id"].to_pylist(), vecs, "float32"))
        for m in ("a", "b", "c"):
            lp = -rng.exponential(2.0, size=words.num_rows)
            if nan_doc is not None and m == "b":
                lp[np.array(words["doc_id"].to_pylist()) == nan_doc] = np.nan
            ShardedTable(cfg.paths.logprobs(m)).write(
                k, pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": pa.array(lp, pa.float64(), from_pandas=True)})
            )
    return cfg


@pytest.mark.parametrize("weight,mode", [(0.0, "probs"), (0.3, "probs"), (0.7, "probs"), (1.0, "probs"), (0.7, "delta_context")])
def test_scaled_parts_have_the_required_mean_norms(tmp_path, weight, mode):
    cfg = make_run(tmp_path, weight=weight, mode=mode)
    info = run_build(cfg)
    matrix, index, _ = open_matrix(cfg)
    d = info["d_embedding"]
    emb, perf = np.asarray(matrix[:, :d], np.float64), np.asarray(matrix[:, d:], np.float64)
    m = info["mean_norm_joint"]
    assert np.isclose(np.linalg.norm(emb, axis=1).mean(), (1 - weight) * m, rtol=1e-3, atol=1e-9)
    assert np.isclose(np.linalg.norm(perf, axis=1).mean(), weight * m, rtol=1e-3, atol=1e-9)
    assert matrix.shape == (index.num_rows, d + (3 * len(cfg.build.prob_powers) if mode == "probs" else 3 * d))
    assert info["performance_columns"][:3] == ["p__a", "p__b", "p__c"] or mode != "probs"


def test_performance_columns_match_each_mode():
    lp = np.log(np.array([[0.5, 0.25, 0.125]]))
    np.testing.assert_allclose(performance_columns(lp, "probs"), [[0.5, 0.25, 0.125]])
    np.testing.assert_allclose(performance_columns(lp, "probs", prob_powers=[1, 0.25]), [[0.5, 0.25, 0.125, 0.5**0.25, 0.25**0.25, 0.125**0.25]])
    # A 2.5-nat difference on a word neither model finds likely: invisible in p, visible in p**0.25.
    rare = np.log([[5e-5, 5e-5 * np.exp(-2.5)]])
    assert np.ptp(performance_columns(rare, "probs")) < 1e-4 < 0.03 < np.ptp(performance_columns(rare, "probs", prob_powers=[0.25]))
    np.testing.assert_allclose(performance_columns(lp, "logprobs"), lp)
    np.testing.assert_allclose(performance_columns(lp, "delta"), lp - lp.mean())
    np.testing.assert_allclose(performance_columns(lp[:, :2], "delta"), [[np.log(2)]])
    emb = np.array([[3.0, 4.0]])
    np.testing.assert_allclose(performance_columns(lp[:, :2], "delta_context", emb), [[0.6 * np.log(2), 0.8 * np.log(2)]])
    # Unrelated contexts where the same model wins point different ways: no shared "A wins" direction.
    two = performance_columns(np.log([[0.5, 0.25], [0.5, 0.25]]), "delta_context", np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert two[0] @ two[1] == 0
    assert part_scales(2.0, 0.0, 3.0, 0.7) == (pytest.approx(0.45), 0.0)


def test_rows_with_a_missing_score_are_dropped_and_counted(tmp_path):
    cfg = make_run(tmp_path, nan_doc="d3")
    info = run_build(cfg)
    _, index, _ = open_matrix(cfg)
    assert "d3" not in set(index["doc_id"].to_pylist())
    assert info["dropped_missing_logprob"] == info["missing_logprob_by_model"]["b"] > 0
    assert info["rows"] + info["dropped_missing_logprob"] == info["rows_in"]


def test_builder_streams_in_bounded_chunks(tmp_path):
    cfg = make_run(tmp_path, n_docs=40, chunk_rows=7)
    info = run_build(cfg)
    assert info["rows_in"] > 5 * 7
    assert info["max_chunk_rows"] <= 7  # never more than one chunk of rows in memory


def test_index_rows_line_up_with_the_logprobs(tmp_path):
    cfg = make_run(tmp_path, mode="logprobs", weight=1.0)
    info = run_build(cfg)
    matrix, index, _ = open_matrix(cfg)
    d = info["d_embedding"]
    lp = np.stack([index[logprob_column(m)].to_numpy() for m in ("a", "b", "c")], axis=1)
    np.testing.assert_allclose(np.asarray(matrix[:, d:]) / info["scale_performance"], lp, rtol=1e-5)


@pytest.mark.parametrize("mode", ["probs", "logprobs"])
def test_a_float16_matrix_is_the_float32_one_rounded_at_half_the_size(tmp_path, mode):
    full_cfg = make_run(tmp_path / "full", mode=mode, n_docs=30)
    half_cfg = make_run(tmp_path / "half", mode=mode, n_docs=30, dtype="float16")
    full_info, half_info = run_build(full_cfg), run_build(half_cfg)
    full, full_index, _ = open_matrix(full_cfg)
    half, half_index, _ = open_matrix(half_cfg)
    assert (full.dtype, half.dtype) == (np.float32, np.float16)
    assert (full_info["dtype"], half_info["dtype"]) == ("float32", "float16")
    assert full_index.equals(half_index)
    # float16 keeps 11 significant bits: each value within half a unit in the last place.
    np.testing.assert_allclose(np.asarray(half, np.float32), full, rtol=2**-11, atol=2**-24)
    data_bytes = {name: m.size * m.itemsize for name, m in (("full", full), ("half", half))}
    assert data_bytes["half"] * 2 == data_bytes["full"]
