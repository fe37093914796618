"""Contextual word embeddings: a word's vector is the mean of its encoder tokens' hidden states.

- Any Hugging Face `AutoModel` (encoder or decoder), a chosen layer (default last).
- Long documents: windows of `window` tokens every `stride` tokens; each token takes its
  hidden state from the window in which it sits farthest from an edge (the centre of the
  window), as the reference Longformer pipeline does.
- Words that no encoder token touches (BERT-style tokenizers drop whitespace and newlines)
  take the vector of the nearest token to their left: the last token ending at or before the
  word's start; at the document start, where there is none, the first token.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

from bbox_sae.artifacts import ShardedTable, atomic_write_json, read_table
from bbox_sae.config import Config, EmbeddingConfig, key_settings
from bbox_sae.corpus.documents import parse_shard, shard_key, shard_ranges
from bbox_sae.corpus.words import word_spans
from bbox_sae.errors import ArtifactError, ConfigError
from bbox_sae.scoring.align import token_word_ranges

log = logging.getLogger(__name__)


def plan_encoder_windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """Token ranges [begin, end) covering 0..n_tokens, every `stride` tokens."""
    if n_tokens <= window:
        return [(0, n_tokens)]
    starts = list(range(0, n_tokens - window, stride)) + [n_tokens - window]
    return [(b, b + window) for b in sorted(set(starts))]


def window_owner(n_tokens: int, windows: list[tuple[int, int]]) -> np.ndarray:
    """For each token, the window where it is farthest from the window's edges."""
    owner = np.zeros(n_tokens, dtype=np.int64)
    best = np.full(n_tokens, -1, dtype=np.int64)
    for w, (b, e) in enumerate(windows):
        pos = np.arange(b, e)
        margin = np.minimum(pos - b, e - 1 - pos)
        better = margin > best[b:e]
        owner[b:e][better] = w
        best[b:e][better] = margin[better]
    return owner


