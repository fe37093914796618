import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.scoring.align import align_logprobs


@st.composite
def words_and_tokens(draw):
    lengths = draw(st.lists(st.integers(1, 5), min_size=1, max_size=15))
    ends = np.cumsum(lengths)
    spans = np.stack([ends - np.array(lengths), ends], axis=1)
    n_chars = int(ends[-1])
    n_tok = draw(st.integers(0, 20))
    starts = sorted(draw(st.lists(st.integers(0, n_chars), min_size=n_tok, max_size=n_tok)))
    offsets = np.array([[s, min(n_chars, s + draw(st.integers(0, 6)))] for s in starts], dtype=np.int64).reshape(-1, 2)
    lps = np.array(draw(st.lists(st.floats(-20, 0), min_size=n_tok, max_size=n_tok)))
    return spans, offsets, lps


@given(words_and_tokens())
@settings(max_examples=300, deadline=None)
def test_sum_is_conserved_for_any_offsets(case):
    spans, offsets, lps = case
    words = align_logprobs(offsets, lps, spans)
    assert np.isclose(words.sum(), lps.sum(), atol=1e-9)


def test_token_spanning_two_words_splits_evenly():
    spans = np.array([[0, 3], [3, 6]])
    out = align_logprobs(np.array([[1, 5]]), np.array([-4.0]), spans)
    assert out.tolist() == [-2.0, -2.0]


def test_repeated_byte_level_offsets_all_land_in_their_word():
    # SmolLM2 gives the two byte pieces of one CJK character the same span.
    spans = np.array([[0, 2], [2, 3]])
    offsets = np.array([[0, 2], [2, 3], [2, 3]])
    out = align_logprobs(offsets, np.array([-1.0, -2.0, -3.0]), spans)
    assert out.tolist() == [-1.0, -5.0]


def test_empty_span_goes_to_the_word_containing_it():
    spans = np.array([[0, 2], [2, 4]])
    out = align_logprobs(np.array([[2, 2], [4, 4]]), np.array([-1.0, -2.0]), spans)
    assert out.tolist() == [0.0, -3.0]
