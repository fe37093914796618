"""Where latents fire, stored per latent as row ids, reads exactly as the dense rows × latents array."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.features.activations import firing


@given(st.integers(1, 60), st.integers(1, 9), st.integers(1, 25), st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_sparse_firing_reads_as_the_dense_array(n_rows, n_latents, chunk_rows, seed):
    rng = np.random.default_rng(seed)
    matrix = rng.normal(size=(n_rows, 6)).astype(np.float32)
    weights = torch.from_numpy(rng.normal(size=(6, 12)).astype(np.float32))

    def encode(x):
        return torch.relu(x @ weights - 0.5)  # sparse, some latents never fire

    latents = sorted(rng.choice(12, size=n_latents, replace=False).tolist())
    dense = (encode(torch.from_numpy(matrix))[:, latents] > 0).numpy()
    fires = firing(encode, matrix, latents, chunk_rows)
    assert fires.shape == dense.shape
    rows = np.sort(rng.choice(n_rows, size=rng.integers(0, n_rows + 1), replace=False))
    mask = rng.random(n_rows) < 0.5
    for j in range(n_latents):
        np.testing.assert_array_equal(fires[:, j], dense[:, j])
        np.testing.assert_array_equal(fires[rows, j], dense[rows, j])
    cols = [int(c) for c in rng.choice(n_latents, size=rng.integers(0, n_latents + 1), replace=False)]
    np.testing.assert_array_equal(fires[:, cols], dense[:, cols])
    np.testing.assert_array_equal(fires[:, cols].any(axis=1), dense[:, cols].any(axis=1))
    np.testing.assert_array_equal(fires[np.ix_(mask, cols)], dense[np.ix_(mask, cols)])
