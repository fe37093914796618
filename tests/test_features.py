import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from bbox_sae.artifacts import read_table
from bbox_sae.features import cut_context, run_features
from bbox_sae.features.significance import (
    StreamingTopN,
    bh_qvalues,
    bootstrap_median_ci,
    delta_stats,
    generalizes,
    percentile_rule,
    sign_consistency,
    wilcoxon_p,
)
from bbox_sae.layout import logprob_column
from helpers.planted import planted_pipeline


@given(acts=st.lists(st.lists(st.floats(-3, 3, width=32), min_size=4, max_size=4), min_size=1, max_size=60), n=st.integers(1, 10), chunk=st.integers(1, 17))
@settings(max_examples=150, deadline=None)
def test_streaming_top_n_equals_brute_force(acts, n, chunk):
    a = torch.tensor(acts, dtype=torch.float32)
    top = StreamingTopN(4, n)
    for s in range(0, len(a), chunk):
        top.update(a[s : s + chunk], torch.arange(s, min(s + chunk, len(a))))
    values, rows = top.result()
    for latent in range(4):
        brute = np.sort(a[:, latent].numpy())[::-1][:n]
        np.testing.assert_allclose(values[latent], brute)
        np.testing.assert_allclose(a[rows[latent], latent].numpy(), values[latent])


def test_delta_statistics_match_numpy_and_scipy():
    d = np.array([2.0, 1.5, 1.5, -0.5, 3.0, 1.5, 2.5, 0.0, 1.0])  # ties and a zero
    dp = d / 10
    s = delta_stats(d, dp, n_boot=2000, seed=0)
    assert s["median_dlogp"] == np.median(d) and s["mean_dlogp"] == pytest.approx(d.mean())
    assert s["median_dp"] == pytest.approx(np.median(dp))
    assert s["consistency"] == pytest.approx(7 / 9)
    assert s["p_value"] == pytest.approx(sps.wilcoxon(d, zero_method="wilcox").pvalue)
    assert s["ci_low"] <= s["median_dlogp"] <= s["ci_high"]


def test_degenerate_cases():
    zeros = np.zeros(8)
    s = delta_stats(zeros, zeros, 100, 0)
    assert s["median_dlogp"] == 0 and s["p_value"] == 1.0 and s["consistency"] == 0.0
    assert s["ci_low"] == s["ci_high"] == 0.0
    empty = delta_stats(np.zeros(0), np.zeros(0), 100, 0)
    assert np.isnan(empty["median_dlogp"]) and np.isnan(empty["p_value"])
    assert wilcoxon_p(np.array([0.0, 0.0, 2.0])) == 1.0  # one non-zero difference proves nothing
    assert sign_consistency(np.array([-1.0, -2.0, 3.0])) == pytest.approx(2 / 3)
    assert bootstrap_median_ci(np.array([5.0]), 50, 0) == (5.0, 5.0)
    assert not generalizes(2.0, 0.9) and generalizes(2.0, 1.0) and not generalizes(2.0, -3.0) and not generalizes(0.0, 1.0)


@given(x=st.lists(st.one_of(st.integers(-3, 3).map(float), st.floats(-4, 4, allow_nan=False).map(lambda v: round(v, 1))), min_size=2, max_size=11))
@settings(max_examples=60, deadline=None)
def test_wilcoxon_p_is_scipys_to_the_bit(x):
    """Small samples with zeros or ties take the sign-flip count in place of scipy's permutation
    test (about 200x faster); every p-value, and so every q-value and finding, stays the same."""
    x = np.asarray(x)
    if np.count_nonzero(x) < 2:
        assert wilcoxon_p(x) == 1.0
        return
    assert wilcoxon_p(x) == float(sps.wilcoxon(x, zero_method="wilcox", alternative="two-sided").pvalue)


def test_percentile_rule_follows_the_paper():
    acts = np.array([10.0, 9.0, 8.0, 3.0, 2.6, 2.4, 0.5, 0.4])
    keep = percentile_rule(acts)
    p25 = np.percentile(acts, 25)
    assert keep.tolist() == [(a >= p25) or (a >= 2.5) for a in acts]
    assert percentile_rule(np.zeros(0)).tolist() == []


