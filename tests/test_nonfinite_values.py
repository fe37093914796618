"""Numerical faults: NaN/inf log-probs and embeddings are caught by the stage
that produced them, reported with the document id, stored as nulls / non-finite rows, and the
build drops those words for every model alike. A NaN SAE loss stops training with a clear
message and keeps the last good checkpoint: tests/test_sae.py::test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_checkpoint.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from bbox_sae.artifacts import read_table
from bbox_sae.corpus.ingest import ingest
from bbox_sae.errors import ArtifactError
from bbox_sae.layout import logprob_column
from helpers.project import make_project, tiny_model
from helpers.stages import score

DOCS = {
    "clean0": "The ships were late, and the men were tired.",
    "hfbad": "A storm over Zanzibar kept the harbour shut for days.",
    "clean1": "Three hundred and 12 crowns, said the steward.",
    "extbad": "O Romeo, Romeo! wherefore art thou Romeo?",
    "embbad": "Quixotic plans, said the mayor, never work.",
    "clean2": "If you were here, the day would be bright.",
}


@pytest.fixture()
def project(tmp_path):
    # "ext" is a user's log-prob file each test writes itself, with the faults it plants.
    return make_project(tmp_path, docs=DOCS, models=[tiny_model("smol", window=16, stride=8), "ext"], corpus={"holdout_fraction": 0.0}).load()


def _poison_rows(hidden: torch.Tensor, input_ids: torch.Tensor, token: int) -> torch.Tensor:
    rows = (input_ids == token).any(dim=1)
    hidden = hidden.clone()
    hidden[rows] = float("nan")
    return hidden


def test_nan_logprobs_and_embeddings_are_reported_and_excluded_for_every_model(project, monkeypatch, caplog):
    from bbox_sae.build.matrix import run_build
    from bbox_sae.embedding.stage import WordEmbedder, run_embed
    from bbox_sae.scoring import stage

    cfg = project
    documents = ingest(cfg)
    words = read_table(cfg.paths.words)
    # The external model's table: NaN for one word and -inf for another of "extbad", finite elsewhere.
    lp = -np.linspace(0.5, 9.0, words.num_rows)
    ids = np.array(words["doc_id"].to_pylist())
    bad_rows = np.flatnonzero(ids == "extbad")[:2]
    lp[bad_rows[0]], lp[bad_rows[1]] = np.nan, -np.inf
    pq.write_table(pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp}), cfg.model("ext").path)

    # The HF model returns NaN hidden states for any window holding " Zanzibar" (document "hfbad").
    real_make = stage.make_scorer

    def make_poisoned(model_cfg, cfg_):
        scorer = real_make(model_cfg, cfg_)
        token = scorer.tokenizer(" Zanzibar", add_special_tokens=False)["input_ids"][0]
        body = scorer._body

        class Poisoned(torch.nn.Module):
            def forward(self, input_ids, attention_mask=None):
                out = body(input_ids=input_ids, attention_mask=attention_mask)
                out.last_hidden_state = _poison_rows(out.last_hidden_state, input_ids, token)
                return out

        scorer._body = Poisoned()
        return scorer

    monkeypatch.setattr(stage, "make_scorer", make_poisoned)
    with caplog.at_level(logging.WARNING):
        score(cfg)
    messages = [r.getMessage() for r in caplog.records]
    assert any("model 'smol'" in m and "'hfbad'" in m for m in messages), messages
    assert any("model 'ext'" in m and "2 non-finite" in m and "extbad" in m for m in messages), messages

    smol, ext = read_table(cfg.paths.logprobs("smol")), read_table(cfg.paths.logprobs("ext"))
    n_hf = int(np.sum(ids == "hfbad"))
    assert smol.filter(pc.equal(smol["doc_id"], "hfbad"))["logprob"].null_count == n_hf  # the whole document
    assert smol["logprob"].null_count == n_hf
    assert ext["logprob"].null_count == 2  # only the two faulty words
    assert np.isfinite(smol["logprob"].drop_null().to_numpy()).all() and np.isfinite(ext["logprob"].drop_null().to_numpy()).all()

    # The encoder gives NaN for document "embbad".
    real_forward = WordEmbedder._forward

    def nan_forward(self, batch):
        token = self.tokenizer(" quixotic", add_special_tokens=False)["input_ids"][0]
        out = real_forward(self, batch)
        return [h.clone().fill_(float("nan")) if token in seq else h for h, seq in zip(out, batch)]

    monkeypatch.setattr(WordEmbedder, "_forward", nan_forward)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run_embed(cfg)
    assert any("NaN/inf vectors" in r.getMessage() and "embbad" in r.getMessage() for r in caplog.records)

    info = run_build(cfg)
    n_emb = int(np.sum(ids == "embbad"))
    assert info["rows_in"] == words.num_rows
    assert info["missing_logprob_by_model"] == {"smol": n_hf, "ext": 2}
    assert info["dropped_nonfinite_embedding"] == n_emb
    assert info["rows"] == words.num_rows - n_hf - 2 - n_emb
    index = read_table(cfg.paths.index)
    kept = set(zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist()))
    # Excluded consistently: a dropped word is gone from the one matrix all models share.
    assert not any(d in ("hfbad", "embbad") for d, _ in kept)
    assert {(ids[r], words["word_idx"][int(r)].as_py()) for r in bad_rows}.isdisjoint(kept)
    assert sum(d == "extbad" for d, _ in kept) == int(np.sum(ids == "extbad")) - 2
    matrix = np.load(cfg.paths.matrix)
    assert np.isfinite(matrix).all() and matrix.shape[0] == info["rows"]
    for m in ("smol", "ext"):
        assert np.isfinite(index[logprob_column(m)].to_numpy()).all()
    assert len(documents) == len(DOCS)


def test_positive_logprobs_from_a_parquet_model_are_refused(project):
    from bbox_sae.scoring import stage

    cfg = project
    ingest(cfg)
    words = read_table(cfg.paths.words)
    lp = np.full(words.num_rows, -1.0)
    lp[3] = 2.5  # a negative log-likelihood slipped in
    pq.write_table(pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp}), cfg.model("ext").path)
    with pytest.raises(ArtifactError, match=r"ext.parquet: log-prob 2.5 > 0 for document 'clean0' word 3"):
        stage.score_model(cfg, cfg.model("ext"), read_table(cfg.paths.documents))


def test_nan_sae_loss_is_covered_in_test_sae():
    import test_sae

    assert hasattr(test_sae, "test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_checkpoint")
