"""Readable contexts of matrix rows (`contexts.parquet`'s rows), and words per matrix row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from bbox_sae.artifacts import read_table, resolve_files
from bbox_sae.config import Config
from bbox_sae.features.rules import WordAttributes, word_attributes
from bbox_sae.layout import logprob_column
from bbox_sae.schemas import contexts_schema

# (latent, split, rank, row, activation, in_top): one row of contexts.parquet before its text is cut.
Example = tuple[int, str, int, int, float, bool]


def cut_context(text: str, start: int, end: int, chars: int) -> tuple[str, str, str]:
    """Left context, word, right context; contexts cut at whitespace so no word is split."""
    left_start = max(0, start - chars)
    left = text[left_start:start]
    if left_start > 0:
        cut = min((i for i in (left.find(" "), left.find("\n")) if i >= 0), default=-1)
        left = left[cut + 1 :] if cut >= 0 else ""
    right = text[end : end + chars]
    if end + chars < len(text):
        cut = max(right.rfind(" "), right.rfind("\n"))
        right = right[:cut] if cut >= 0 else ""
    return left, text[start:end], right


def contexts_table(cfg: Config, examples: list[Example], index: pa.Table, models: list[str]) -> pa.Table:
    """The examples with their text cut around the word, and every model's log-prob of the word."""
    rows = np.array([e[3] for e in examples], dtype=np.int64)
    doc_ids = index["doc_id"].take(pa.array(rows)) if len(rows) else pa.array([], pa.string())
    word_idx = index["word_idx"].take(pa.array(rows)) if len(rows) else pa.array([], pa.int32())
    needed = pa.table({"doc_id": doc_ids, "word_idx": word_idx, "_pos": pa.array(np.arange(len(rows)))})
    docs_needed = pc.unique(doc_ids) if len(rows) else pa.array([], pa.string())
    files = [str(f) for f in resolve_files(cfg.paths.words)]
    words = pads.dataset(files, format="parquet").to_table(
        columns=["doc_id", "word_idx", "char_start", "char_end"], filter=pc.field("doc_id").isin(docs_needed)
    )
    joined = needed.join(words, keys=["doc_id", "word_idx"]).sort_by("_pos")
    documents = read_table(cfg.paths.documents, columns=["doc_id", "text"]).filter(pc.is_in(pc.field("doc_id"), value_set=docs_needed))
    text_of = dict(zip(documents["doc_id"].to_pylist(), documents["text"].to_pylist()))
    lefts, words_col, rights = [], [], []
    for doc, s, e in zip(joined["doc_id"].to_pylist(), joined["char_start"].to_pylist(), joined["char_end"].to_pylist()):
        left, word, right = cut_context(text_of[doc], s, e, cfg.features.context_chars)
        lefts.append(left)
        words_col.append(word)
        rights.append(right)
    cols = {
        "latent": pa.array([e[0] for e in examples], pa.int32()),
        "split": pa.array([e[1] for e in examples], pa.string()),
        "rank": pa.array([e[2] for e in examples], pa.int32()),
        "doc_id": doc_ids,
        "word_idx": word_idx,
        "activation": pa.array([e[4] for e in examples], pa.float32()),
        "in_top": pa.array([e[5] for e in examples], pa.bool_()),
        "left": pa.array(lefts, pa.string()),
        "word": pa.array(words_col, pa.string()),
        "right": pa.array(rights, pa.string()),
    }
    for m in models:
        cols[logprob_column(m)] = index[logprob_column(m)].take(pa.array(rows)) if len(rows) else pa.array([], pa.float64())
    return pa.table(cols, schema=contexts_schema(models))


def words_by_row(cfg: Config, index: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The word string of every matrix row (object array), and its position in `words/` order."""
    words = read_table(cfg.paths.words, columns=["doc_id", "word_idx", "word"])
    words = words.append_column("position", pa.array(np.arange(words.num_rows)))
    keyed = index.select(["row", "doc_id", "word_idx"]).join(words, keys=["doc_id", "word_idx"]).sort_by("row")
    out = np.empty(index.num_rows, dtype=object)
    rows = keyed["row"].to_numpy()
    out[rows] = np.array(keyed["word"].to_pylist(), dtype=object)
    position = np.empty(index.num_rows, dtype=np.int64)
    position[rows] = keyed["position"].to_numpy()
    return out, position


def word_attributes_by_position(cfg: Config) -> WordAttributes:
    """Rule attributes of every word in `words/` order (documents are contiguous there)."""
    words = read_table(cfg.paths.words, columns=["doc_id", "word"])
    doc_ids = words["doc_id"].to_numpy(zero_copy_only=False)
    word_list = words["word"].to_pylist()
    bounds = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1], True])
    return word_attributes([word_list[s:e] for s, e in zip(bounds[:-1], bounds[1:])])
