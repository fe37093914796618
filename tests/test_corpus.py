import json

import pytest

from bbox_sae.config import CorpusConfig
from bbox_sae.corpus.documents import Document, chunk_document, load_documents, split_of
from bbox_sae.errors import CorpusError


def write(tmp_path, lines, name="c.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def load(path, **kw):
    return load_documents(CorpusConfig(path=str(path), **kw))


def test_jsonl_with_domain_and_integer_ids(tmp_path):
    p = write(tmp_path, [json.dumps({"id": 7, "text": "a b", "domain": "x"}), "", json.dumps({"id": "z", "text": "c"})])
    docs = load(p)
    assert [(d.id, d.text, d.domain) for d in docs] == [("7", "a b", "x"), ("z", "c", None)]


@pytest.mark.parametrize(
    "line, message",
    [
        (b"{not json", r"c.jsonl:2: malformed JSON"),
        (b"[1, 2]", r"c.jsonl:2: expected a JSON object, got list"),
        (json.dumps({"text": "x"}).encode(), r"c.jsonl:2: field 'id': missing"),
        (json.dumps({"id": "b"}).encode(), r"c.jsonl:2: field 'text': missing"),
        (json.dumps({"id": "b", "text": 3}).encode(), r"c.jsonl:2: field 'text': expected a string"),
        (json.dumps({"id": 1.5, "text": "x"}).encode(), r"c.jsonl:2: field 'id': expected a string or integer"),
        (b'{"id": "b", "text": "caf\xe9"}', r"c.jsonl:2: not valid UTF-8"),
        (json.dumps({"id": "b", "text": "a\u0000b"}).encode(), r"c.jsonl:2: field 'text': contains a NUL"),
        (b'{"id": "b", "text": "\\ud800"}', r"c.jsonl:2: field 'text': invalid unicode"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, line, message):
    p = write(tmp_path, [json.dumps({"id": "a", "text": "fine"}).encode(), line])
    with pytest.raises(CorpusError, match=message):
        load(p)


def test_duplicate_ids(tmp_path):
    same = write(tmp_path, [json.dumps({"id": "a", "text": "x"})] * 2, "same.jsonl")
    assert len(load(same)) == 1
    diff = write(tmp_path, [json.dumps({"id": "a", "text": "x"}), json.dumps({"id": "a", "text": "y"})], "diff.jsonl")
    with pytest.raises(CorpusError, match=r"diff.jsonl:2: field 'id': duplicate id 'a' with different text \(first at .*diff.jsonl:1\)"):
        load(diff)


def test_empty_documents_are_dropped_and_all_empty_is_an_error(tmp_path):
    p = write(tmp_path, [json.dumps({"id": "a", "text": ""}), json.dumps({"id": "b", "text": " \n"}), json.dumps({"id": "c", "text": "ok"})])
    assert [d.id for d in load(p)] == ["c"]
    q = write(tmp_path, [json.dumps({"id": "a", "text": "  "})], "empty.jsonl")
    with pytest.raises(CorpusError, match="no non-empty documents"):
        load(q)


def test_bom_is_accepted(tmp_path):
    p = write(tmp_path, [b"\xef\xbb\xbf" + json.dumps({"id": "a", "text": "x"}).encode()])
    assert load(p)[0].text == "x"


def test_txt_folder_and_limits(tmp_path):
    (tmp_path / "d").mkdir()
    for i in range(5):
        (tmp_path / "d" / f"f{i}.txt").write_text(f"doc number {i} has words")
    docs = load(tmp_path / "d", max_docs=3)
    assert [d.id for d in docs] == ["f0", "f1", "f2"]
    assert len(load(tmp_path / "d", max_words=10)) == 2  # 9 words per doc: stops once 10 are reached


def test_chunks_concatenate_back_to_the_document():
    text = "".join(f"line {i} has a few words here\n" for i in range(50))
    pieces = chunk_document(Document("x", text), 40)
    assert "".join(p.text for p in pieces) == text
    assert len(pieces) > 3 and pieces[1].id == "x#1"


def test_split_is_deterministic_and_near_the_fraction():
    splits = [split_of(str(i), 0.2, seed=0) for i in range(2000)]
    assert splits == [split_of(str(i), 0.2, seed=0) for i in range(2000)]
    assert 0.17 < splits.count("holdout") / 2000 < 0.23


def test_missing_corpus(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        load(tmp_path / "nope.jsonl")