P_VALUES = st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, 0.01, 0.05, 0.5, float("nan")]))  # ties, 0s, 1s


@given(st.lists(P_VALUES, min_size=1, max_size=80))
@settings(max_examples=300, deadline=None)
def test_bh_matches_scipy(p):
    p = np.array(p)
    q = bh_qvalues(p)
    ok = ~np.isnan(p)
    assert np.isnan(q[~ok]).all()
    if ok.any():
        np.testing.assert_allclose(q[ok], sps.false_discovery_control(p[ok], method="bh"), rtol=0, atol=1e-12)


@given(x=st.lists(st.one_of(st.floats(-5, 5), st.sampled_from([0.0, 1.0])), min_size=2, max_size=200), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_bootstrap_ci_matches_scipy_for_the_same_seed(x, seed):
    x = np.array(x)
    ours = bootstrap_median_ci(x, 200, seed)
    theirs = sps.bootstrap((x,), np.median, n_resamples=200, method="percentile", rng=np.random.default_rng(seed), vectorized=True).confidence_interval
    np.testing.assert_allclose(ours, (theirs.low, theirs.high), rtol=0, atol=1e-12)


def test_context_is_cut_at_word_boundaries():
    text = "alpha beta gamma delta epsilon zeta"
    s = text.index("delta")
    left, word, right = cut_context(text, s, s + 5, 9)
    assert (left, word, right) == ("gamma ", "delta", " epsilon")


# ------------------------------------------------------------------ planted end-to-end


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    return planted_pipeline(tmp_path_factory.mktemp("planted"), planted_delta=3.0)


def test_planted_difference_is_found_with_b_worse(planted_run):
    cfg, planted, words = planted_run
    findings = read_table(cfg.paths.findings).to_pylist()
    assert findings, "the planted class must come out as a finding"
    index = read_table(cfg.paths.index)
    planted_by_key = dict(zip(zip(words["doc_id"].to_pylist(), words["word_idx"].to_pylist()), planted))
    planted_rows = np.array([planted_by_key[k] for k in zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist())])
    from bbox_sae.evaluation import row_attributes
    from bbox_sae.features.rules import any_mask, rules_from_json

    attrs = row_attributes(cfg)
    holdout = index["split"].to_numpy(zero_copy_only=False) == "holdout"
    for f in findings:
        # Tested on every holdout word its rule matches: those words are the planted ones, A wins by 3.
        words_of = any_mask(rules_from_json(f["rule_json"]), attrs) & holdout
        assert planted_rows[words_of].mean() >= 0.8, f"finding {f['rule']} is only {planted_rows[words_of].mean():.0%} planted words"
        assert f["better_model"] == "A" and f["holdout_median_dlogp"] == pytest.approx(3.0, abs=0.01)
        assert f["holdout_p_value"] < 1e-3 and f["holdout_ci_low"] > 2.0 and "were" in f["rule"]
    features = read_table(cfg.paths.features)
    kept = features.filter(pc.field("kept")).to_pylist()
    assert kept and all(f["finding"] is not None and "were" in f["rule"] for f in kept)
    from bbox_sae.labeling import run_label

    run_label(cfg)  # the label stage draws the negatives for validation
    negatives = read_table(cfg.paths.label_negatives)
    contexts = pa.concat_tables([read_table(cfg.paths.contexts), negatives])
    assert set(contexts["split"].to_pylist()) >= {"train", "holdout", "negative"}
    # Negatives are holdout words, never one of the latent's own top activations, at most
    # validation_examples per latent, all for labeled (kept) latents.
    holdout_keys = {(d, w) for d, w, sp in zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist(), index["split"].to_pylist()) if sp == "holdout"}
    top = read_table(cfg.paths.contexts).to_pylist()
    for n in negatives.to_pylist():
        assert (n["doc_id"], n["word_idx"]) in holdout_keys and n["activation"] == 0.0
        assert not any(t["latent"] == n["latent"] and (t["doc_id"], t["word_idx"]) == (n["doc_id"], n["word_idx"]) for t in top)
    per_latent = pc.value_counts(negatives["latent"]).to_pylist()
    assert per_latent and all(c["counts"] <= cfg.label.validation_examples for c in per_latent)
    assert {c["values"] for c in per_latent} <= {f["latent"] for f in kept}
    assert contexts.num_rows > 0 and logprob_column("A") in contexts.column_names
    from bbox_sae.evaluation import PlantedRule, score_recovery

    # The planted evaluation reports, per rule, how well its finding's statement tells the finding's
    # held-out words from near misses (finding_labels.parquet).
    from bbox_sae.labeling.finding_statements import labeled_findings

    rule = PlantedRule("were-after-if", delta=-3.0, word="^were$", left=r"\bif\b")
    recovery = score_recovery(cfg, cfg.out, [rule], {rule.name: planted_rows}, "sae")["per_rule"][rule.name]
    said = next(f for f in labeled_findings(cfg.paths) if f["finding"] == recovery["finding"])
    assert recovery["recovered"] and recovery["detection"] == said["detection"] >= 0.85 and recovery["label"] == said["statement"]
    # Whether the SAE sees the rule at all: a latent whose train top words are mostly 'were' after 'if'.
    assert recovery["latent"] is not None and recovery["latent_precision"] >= 0.8 and 0 < recovery["latent_recall"] <= 1
    stats = json.loads(cfg.paths.corpus_stats.read_text())
    assert stats["models"]["A"]["mean_logprob"] > stats["models"]["B"]["mean_logprob"]
    assert index.num_rows == stats["words"]
    tested = read_table(cfg.paths.rules).to_pandas()
    assert len(tested) >= len(findings) and tested["passed"].sum() >= len(findings)
    # Rules too rare on train or holdout are not in the multiple-testing family.
    testable = tested[["holdout_n", "n_train"]].min(axis=1) >= cfg.features.min_activations
    assert tested.loc[~testable, "q_value"].isna().all() and not tested.loc[~testable, "passed"].any()
    assert np.allclose(tested.loc[testable, "q_value"], bh_qvalues(tested.loc[testable, "holdout_p_value"].to_numpy()), equal_nan=True)


