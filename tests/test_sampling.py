"""Δ-weighted SAE training rows (`sae.sample_weighting: delta`)."""

import numpy as np
import pyarrow as pa

from bbox_sae.config import config_from_dict
from bbox_sae.train.sae import RowBatches, sample_weights


def test_weighted_batches_draw_rows_in_proportion_and_replay_the_same():
    matrix = np.arange(1000, dtype=np.float32).reshape(-1, 1)
    rows = np.arange(1000)
    weights = np.where(rows < 100, 9.0, 1.0)  # the first 10% of rows carry half the weight
    batches = RowBatches(matrix, rows, batch_size=100, seed=3, weights=weights)
    drawn = np.concatenate([next(batches).numpy()[:, 0] for _ in range(200)])
    assert abs((drawn < 100).mean() - 0.5) < 0.03
    again = RowBatches(matrix, rows, batch_size=100, seed=3, weights=weights, skip_batches=5)
    replay = RowBatches(matrix, rows, batch_size=100, seed=3, weights=weights)
    for _ in range(5):
        next(replay)
    assert np.array_equal(next(again).numpy(), next(replay).numpy())  # a resumed run sees the same batches


def test_sample_weights_follow_the_gap_with_the_median_as_floor():
    cfg = config_from_dict(
        {
            "corpus": {"path": "x.jsonl"},
            "models": [{"name": "A", "source": "parquet", "path": "a"}, {"name": "B", "source": "parquet", "path": "b"}],
            "sae": {"sample_weighting": "delta"},
        }
    )
    index = pa.table({"logprob__A": [-1.0, -1.0, -1.0, -5.0], "logprob__B": [-1.1, -1.2, -0.9, -1.0]})
    w = sample_weights(cfg, index, np.array([True, True, True, True]))
    assert np.allclose(w, [0.15, 0.2, 0.15, 4.0])  # floor = median |Δ| = 0.15
    assert sample_weights(cfg.model_copy(update={"sae": cfg.sae.model_copy(update={"sample_weighting": "none"})}), index, np.ones(4, bool)) is None
