"""Per-domain corpus statistics: each model's perplexity within each domain, as Paloma reports it.

A corpus-wide perplexity averages over domains of very different sizes and difficulty, so a
model that is better on the large domain looks better everywhere. Here every domain gets the
same numbers `corpus_stats.json` gives the whole corpus, on the same words (the rows of
`build/index.parquet`, where every model has a log-prob).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.layout import logprob_column

# Documents without a domain in a corpus where others have one: grouped, not dropped, so the
# per-domain word counts add up to the corpus total.
NO_DOMAIN = "(no domain)"


def _named(domains: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Domains with null and "" both as NO_DOMAIN, in one chunk."""
    if isinstance(domains, pa.ChunkedArray):
        domains = domains.combine_chunks()
    return pc.fill_null(pc.if_else(pc.equal(domains, ""), pa.scalar(None, pa.string()), domains), NO_DOMAIN)


def domain_stats(index: pa.Table, documents: pa.Table, models: list[str], pairs: list[tuple[str, str]]) -> dict:
    """{domain: {documents, words, models: {m: {mean_logprob, perplexity, words}}, pair_stats: {"a vs b": ...}}}.

    `index`: one row per scored word with `doc_id` and `logprob__<model>` (build/index.parquet);
    `documents`: `doc_id`, `domain` (documents.parquet). Empty when no document has a domain.
    Domains are in name order; `documents` counts a domain's documents in documents.parquet, the
    rest is over its scored words; a domain none of whose words were scored is left out.
    """
    if "domain" not in documents.column_names or not pc.any(pc.not_equal(documents["domain"], "")).as_py():
        return {}
    doc_domains = _named(documents["domain"])
    word_domains = pc.take(doc_domains, pc.index_in(index["doc_id"], value_set=documents["doc_id"]))
    encoded = pc.dictionary_encode(_named(word_domains))
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    names = encoded.dictionary.to_pylist()
    order = np.argsort(codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(names)))])
    n_documents = Counter(doc_domains.to_pylist())
    logprobs = {m: index[logprob_column(m)].to_numpy(zero_copy_only=False).astype(np.float64) for m in models}
    out = {}
    for code in sorted(range(len(names)), key=lambda c: names[c]):
        rows = order[bounds[code] : bounds[code + 1]]
        entry: dict = {"documents": n_documents[names[code]], "words": int(len(rows)), "models": {}, "pair_stats": {}}
        for m in models:
            mean = float(logprobs[m][rows].mean())
            entry["models"][m] = {"mean_logprob": mean, "perplexity": float(np.exp(-mean)), "words": int(len(rows))}
        for a, b in pairs:
            d = logprobs[a][rows] - logprobs[b][rows]
            entry["pair_stats"][f"{a} vs {b}"] = {"mean_dlogp": float(d.mean()), "median_dlogp": float(np.median(d)), "share_a_better": float((d > 0).mean())}
        out[names[code]] = entry
    return out
