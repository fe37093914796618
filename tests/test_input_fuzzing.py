"""Hostile input: corpus ingest and config loading under fuzzing.

Every input either ingests correctly (each document's words tile its text) or fails with a
one-line CorpusError / ConfigError naming the file, the line (where there is one) and the
field at fault; never another exception type. Through the CLI a failed ingest exits 2 with
one line on stderr and leaves no documents.parquet / ingest.json claiming success.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bbox_sae.config import Config, CorpusConfig, load_config
from bbox_sae.corpus.documents import load_documents
from bbox_sae.corpus.words import split_words
from bbox_sae.errors import BBoxError, ConfigError, CorpusError, printable
from helpers.cli import bbox_process
from helpers.project import make_project

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
BIG_INT = "9" * 5000  # past Python's int-parsing limit (4300 digits): json/yaml raise ValueError

# ---------------------------------------------------------------- corpus: an oracle for JSONL


def expected_outcome(lines: list[bytes]) -> tuple[str, object]:
    """What ingest must do with these JSONL lines: ("ok", [(id, text), ...]) or ("error", line number).

    Written independently of bbox_sae.corpus.documents from the documented rules: UTF-8 (a BOM allowed on
    line 1), blank lines skipped, one JSON object per line, `id` a non-empty string or integer
    (not bool/float), `text` a string, optional `domain` a string or null, no NUL / lone
    surrogates, duplicate ids must repeat the same text, empty/whitespace documents dropped.
    """
    seen: dict[str, str] = {}
    docs = []
    for n, raw in enumerate(lines, start=1):
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            return "error", n
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return "error", n
        if not isinstance(obj, dict) or "id" not in obj or "text" not in obj:
            return "error", n

        def bad_string(s):
            if not isinstance(s, str) or "\x00" in s:
                return True
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                return True
            return False

        doc_id, text, domain = obj["id"], obj["text"], obj.get("domain")
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "" or bad_string(str(doc_id)):
            return "error", n
        if bad_string(text) or (domain is not None and bad_string(domain)):
            return "error", n
        doc_id = str(doc_id)
        if doc_id in seen:
            if seen[doc_id] != text:
                return "error", n
            continue
        seen[doc_id] = text
        if text.strip():
            docs.append((doc_id, text))
    if not docs:
        return "error", None
    return "ok", docs


def check_ingest(path: Path, **corpus) -> list:
    """Ingest `path`; assert the outcome is one of the two allowed ones. Returns the documents or []."""
    try:
        docs = load_documents(CorpusConfig(path=str(path), **corpus))
    except CorpusError as err:
        message = str(err)
        assert "\n" not in message and "\r" not in message, message
        assert message.startswith(str(path)), message
        return []
    # Any other exception propagates and fails the test.
    for d in docs:
        assert isinstance(d.id, str) and d.id
        assert d.text.strip()
        assert "".join(split_words(d.text)) == d.text
    assert len({d.id for d in docs}) == len(docs)
    return docs


WEIRD_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\n\t  \r\n",
        "\u3000\u2028",
        "🙂",
        "🙂🙂👩\u200d👩\u200d👧",
        "word",
        "a",
        "e\u0301",
        "日本語",
        "\ufeffhi",
        "x\u0000y",
        "\ud800x",
        "caf\u00e9 ok",
        "\u200b",
    ]
)
TEXTS = st.one_of(
    st.text(max_size=40), WEIRD_TEXT, st.text(alphabet=" \t\n\r\u00a0\u2003", max_size=10), st.text(alphabet="🙂😀🎉👍🏽", min_size=1, max_size=8)
)
IDS = st.one_of(
    st.text(max_size=6),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(["a", "a\nb", "1", "x\u0000"]),
)
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3))


@st.composite
def object_line(draw) -> bytes:
    obj = {}
    if draw(st.integers(0, 9)) > 0:
        obj["id"] = draw(IDS)
    if draw(st.integers(0, 9)) > 0:
        obj["text"] = draw(st.one_of(TEXTS, JSON_VALUES))
    if draw(st.booleans()):
        obj["domain"] = draw(st.one_of(st.none(), st.text(max_size=5), st.integers(), WEIRD_TEXT))
    obj.update(draw(st.dictionaries(st.text(max_size=5).filter(lambda k: k not in ("id", "text", "domain")), JSON_VALUES, max_size=2)))
    keys = list(obj)
    draw(st.randoms()).shuffle(keys)
    return json.dumps({k: obj[k] for k in keys}, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


RAW_LINES = st.sampled_from(
    [
        b"",
        b"   ",
        b"\xef\xbb\xbf" + b'{"id": "bom", "text": "after a BOM"}',
        b'{"id": "nul", "text": "raw \x00 byte"}',
        b"\x00\x00",
        b'{"id": "bad", "text": "caf\xe9"}',
        b"\xff\xfe\xfd",
        b"[1, 2, 3]",
        b'"just a string"',
        b"42",
        b"null",
        b"{not json",
        b'{"id": ' + BIG_INT.encode() + b', "text": "huge id"}',
        b'{"id": "deep", "text": ' + b"[" * 100_000 + b"}",
        b'{"id": NaN, "text": "nan id"}',
        b'{"id": "sur", "text": "\\udc80"}',
        b'{"id": 7, "text": "integer id"}',
        b'{"id": "dup", "text": "same"}',
        b'{"id": "dup", "text": "other"}',
    ]
)
LINE = st.one_of(object_line(), RAW_LINES, st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")))


@given(lines=st.lists(LINE, min_size=1, max_size=8))
@example(lines=[b'{"id": "one", "text": "word"}'])
@example(lines=[b'{"id": 1, "text": "\xf0\x9f\x99\x82\xf0\x9f\x99\x82"}', b'{"id": 2, "text": " \\t\\n "}'])
@example(lines=[b'{"id": ' + BIG_INT.encode() + b', "text": "x"}'])
@example(lines=[b'{"id": "a\\nb", "text": "x"}', b'{"id": "a\\nb", "text": "y"}'])
@example(lines=[b"(\xb5/\xfd"])  # zstd's magic and no frame: was "no non-empty documents"
@FUZZ
def test_jsonl_fuzz_ingests_or_fails_with_file_and_line(tmp_path, lines):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    kind, detail = expected_outcome(lines)
    if kind == "ok":
        docs = check_ingest(path)
        assert [(d.id, d.text) for d in docs] == detail
        return
    with pytest.raises(CorpusError) as info:
        load_documents(CorpusConfig(path=str(path)))
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    if detail is None:
        assert message == f"{path}: corpus holds no non-empty documents"
    else:
        assert message.startswith(f"{path}:{detail}: "), (message, detail)
        check_ingest(path)  # the shared invariants hold too


@given(data=st.binary(max_size=300))
@example(data=b"\xef\xbb\xbfplain text after a BOM\n")
@example(data=b"line one\nline two has a NUL \x00 here\n")
@example(data=b"ok\n\xc3\x28 invalid\n")
@example(data="🙂🙂🙂".encode())
@example(data=b" \n\t ")
@FUZZ
def test_random_bytes_as_txt_and_jsonl_never_crash(tmp_path, data):
    txt = tmp_path / "doc.txt"
    txt.write_bytes(data)
    docs = check_ingest(txt)
    if docs:
        assert [d.id for d in docs] == ["doc"] and docs[0].text == data.decode("utf-8").removeprefix("\ufeff")
    jsonl = tmp_path / "doc.jsonl"
    jsonl.write_bytes(data)
    kind, detail = expected_outcome(data.split(b"\n"))
    docs = check_ingest(jsonl)
    assert (kind == "ok") == bool(docs)


def test_txt_errors_name_the_line(tmp_path):
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"first\nsecond\nthird \x00 line\n")
    with pytest.raises(CorpusError, match=re.escape(f"{nul}:3: ") + "contains a NUL"):
        load_documents(CorpusConfig(path=str(nul)))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"first\n\xff second\n")
    with pytest.raises(CorpusError, match=re.escape(f"{bad}:2: ") + "not valid UTF-8"):
        load_documents(CorpusConfig(path=str(bad)))


def test_one_megabyte_line_one_word_and_odd_documents(tmp_path):
    line = "lorem ipsum dolor, sit amet 🙂\n"
    big = line * (1_000_000 // len(line) + 1)
    rows = [
        {"id": "big", "text": big},
        {"id": 1, "text": "word"},
        {"id": 2, "text": "🙂🙂👍🏽"},
        {"id": 3, "text": " \t\n\u3000"},
        {"id": "4", "text": "\ufeffBOM inside"},
    ]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode())
    docs = check_ingest(path)
    assert [d.id for d in docs] == ["big", "1", "2", "4"]  # whitespace-only "3" is dropped
    assert len(docs[0].text) >= 1_000_000 and split_words(docs[1].text) == ["word"]


def test_id_with_a_line_break_still_gives_a_one_line_error(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "a\nb", "text": "x"}) + "\n" + json.dumps({"id": "a\nb", "text": "y"}) + "\n")
    with pytest.raises(CorpusError) as info:
        load_documents(CorpusConfig(path=str(path)))
    assert "\n" not in str(info.value) and f"{path}:2: field 'id': duplicate id" in str(info.value)


# ---------------------------------------------------------------- config

VALID = {
    "output_dir": "out",
    "corpus": {"path": "c.jsonl", "shard_docs": 4},
    "models": [{"name": "a", "source": "parquet", "path": "a.parquet"}, {"name": "b", "source": "hf", "path": "x", "window": 32, "stride": 16}],
    "sae": {"d_sae": 32, "k": 4},
}
YAML_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.sampled_from(["", "\x00", "a\nb", "-1", "1e9", "[", BIG_INT])
)
YAML_VALUES = st.recursive(
    YAML_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8
)


def paths_of(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths_of(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths_of(v, (*prefix, i))


def check_config(path: Path, field: str | None = None) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message and "\r" not in message, message
        assert message.startswith(str(path)), message
        if field is not None:
            field = printable(field)  # messages escape line breaks and other control characters
            assert f"'{field}" in message or f"{field}'" in message, (field, message)
        return None


@given(data=st.binary(max_size=200))
@example(data=b"\xef\xbb\xbf" + yaml.safe_dump(VALID).encode())
@example(data=b"a: " + BIG_INT.encode())
@example(data=b"[" * 5000)
@example(data=b"a: \x00")
@example(data=b"- 1\n- 2")
@example(data=b"")
@FUZZ
def test_config_from_random_bytes(tmp_path, data):
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    check_config(path)


@given(where=st.data(), value=YAML_VALUES, delete=st.booleans())
@FUZZ
def test_config_mutations_name_the_field(tmp_path, where, value, delete):
    """Change (or delete) one entry of a valid config: it loads, or the error names that entry's section."""
    raw = json.loads(json.dumps(VALID))
    target = where.draw(st.sampled_from([p for p in paths_of(raw) if p]))
    node = raw
    for part in target[:-1]:
        node = node[part]
    if delete:
        del node[target[-1]]
    else:
        node[target[-1]] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    # The message names the entry or the section holding it (whole-section checks such as
    # `stride < window` or `k <= d_sae` are reported on the section).
    check_config(path, field=str(target[0]))


