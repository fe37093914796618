import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.config import EmbeddingConfig
from bbox_sae.corpus.words import word_spans
from bbox_sae.embedding.stage import load_embedder, plan_encoder_windows, pool_words, window_owner
from bbox_sae.scoring.align import token_word_ranges


@pytest.fixture(scope="module")
def embedder(tiny_encoder):
    return load_embedder(EmbeddingConfig(model=str(tiny_encoder), window=16, stride=8, batch_size=4, device="cpu"))


@pytest.fixture(scope="module")
def big_window_embedder(tiny_encoder):
    return load_embedder(EmbeddingConfig(model=str(tiny_encoder), window=500, stride=250, batch_size=4, device="cpu"))


TEXTS = ["If you were there,\n\nhe would  say so.", "Hello\tworld 12 日本語 café 🙂", "   leading space and trailing   ", "x"]


def test_every_word_gets_exactly_one_vector(embedder):
    for text, vecs in zip(TEXTS, embedder.embed(TEXTS)):
        assert vecs.shape == (len(word_spans(text)), embedder.dim)
        assert np.isfinite(vecs).all()


def test_word_vector_is_the_mean_of_its_tokens(big_window_embedder):
    e = big_window_embedder
    text = "Unbelievably, the tokenizer splits words into pieces."
    enc = e.tokenizer(text, return_offsets_mapping=True)
    with torch.inference_mode():
        hidden = e.model(input_ids=torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states[-1][0]
    offsets = np.array(enc["offset_mapping"])[1:-1]  # drop [CLS] / [SEP]
    tokens = hidden[1:-1].numpy()
    spans = word_spans(text)
    first, last = token_word_ranges(offsets, spans)
    got = e.embed([text])[0]
    for w in range(len(spans)):
        mine = [t for t in range(len(tokens)) if first[t] <= w <= last[t]]
        if mine:
            np.testing.assert_allclose(got[w], tokens[mine].mean(0), atol=1e-5)


def test_windows_stitch_to_the_single_window_result(embedder, big_window_embedder):
    short = "A short text that fits."
    np.testing.assert_allclose(embedder.embed([short])[0], big_window_embedder.embed([short])[0], atol=1e-5)
    long = " ".join(f"word{i}" for i in range(60))
    stitched = embedder.embed([long])[0]
    assert stitched.shape[0] == len(word_spans(long))


def test_whitespace_words_take_the_token_to_their_left(big_window_embedder):
    text = "one   two\n\nthree"
    spans = word_spans(text)
    vecs = big_window_embedder.embed([text])[0]
    words = [text[s:e] for s, e in spans]
    assert words == ["one", "  ", " two", "\n\n", "three"]
    np.testing.assert_allclose(vecs[1], vecs[0])  # a space run has no BERT token: takes "one"'s vector
    assert not np.allclose(vecs[3], vecs[2])  # a line break has its own '¶' tokens


def test_leading_whitespace_takes_the_first_token():
    vecs = np.arange(6, dtype=np.float32).reshape(3, 2)
    offsets = np.array([[2, 5], [6, 8], [8, 9]])
    spans = np.array([[0, 2], [2, 5], [5, 6], [6, 9]])
    out = pool_words(vecs, offsets, spans)
    np.testing.assert_allclose(out[0], vecs[0])
    np.testing.assert_allclose(out[2], vecs[0])
    np.testing.assert_allclose(out[3], vecs[1:].mean(0))


@given(n=st.integers(1, 400), window=st.integers(2, 64), stride=st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_encoder_windows_cover_every_token_and_prefer_the_centre(n, window, stride):
    stride = min(stride, window)
    windows = plan_encoder_windows(n, window, stride)
    owner = window_owner(n, windows)
    covered = np.zeros(n, bool)
    for b, e in windows:
        assert e - b <= window
        covered[b:e] = True
    assert covered.all()
    for t in range(n):
        b, e = windows[owner[t]]
        assert b <= t < e
        margin = min(t - b, e - 1 - t)
        assert all(margin >= min(t - bb, ee - 1 - t) for bb, ee in windows if bb <= t < ee)


def test_the_encoder_sees_line_breaks_its_tokenizer_would_drop(tiny_encoder):
    """WordPiece reads '\\n' as a space; with the '¶' marker the word after a blank line is embedded
    in a different context than the same word after spaces, and nothing else moves."""
    marked = load_embedder(EmbeddingConfig(model=str(tiny_encoder), window=64, stride=32, device="cpu"))
    plain = load_embedder(EmbeddingConfig(model=str(tiny_encoder), window=64, stride=32, device="cpu", mark_line_breaks=False))
    blank, spaced = "ROMEO. Good night.\n\nJULIET. Farewell.", "ROMEO. Good night.  JULIET. Farewell."
    assert word_spans(blank).shape == word_spans(spaced).shape
    juliet = [i for i, (s, e) in enumerate(word_spans(blank)) if blank[s:e] == "JULIET"][0]
    p_blank, p_spaced = plain.embed([blank, spaced])
    assert np.allclose(p_blank[juliet], p_spaced[juliet], atol=1e-5)
    m_blank, m_spaced = marked.embed([blank, spaced])
    assert not np.allclose(m_blank[juliet], m_spaced[juliet], atol=1e-3)
    assert np.allclose(m_spaced, p_spaced, atol=1e-5)  # text without line breaks is unchanged