def test_identical_models_keep_nothing(tmp_path):
    cfg, _, _ = planted_pipeline(tmp_path, planted_delta=0.0)
    features = read_table(cfg.paths.features)
    assert features.num_rows > 0
    assert not any(features["kept"].to_pylist())


@pytest.mark.parametrize("features", [{"test": "rule", "ranking": "full"}, {"test": "top", "ranking": "blind"}])
def test_a_noise_only_pair_keeps_nothing(tmp_path, features):
    """A and B two noisy copies of one model (N(0, 1) each): the SAE's most extreme rows are noise; neither
    the rules they propose (tested on every holdout word they match) nor Δ-blind top words (tested on
    holdout) may pass."""
    cfg, _, _ = planted_pipeline(tmp_path, planted_delta=0.0, noise=1.0, features=features)
    assert read_table(cfg.paths.findings).num_rows == 0
    assert not any(read_table(cfg.paths.features)["kept"].to_pylist())


def test_the_papers_selection_is_fooled_by_noise(tmp_path):
    """The same noise with the paper's test (holdout top words ranked on full rows, Δ included):
    rows chosen for their Δ pass a test on that Δ. This is why the defaults do not do it."""
    cfg, _, _ = planted_pipeline(tmp_path, planted_delta=0.0, noise=1.0, features={"test": "top", "ranking": "full"})
    assert any(read_table(cfg.paths.features)["kept"].to_pylist())