@given(extra=st.dictionaries(st.text(min_size=1, max_size=6), YAML_SCALARS, min_size=1, max_size=2), section=st.sampled_from([None, "corpus", "sae"]))
@example(extra={"\x85": None}, section=None)  # a key YAML reads back as a space
@FUZZ
def test_unknown_keys_are_named(tmp_path, extra, section):
    raw = json.loads(json.dumps(VALID))
    node = raw if section is None else raw[section]
    from bbox_sae.config import SAEConfig

    known = {None: Config, "corpus": CorpusConfig, "sae": SAEConfig}[section].model_fields
    fresh = {k: v for k, v in extra.items() if k not in node and k not in known}
    if not fresh:
        return
    before = set(node)
    node.update(fresh)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    # The key as YAML reads it back: a NEL (U+0085) in a key is a line break to YAML, read as a space.
    loaded = yaml.safe_load(path.read_text())
    key = next(k for k in (loaded if section is None else loaded[section]) if k not in before)
    assert check_config(path, field=section or key) is None


def test_nul_in_a_path_is_a_config_error(tmp_path):
    raw = json.loads(json.dumps(VALID))
    raw["output_dir"] = "out\x00put"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="'output_dir'.*NUL"):
        load_config(path)


# ---------------------------------------------------------------- the CLI: one line, no traceback, nothing trusted left behind


