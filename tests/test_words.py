from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.corpus.words import split_words, word_spans

# Text built from the hard cases: emoji, CJK, combining marks, tabs, CRLF, NBSP, and edges of whitespace.
PIECES = st.sampled_from(
    [
        "Hello",
        " world",
        "  ",
        "\t",
        "\r\n",
        "\n\n",
        "日本語",
        "🙂",
        "👩‍👩‍👧",
        "e\u0301",
        "\u0301",
        "café",
        "'s",
        "'ll",
        "12",
        " 3.5",
        "--",
        "!?",
        "\u00a0",
        " ",
        "x",
        "If you were",
        "\u200b",
        "\U0001f600\U0001f600",
    ]
)
TEXT = st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=40).map("".join))


@given(TEXT)
@settings(max_examples=400, deadline=None)
def test_words_tile_the_text(text):
    spans = word_spans(text)
    assert "".join(split_words(text)) == text
    if len(text):
        assert spans[0, 0] == 0 and spans[-1, 1] == len(text)
        assert (spans[1:, 0] == spans[:-1, 1]).all()
        assert (spans[:, 1] > spans[:, 0]).all()
    else:
        assert len(spans) == 0


def test_gpt2_style_segmentation():
    assert split_words("If you were there,  he'd\n\nsay 12!") == ["If", " you", " were", " there", ",", " ", " he", "'d", "\n\n", "say", " 12", "!"]


def test_combining_marks_stay_with_their_letters():
    assert split_words("cafe\u0301 ok") == ["cafe\u0301", " ok"]
