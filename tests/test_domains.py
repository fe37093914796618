"""Per-domain perplexity (Paloma-style), checked against a direct computation."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bbox_sae.features.domains import NO_DOMAIN, domain_stats

DOMAIN = st.one_of(st.none(), st.just(""), st.sampled_from(["play", "poem", "web", "(no domain)"]))
LOGPROB = st.floats(-30, 0, allow_nan=False)


@st.composite
def corpus(draw):
    n_docs = draw(st.integers(1, 6))
    domains = draw(st.lists(DOMAIN, min_size=n_docs, max_size=n_docs))
    words = draw(st.lists(st.tuples(st.integers(0, n_docs - 1), LOGPROB, LOGPROB), min_size=1, max_size=40))
    documents = pa.table({"doc_id": [f"d{i}" for i in range(n_docs)], "domain": pa.array(domains, pa.string())})
    index = pa.table({"doc_id": [f"d{d}" for d, _, _ in words], "logprob__a": [a for _, a, _ in words], "logprob__b": [b for _, _, b in words]})
    return index, documents


@given(data=corpus())
@settings(max_examples=100, deadline=None)
def test_matches_a_direct_computation(data):
    index, documents = data
    stats = domain_stats(index, documents, ["a", "b"], [("a", "b")])
    domain_of = {d: (dom or NO_DOMAIN) for d, dom in zip(documents["doc_id"].to_pylist(), documents["domain"].to_pylist())}
    if all(not d for d in documents["domain"].to_pylist()):
        assert stats == {}
        return
    groups: dict[str, list[tuple[float, float]]] = {}
    for doc, a, b in zip(*(index[c].to_pylist() for c in ("doc_id", "logprob__a", "logprob__b"))):
        groups.setdefault(domain_of[doc], []).append((a, b))
    assert list(stats) == sorted(groups)
    for name, pairs in groups.items():
        s = stats[name]
        a, b = np.array(pairs).T
        assert s["words"] == len(pairs) == s["models"]["a"]["words"]
        assert s["documents"] == sum(dom == name for dom in domain_of.values())
        assert s["models"]["a"]["perplexity"] == pytest.approx(math.exp(-a.mean()), rel=1e-9)
        assert s["models"]["b"]["mean_logprob"] == pytest.approx(b.mean(), abs=1e-9)
        p = s["pair_stats"]["a vs b"]
        assert p["mean_dlogp"] == pytest.approx((a - b).mean(), abs=1e-9)
        assert p["median_dlogp"] == pytest.approx(np.median(a - b), abs=1e-9)
        assert p["share_a_better"] == pytest.approx(((a - b) > 0).mean())
    # The domains partition the words: their word-weighted mean is the corpus mean.
    total = sum(s["words"] * s["models"]["a"]["mean_logprob"] for s in stats.values())
    assert total / index.num_rows == pytest.approx(np.mean(index["logprob__a"].to_numpy()), abs=1e-9)


def test_a_domain_where_the_corpus_winner_loses():
    """Paloma's point: B is better overall (the big domain) but worse on the small one."""
    documents = pa.table({"doc_id": ["big", "small"], "domain": ["web", "poem"]})
    index = pa.table({"doc_id": ["big"] * 9 + ["small"], "logprob__a": [-3.0] * 9 + [-1.0], "logprob__b": [-2.0] * 9 + [-4.0]})
    stats = domain_stats(index, documents, ["a", "b"], [("a", "b")])
    assert stats["web"]["models"]["b"]["perplexity"] < stats["web"]["models"]["a"]["perplexity"]
    assert stats["poem"]["models"]["a"]["perplexity"] == pytest.approx(math.e)
    assert stats["poem"]["pair_stats"]["a vs b"]["mean_dlogp"] == pytest.approx(3.0)
    assert stats["poem"]["documents"] == 1 and stats["web"]["words"] == 9
