"""report.html over a run the size of the default SAE (3,000 latents): a few MB, and every context
of what a reader acts on (kept features, members of a finding) is in it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_report import CONTEXT_SCHEMA, corpus_stats, embedded_data, report_config

from bbox_sae.layout import RunLayout
from bbox_sae.report import run_report
from bbox_sae.report.views import HIST_BINS, delta_histogram

N_LATENTS, PER_SPLIT, N_DOMAINS = 3000, 20, 30
MAX_BYTES = 8 * 2**20
CONTEXT_CHARS = 80  # features.context_chars' default: the left and right text of each context


def _prose(rng: np.random.Generator, n_chars: int) -> str:
    return " ".join(rng.choice(["the", "were", "KING.", "thou", "said", "morrow", "and", "speak"], 20))[:n_chars]


@pytest.fixture(scope="module")
def large_run(tmp_path_factory):
    rng = np.random.default_rng(0)
    out = tmp_path_factory.mktemp("scale") / "run"
    out.mkdir()
    latents = np.arange(N_LATENTS)
    medians = rng.normal(0, 1.5, N_LATENTS)
    kept = latents % 20 == 0
    # Latents 10, 30, 50, ...: not kept but members of a finding, which shows them in full too.
    finding = np.where(latents % 10 == 0, latents // 100, -1)
    features = {
        "latent": pa.array(latents, pa.int32()),
        "model_a": ["alpha"] * N_LATENTS,
        "model_b": ["beta"] * N_LATENTS,
        "kept": kept.tolist(),
        "better_model": ["alpha" if m > 0 else "beta" for m in medians],
        "median_dlogp": medians.tolist(),
        "top_words": ["were (12) | thou (3)"] * N_LATENTS,
        "label": [f"'were' after a pronoun, latent {i}" for i in latents],
        "label_score": rng.uniform(0.5, 1.0, N_LATENTS).tolist(),
        "rule": ["'were' after 'if you'"] * N_LATENTS,
        "rule_precision": rng.uniform(0, 1, N_LATENTS).tolist(),
        "rule_recall": rng.uniform(0, 1, N_LATENTS).tolist(),
        "rule_f1": rng.uniform(0, 1, N_LATENTS).tolist(),
        "finding": pa.array([None if f < 0 else int(f) for f in finding], pa.int32()),
    }
    pq.write_table(pa.table(features), RunLayout(out).features)
    rows = []
    for latent in latents:
        for split in ("train", "holdout"):
            for rank in range(PER_SPLIT):
                lp = float(-rng.uniform(0.5, 12))
                rows.append(
                    {
                        "latent": int(latent), "split": split, "rank": rank, "doc_id": f"work-{rank % N_DOMAINS:02d}-{latent}",
                        "word_idx": rank, "activation": 5.0 - rank / 10, "in_top": split == "train" and rank < 15,
                        "left": _prose(rng, CONTEXT_CHARS), "word": "were", "right": _prose(rng, CONTEXT_CHARS),
                        "logprob__alpha": lp, "logprob__beta": lp - float(medians[latent] + rng.normal(0, 0.3)),
                    }
                )  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=CONTEXT_SCHEMA), RunLayout(out).contexts)
    docs = sorted({r["doc_id"] for r in rows})
    domains = [d.rsplit("-", 1)[0] for d in docs]
    pq.write_table(
        pa.table(
            {"doc_id": docs, "text": ["t"] * len(docs), "split": ["train"] * len(docs), "domain": domains, "shard": pa.array([0] * len(docs), pa.int64())}
        ),
        RunLayout(out).documents,
    )
    RunLayout(out).corpus_stats.write_text(json.dumps(corpus_stats()))
    result = run_report(report_config(out))
    return out, result, rows


def test_report_of_3000_latents_stays_a_few_mb(large_run):
    out, result, _ = large_run
    assert result["features"] == N_LATENTS
    assert RunLayout(out).report_html.stat().st_size < MAX_BYTES


def test_every_context_of_kept_and_finding_features_is_embedded(large_run):
    out, result, rows = large_run
    data = embedded_data(RunLayout(out).report_html.read_text(encoding="utf-8"))
    by_latent = {f["latent"]: f for f in data["features"]}
    full = [latent for latent in range(N_LATENTS) if latent % 10 == 0]
    assert set(full) <= set(by_latent), "every kept feature and finding member is shown"
    expected: dict[tuple[int, str], list[tuple]] = {}
    for r in rows:
        expected.setdefault((r["latent"], r["split"]), []).append((r["rank"], r["doc_id"], r["left"], r["word"], r["right"]))
    for latent in full:
        view = by_latent[latent]
        for split in ("train", "holdout"):
            got = [(c["rank"], c["doc_id"], c["left"], c["word"], c["right"]) for c in view["contexts"][split]]
            assert got == expected[(latent, split)]
            assert view["context_counts"][split] == PER_SPLIT


def test_other_features_carry_a_few_contexts_and_their_counts(large_run):
    out, result, _ = large_run
    data = embedded_data(RunLayout(out).report_html.read_text(encoding="utf-8"))
    others = [f for f in data["features"] if not f["kept"] and f["finding"] is None]
    assert len(others) == result["shown"] - N_LATENTS // 10
    cap = report_config(out).report.examples_per_other_feature
    for f in others:
        assert [c["rank"] for c in f["contexts"]["train"]] == list(range(cap))
        assert f["context_counts"] == {"train": PER_SPLIT, "holdout": PER_SPLIT}


@given(st.floats(-30, 30), st.lists(st.floats(-1e-12, 1e-12), min_size=1, max_size=50))
def test_histogram_of_deltas_equal_but_for_float_noise(centre, noise):
    """Top words whose Δ differ only by float noise (one word, one context kind) still get a histogram."""
    hist = delta_histogram([centre + n for n in noise])
    assert sum(hist["counts"]) == len(noise) and len(hist["edges"]) == HIST_BINS + 1
    assert hist["edges"][0] <= round(centre, 4) <= hist["edges"][-1]
