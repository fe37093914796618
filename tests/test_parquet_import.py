"""A `source: parquet` model's log-probs, in any row order and with words missing, are re-sharded
like the corpus: shard k holds shard k's documents in document order, each word once, in order,
with the user's value (null where the user gave none)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.corpus.ingest import ingest
from bbox_sae.errors import ArtifactError
from helpers.project import make_project, sample_docs
from helpers.stages import score


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shuffled_user_rows_are_resharded_in_document_order(tmp_path, seed):
    project = make_project(tmp_path, sample_docs(9, seed=seed))
    cfg = project.load()
    ingest(cfg)
    words = read_table(cfg.paths.words, columns=["doc_id", "word_idx"])
    rng = np.random.default_rng(seed)
    values = -rng.random(words.num_rows) * 5
    given = rng.random(words.num_rows) > 0.1  # about one word in ten has no log-prob
    user = pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": values}).filter(pa.array(given))
    pq.write_table(user.take(pa.array(rng.permutation(user.num_rows))), project.logprob_file("a"))
    cfg = project.load()
    score(cfg, models=["a"])

    table = ShardedTable(cfg.paths.logprobs("a"))
    documents = read_table(cfg.paths.documents, columns=["doc_id"])["doc_id"].to_pylist()
    assert table.indices() == list(range(5))  # 9 documents, 2 a shard
    for k in table.indices():
        shard = read_table(table.shard_path(k)).to_pydict()
        expected = words.filter(pa.array(np.isin(words["doc_id"].to_numpy(zero_copy_only=False), documents[2 * k : 2 * k + 2]))).to_pydict()
        assert shard["doc_id"] == expected["doc_id"] and shard["word_idx"] == expected["word_idx"]
    imported = read_table(cfg.paths.logprobs("a"))
    assert imported.select(["doc_id", "word_idx"]).to_pydict() == words.to_pydict()
    got = np.array([np.nan if v is None else v for v in imported["logprob"].to_pylist()])
    np.testing.assert_array_equal(got, np.where(given, values, np.nan))


def test_a_word_given_twice_is_refused_naming_the_file(tmp_path):
    project = make_project(tmp_path, sample_docs(3, seed=0))
    cfg = project.load()
    ingest(cfg)
    user = read_table(project.logprob_file("a"))
    pq.write_table(pa.concat_tables([user, user.slice(4, 1)]), project.logprob_file("a"))
    with pytest.raises(ArtifactError, match="duplicate \\(doc_id, word_idx\\) rows") as err:
        score(project.load(), models=["a"])
    assert str(project.logprob_file("a")) in str(err.value)