def test_baselines_run_on_the_same_rows(planted_run):
    cfg, _, _ = planted_run
    for baseline in ("random", "kmeans"):
        into = cfg.paths.baseline(baseline)
        result = run_features(cfg.model_copy(update={"features": cfg.features.model_copy(update={"baseline": baseline})}), into=into)
        features = read_table(cfg.paths.baseline(baseline).features)
        assert set(features["source"].to_pylist()) == {baseline}
        assert result["feature_rows"] == features.num_rows
        assert features.num_rows > 0
    assert set(read_table(cfg.paths.features)["source"].to_pylist()) == {"sae"}


def test_a_label_claims_only_what_its_latent_mostly_fires_on(planted_run):
    """On a trained SAE: what a kept latent's label adds beyond its finding ("; the latent also
    fires on ...") is exactly its broader rules, each matching train words on which the latent
    fires at least half the time, and none of them inside the finding's own rules."""
    from bbox_sae.features import feature_source
    from bbox_sae.features.rules import fit_rule
    from bbox_sae.labeling import labeled_features, run_label
    from bbox_sae.labeling.broader import broader_rules
    from bbox_sae.labeling.records import latent_rules

    cfg, _, _ = planted_run
    run_label(cfg)
    features = read_table(cfg.paths.features)
    kept = features.filter(pc.field("kept"))
    rules_of = latent_rules(kept, read_table(cfg.paths.findings))
    broader = broader_rules(feature_source(cfg), read_table(cfg.paths.contexts), rules_of)
    assert set(broader) == set(kept["latent"].to_pylist())
    assert any(broader.values()), "the planted run has a latent broader than its finding ('were' after 'if' and 'was')"
    from bbox_sae.evaluation import row_attributes

    attrs = row_attributes(cfg)
    src = feature_source(cfg)
    m = src.matrix
    labels = {r["latent"]: r for r in labeled_features(cfg.paths).filter(pc.field("kept")).to_pylist()}
    for latent, extra in broader.items():
        fires = src.fires([latent])[:, 0]
        for rule in extra:
            assert fit_rule(rule, attrs, np.zeros(0, np.int64), fires, m.rows_by_split["train"]).precision >= 0.5
            assert rule not in rules_of[latent]
        label = labels[latent]
        assert ("; the latent also fires on " in label["label"]) == bool(extra)
        assert label["label_coherent"] is (not extra)
        assert all(r.describe() in label["label"] for r in extra)


def test_features_and_label_open_the_rows_and_build_the_encoder_once(planted_run, monkeypatch):
    """One FeatureSource per command: `bbox run`'s features and label stages (negatives, broader
    rules, finding statements) share the matrix, the word join and the encoder; a rewritten matrix
    is a new source."""
    from bbox_sae.artifacts import atomic_write_bytes
    from bbox_sae.features import feature_source, run_features, source
    from bbox_sae.labeling import run_label

    cfg, _, _ = planted_run
    source._opened.clear()
    opened, encoders = [], []
    real_open, real_encoder = source.open_rows, source.make_encoder
    monkeypatch.setattr(source, "open_rows", lambda c: opened.append(c) or real_open(c))
    monkeypatch.setattr(source, "make_encoder", lambda c, name, *rest: encoders.append(name) or real_encoder(c, name, *rest))
    run_features(cfg)
    run_label(cfg)
    assert len(opened) == 1 and encoders == ["sae"]
    first = feature_source(cfg)
    atomic_write_bytes(cfg.paths.matrix, cfg.paths.matrix.read_bytes())
    assert feature_source(cfg) is not first


def test_a_finding_always_says_who_proposed_it():
    from bbox_sae.features.candidates import proposer_text

    assert proposer_text(True, [3]) == "rule search + latent 3"
    assert proposer_text(False, [17, 3]) == "latents 3, 17"
    # Latents whose top words lie mostly elsewhere are not named beside a real proposer ...
    assert proposer_text(True, [], minority=[274]) == "rule search"
    assert proposer_text(False, [5], minority=[274]) == "latent 5"
    # ... but a finding they alone proposed says so rather than naming no one.
    assert proposer_text(False, [], minority=[274]) == "latent 274, from a minority of its top words"
    assert proposer_text(False, [], minority=[9, 2]) == "latents 2, 9, from a minority of their top words"
