"""`bbox run` with three models and three compared pairs, on tiny random models (issue 18).

Every pair must get its own features, labels and report section, and the pairs must agree with
each other: Δ(a, b) + Δ(b, c) = Δ(a, c) word by word, so every mean over the same words adds up.
"""

import json

import numpy as np
import pyarrow.compute as pc
import pytest

from bbox_sae.artifacts import read_table
from bbox_sae.pipeline import STAGE_NAMES, run_all
from helpers.project import make_project, sample_docs, tiny_model, tiny_pair

pytestmark = pytest.mark.slow

PAIRS = [("smol", "gem"), ("smol", "smol2"), ("gem", "smol2")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    project = make_project(
        tmp_path_factory.mktemp("three"),
        docs=sample_docs(20, seed=1),
        models=[*tiny_pair(), tiny_model("smol2", seed=1)],
        compare=[list(p) for p in PAIRS],
        corpus={"shard_docs": 8, "holdout_fraction": 0.25},
        embedding={"window": 32, "stride": 16},
        sae={"architecture": "topk", "d_sae": 24, "k": 4, "batch_size": 128, "epochs": 3, "lr": 0.003},
        # Filters off: random models differ everywhere, and every pair must reach labels and report.
        features={
            "top_n": 10,
            "bootstrap_samples": 50,
            "min_abs_median_dlogp": 0.0,
            "min_abs_median_dp": 0.0,
            "require_significance": False,
            "require_generalize": False,
            "min_activations": 1,
        },
    )
    config = project.load()
    return config, run_all(config)


def test_every_stage_runs_and_every_model_is_scored_on_every_word(run):
    cfg, result = run
    assert result["ran"] == STAGE_NAMES
    words = read_table(cfg.paths.words)
    for m in ("smol", "gem", "smol2"):
        lp = read_table(cfg.paths.logprobs(m))
        assert lp["doc_id"].equals(words["doc_id"]) and lp["word_idx"].equals(words["word_idx"])
        assert pc.all(pc.less_equal(lp["logprob"], 1e-9)).as_py()


def test_every_pair_gets_features_for_the_same_latents_and_the_deltas_add_up(run):
    cfg, _ = run
    rows = read_table(cfg.paths.features).to_pylist()
    by_pair = {p: {r["latent"]: r for r in rows if (r["model_a"], r["model_b"]) == p} for p in PAIRS}
    assert {(r["model_a"], r["model_b"]) for r in rows} == set(PAIRS)
    latents = set(by_pair[PAIRS[0]])
    assert latents and all(set(v) == latents for v in by_pair.values())
    (ab, ac, bc) = (by_pair[p] for p in PAIRS)  # (smol, gem), (smol, smol2), (gem, smol2)
    for latent in latents:
        for col in ("mean_dlogp", "holdout_mean_dlogp"):
            x, y, z = ab[latent][col], bc[latent][col], ac[latent][col]
            if np.isfinite(z):
                assert x + y == pytest.approx(z, abs=1e-9), (latent, col)
    for r in rows:
        assert r["better_model"] == (r["model_a"] if r["median_dlogp"] > 0 else r["model_b"] if r["median_dlogp"] < 0 else None)

    stats = json.loads(cfg.paths.corpus_stats.read_text())["pair_stats"]
    assert set(stats) == {f"{a} vs {b}" for a, b in PAIRS}
    assert stats["smol vs gem"]["mean_dlogp"] + stats["gem vs smol2"]["mean_dlogp"] == pytest.approx(stats["smol vs smol2"]["mean_dlogp"], abs=1e-9)


def test_every_pair_has_labelled_kept_features_and_a_latent_keeps_one_label(run):
    from bbox_sae.labeling import labeled_features

    cfg, _ = run
    rows = labeled_features(cfg.paths).to_pylist()
    for pair in PAIRS:
        kept = [r for r in rows if (r["model_a"], r["model_b"]) == pair and r["kept"]]
        assert kept, pair
        # No LLM endpoint is configured: every kept feature gets an offline label (rule or heuristic).
        assert all(r["label"] and r["label_source"] and r["label_source"] != "llm" for r in kept)
    labels: dict[int, set] = {}
    for r in rows:
        if r["label"]:
            labels.setdefault(r["latent"], set()).add(r["label"])
    assert labels and all(len(v) == 1 for v in labels.values())


def test_the_report_has_a_section_per_pair(run):
    cfg, _ = run
    rows = read_table(cfg.paths.features).to_pylist()
    md = cfg.paths.report_md.read_text()
    html = cfg.paths.report_html.read_text()
    for a, b in PAIRS:
        n = sum((r["model_a"], r["model_b"]) == (a, b) for r in rows)
        n_kept = sum((r["model_a"], r["model_b"]) == (a, b) and r["kept"] for r in rows)
        section = md.split(f"## {a} vs {b}\n", 1)[1]
        assert section.lstrip().startswith(f"{n} feature rows, {n_kept} kept.")
        assert f"{a} vs {b}" in html
    assert 'data-sort="pair"' in html  # several pairs: the feature table says each row's
