"""The real packaged models, as `make setup` converted them into the demo's model cache (slow)."""

import numpy as np
import pytest
import torch

from bbox_sae.corpus.words import word_spans
from bbox_sae.models import load_causal_lm
from bbox_sae.scoring.align import align_logprobs
from bbox_sae.scoring.hf import HFScorer
from helpers.assets import DEMO_MODELS, demo_model, real_model_dir

pytestmark = pytest.mark.slow

PARAGRAPH = (
    "The history of the city begins with a small settlement on the river. Over the following centuries, "
    "merchants built warehouses along the water, and the town grew into a busy port. Today it is known "
    "for its old bridges, its markets and its university, which was founded in the fifteenth century."
)


@pytest.mark.parametrize("name", sorted(DEMO_MODELS))
def test_real_model_nll_is_sane_and_conserved(name):
    model, tok = load_causal_lm(str(real_model_dir(name)), torch.device("cpu"), torch.float32)
    scores = next(HFScorer(name, model, tok, start_token=demo_model(name).start_token, window=512, stride=256).score([("p", PARAGRAPH)]))
    nll = -scores.logprobs.mean()
    assert 1.5 < nll < 4.5, f"{name}: mean NLL/token {nll:.2f} is not what a trained LM gives on plain English"
    assert nll < np.log(len(tok)) / 2  # far better than a uniform guess (ln |V|)
    words = align_logprobs(scores.offsets, scores.logprobs, word_spans(PARAGRAPH))
    assert np.isclose(words.sum(), scores.logprobs.sum())