def pool_words(token_vectors: np.ndarray, token_offsets: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Mean of the token vectors overlapping each word; untouched words follow the left-neighbour rule."""
    n_words, dim = len(spans), token_vectors.shape[1]
    sums = np.zeros((n_words, dim), dtype=np.float64)
    counts = np.zeros(n_words, dtype=np.float64)
    if len(token_vectors) == 0:
        return sums.astype(np.float32)
    first, last = token_word_ranges(token_offsets, spans)
    single = first == last
    np.add.at(sums, first[single], token_vectors[single])
    np.add.at(counts, first[single], 1.0)
    for t in np.flatnonzero(~single):
        sums[first[t] : last[t] + 1] += token_vectors[t]
        counts[first[t] : last[t] + 1] += 1.0
    out = np.zeros((n_words, dim), dtype=np.float64)
    hit = counts > 0
    out[hit] = sums[hit] / counts[hit, None]
    missing = np.flatnonzero(~hit)
    if len(missing):
        token_ends = np.maximum.accumulate(np.asarray(token_offsets)[:, 1])
        left = np.searchsorted(token_ends, spans[missing, 0], side="right") - 1
        out[missing] = token_vectors[np.maximum(left, 0)]
    return out.astype(np.float32)


LINE_BREAK_MARKER = "¶"


def drops_line_breaks(tokenizer) -> bool:
    """Whether the tokenizer reads a line break as a plain space (WordPiece does; byte-level BPE does not)."""
    return tokenizer("a\nb", add_special_tokens=False)["input_ids"] == tokenizer("a b", add_special_tokens=False)["input_ids"]


class WordEmbedder:
    def __init__(self, model, tokenizer, *, layer: int = -1, window: int = 256, stride: int = 128, batch_size: int = 16, mark_line_breaks: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        # An encoder that never sees line breaks cannot tell a speaker's name at the start of a
        # speech, or a paragraph's first word, from the same word mid-line. '¶' is one character,
        # so the encoder's offsets still point into the original text.
        self.line_break_marker = LINE_BREAK_MARKER if mark_line_breaks and drops_line_breaks(tokenizer) else None
        # Whole documents are tokenized before windowing; the length warning would be noise.
        tokenizer.model_max_length = 10**12
        self.layer = layer
        self._prefix, self._suffix = self._special_affixes()
        n_special = len(self._prefix) + len(self._suffix)
        max_len = getattr(model.config, "max_position_embeddings", None) or 10**9
        # RoBERTa-family position tables reserve padding_idx + 1 slots.
        if getattr(model.config, "model_type", "") in ("roberta", "longformer", "xlm-roberta"):
            max_len -= 2
        self.window = min(window, max_len - n_special)
        self.stride = min(stride, self.window)
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.dim = model.config.hidden_size

    def _special_affixes(self) -> tuple[list[int], list[int]]:
        """The special tokens the tokenizer puts before and after a text (e.g. [CLS] ... [SEP])."""
        plain = self.tokenizer("a", add_special_tokens=False)["input_ids"]
        full = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                return full[:i], full[i + len(plain) :]
        return [], []

    def _with_specials(self, ids: list[int]) -> tuple[list[int], int]:
        return self._prefix + ids + self._suffix, len(self._prefix)

    def _forward(self, batch: list[list[int]]) -> list[torch.Tensor]:
        width = max(len(x) for x in batch)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, seq in enumerate(batch):
            ids[r, : len(seq)] = torch.tensor(seq)
            mask[r, : len(seq)] = 1
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), output_hidden_states=True)
        hidden = out.hidden_states[self.layer].float().cpu()
        return [hidden[r, : len(seq)] for r, seq in enumerate(batch)]

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        """One (n_words, dim) float32 array per text, words as `words.word_spans` segments them."""
        shown = [t.replace("\n", self.line_break_marker) for t in texts] if self.line_break_marker else texts
        encodings = [self.tokenizer(t, add_special_tokens=False, return_offsets_mapping=True) for t in shown]
        jobs = []  # (doc, window index, input ids, prefix length)
        plans = []
        for d, enc in enumerate(encodings):
            n = len(enc["input_ids"])
            windows = plan_encoder_windows(n, self.window, self.stride) if n else []
            plans.append(windows)
            for w, (b, e) in enumerate(windows):
                full, prefix = self._with_specials(enc["input_ids"][b:e])
                jobs.append((d, w, full, prefix))
        order = sorted(range(len(jobs)), key=lambda j: -len(jobs[j][2]))
        states: dict[tuple[int, int], torch.Tensor] = {}
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                chunk = [jobs[j] for j in order[s : s + self.batch_size]]
                for (d, w, _full, prefix), h in zip(chunk, self._forward([c[2] for c in chunk])):
                    b, e = plans[d][w]
                    states[(d, w)] = h[prefix : prefix + (e - b)]
        results = []
        for d, (text, enc) in enumerate(zip(texts, encodings)):
            spans = word_spans(text)
            n = len(enc["input_ids"])
            offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
            vectors = np.zeros((n, self.dim), dtype=np.float32)
            if n:
                owner = window_owner(n, plans[d])
                for w, (b, e) in enumerate(plans[d]):
                    mine = np.flatnonzero(owner[b:e] == w)
                    vectors[b + mine] = states[(d, w)][mine].numpy()
            if n == 0:
                log.warning("document with no encoder tokens (%d chars): its words get zero vectors", len(text))
            results.append(pool_words(vectors, offsets, spans))
        return results


def load_embedder(cfg: EmbeddingConfig) -> WordEmbedder:
    from transformers import AutoModel, AutoTokenizer

    from bbox_sae.models import encoder_location, resolve_device, resolve_dtype

    location = encoder_location(cfg.model, cfg.package)
    device = resolve_device(cfg.device, "embedding.device")
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModel.from_pretrained(location, dtype=resolve_dtype(cfg.dtype, device))
    except OSError as err:
        raise ConfigError(f"embedding.model '{location}': {str(err).splitlines()[0]}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"embedding.model '{location}': a fast tokenizer (with offsets) is needed")
    n_layers = getattr(model.config, "num_hidden_layers", None)
    # hidden_states holds the embedding output and then one entry per layer: n_layers + 1 in all.
    if isinstance(n_layers, int) and not -(n_layers + 1) <= cfg.layer <= n_layers:
        raise ConfigError(
            f"embedding.layer {cfg.layer}: '{location}' has {n_layers} layers; use {-(n_layers + 1)}..{n_layers} (0: the token embeddings, -1: the last layer)"
        )
    model.to(device).eval()
    return WordEmbedder(
        model, tokenizer, layer=cfg.layer, window=cfg.window, stride=cfg.stride, batch_size=cfg.batch_size, mark_line_breaks=cfg.mark_line_breaks
    )


def embeddings_table(doc_ids: list[str], vectors: list[np.ndarray], store_dtype: str) -> pa.Table:
    dim = vectors[0].shape[1] if vectors else 0
    dtype = np.float16 if store_dtype == "float16" else np.float32
    flat = np.concatenate([v.astype(dtype) for v in vectors]).reshape(-1) if vectors else np.zeros(0, dtype)
    values = pa.array(flat, type=pa.float16() if dtype == np.float16 else pa.float32())
    return pa.table(
        {
            "doc_id": pa.array([d for d, v in zip(doc_ids, vectors) for _ in range(len(v))], pa.string()),
            "word_idx": pa.array(np.concatenate([np.arange(len(v)) for v in vectors]) if vectors else [], pa.int32()),
            "embedding": pa.FixedSizeListArray.from_arrays(values, dim),
        }
    )


def embedding_shard_keys(cfg: Config, documents: pa.Table, ranges: list[tuple[int, int]]) -> dict[int, str]:
    settings = json.dumps(key_settings(cfg.embedding), sort_keys=True)
    return {k: shard_key(documents.slice(a, b - a), settings) for k, (a, b) in enumerate(ranges)}


def run_embed(cfg: Config, shard_spec: str | None = None) -> dict:
    """Embed the documents' words. `shard_spec` i/n: only shards k with k mod n == i (a worker of
    an array, as `bbox score --shard`); `bbox merge --stage embed` then checks the whole."""
    shard = parse_shard(shard_spec)
    documents = read_table(cfg.paths.documents)
    table = ShardedTable(cfg.paths.embeddings)
    ranges = shard_ranges(documents.num_rows, cfg.corpus.shard_docs)
    keys = embedding_shard_keys(cfg, documents, ranges)
    mine = [k for k in range(len(ranges)) if k % shard[1] == shard[0]]
    todo = [k for k in mine if not table.has(k, keys[k])]
    stats = {"documents": 0, "words": 0, "seconds": 0.0}
    if todo:
        embedder = load_embedder(cfg.embedding)
        start = time.perf_counter()
        with tqdm(total=sum(ranges[k][1] - ranges[k][0] for k in todo), desc="embed", unit="doc", leave=False) as bar:
            for k in todo:
                a, b = ranges[k]
                ids = documents["doc_id"].slice(a, b - a).to_pylist()
                texts = documents["text"].slice(a, b - a).to_pylist()
                vectors = embedder.embed(texts)
                bad = [d for d, v in zip(ids, vectors) if not np.all(np.isfinite(v))]
                if bad:
                    # Kept as written: the builder drops non-finite rows, so every model loses the same words.
                    log.warning("embedding model gave NaN/inf vectors in document(s) %s; their words are excluded", bad[:5])
                table.write(k, embeddings_table(ids, vectors, cfg.embedding.store_dtype), keys[k])
                stats["documents"] += len(ids)
                stats["words"] += sum(len(v) for v in vectors)
                bar.update(len(ids))
        stats["seconds"] = round(time.perf_counter() - start, 3)
        stats["words_per_s"] = round(stats["words"] / max(stats["seconds"], 1e-9), 1)
    table.remove_extra(set(range(len(ranges))))
    if shard == (0, 1):
        check_embeddings(cfg, documents)
        atomic_write_json(cfg.paths.embedding_stats, stats)
    else:
        bad = table.verify(mine)
        if bad:
            raise ArtifactError(f"{cfg.paths.embeddings}: shard(s) {bad} failed their checksum; re-run `bbox embed --shard {shard_spec}`")
        atomic_write_json(cfg.paths.embedding_shard_stats(*shard), stats)
    return stats


def check_embeddings(cfg: Config, documents: pa.Table | None = None) -> None:
    """Every shard of the embeddings present, computed from the current documents and settings,
    and intact (what `bbox merge --stage embed` checks once an array's workers are done)."""
    if documents is None:
        documents = read_table(cfg.paths.documents)
    table = ShardedTable(cfg.paths.embeddings)
    ranges = shard_ranges(documents.num_rows, cfg.corpus.shard_docs)
    keys = embedding_shard_keys(cfg, documents, ranges)
    missing = [k for k in range(len(ranges)) if not table.has(k, keys[k])]
    if missing:
        shown = ", ".join(str(table.shard_path(k)) for k in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ArtifactError(
            f"embeddings incomplete: shard(s) {missing} missing or out of date ({shown}); run `bbox embed` (or the `--shard i/n` workers that own them)"
        )
    bad = table.verify()
    if bad:
        raise ArtifactError(f"{cfg.paths.embeddings}: shard(s) {bad} failed their checksum; re-run `bbox embed` (or the workers that own them)")