def _cli(*args):
    return bbox_process(*args, timeout=120)


def _project(tmp_path):
    """Two users' log-prob files the tests write themselves, and a corpus they write at `project.corpus`."""
    return make_project(tmp_path, docs=None, embedding=None)


def _assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bbox: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(
    "content, needle",
    [
        (b'{"id": "a", "text": "fine"}\n{"id": "b", "text": "caf\xe9"}\n', ":2: not valid UTF-8"),
        (b'{"id": "a", "text": "fine"}\n{"id": ' + BIG_INT.encode() + b', "text": "x"}\n', ":2: "),
        (b'{"id": "a", "text": "fine"}\n["not", "an", "object"]\n', ":2: expected a JSON object"),
    ],
)
def test_cli_bad_corpus_is_one_line_and_leaves_no_claim_of_success(tmp_path, content, needle):
    project = _project(tmp_path)
    project.corpus.write_bytes(content)
    proc = _cli("score", "--config", str(project.config))
    _assert_one_line_error(proc, str(project.corpus) + needle)
    paths = project.paths
    assert not paths.documents.exists() and not paths.ingest_marker.exists()
    assert not paths.words.exists() or not list(paths.words.glob("part-*"))


def test_cli_corpus_turned_bad_after_a_good_ingest_leaves_nothing_stale(tmp_path):
    """A good ingest, then the corpus file is replaced by a bad one: the old documents must not be trusted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    project = _project(tmp_path)
    corpus, config = project.corpus, project.config
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"doc {i} says hi"}) + "\n" for i in range(3)))
    from bbox_sae.artifacts import read_table
    from bbox_sae.corpus.ingest import ingest

    cfg = load_config(config)
    ingest(cfg)
    words = read_table(cfg.paths.words)
    for m in ("a", "b"):
        pq.write_table(pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": [-1.0] * words.num_rows}), project.logprob_file(m))
    ok = _cli("score", "--config", str(config))
    assert ok.returncode == 0, ok.stderr
    assert cfg.paths.ingest_marker.exists()
    corpus.write_bytes(b'{"id": "d0", "text": "changed"}\n\xff\n')
    proc = _cli("score", "--config", str(config))
    _assert_one_line_error(proc, f"{corpus}:2: not valid UTF-8")
    assert not cfg.paths.documents.exists() and not cfg.paths.ingest_marker.exists()
    # A later stage run on its own now refuses instead of embedding the old corpus.
    embed = _cli("embed", "--config", str(config))
    _assert_one_line_error(embed, cfg.paths.documents.name)


def test_cli_bad_config_is_one_line(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_bytes(b"output_dir: out\ncorpus: {path: c.jsonl}\nmodels: " + b"[" * 3000)
    _assert_one_line_error(_cli("score", "--config", str(config)), str(config))
    config.write_text(yaml.safe_dump({**VALID, "output_dir": str(tmp_path / "o\x00ut")}))
    _assert_one_line_error(_cli("score", "--config", str(config)), "output_dir")
    assert isinstance(ConfigError("x"), BBoxError)
