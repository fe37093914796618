"""The delphi-grade LLM labeler against the scripted OpenAI-compatible server: contrastive
prompts, the offline hint and the better-scoring label kept, fuzzing scoring, the token budget,
and the answer cache."""

from __future__ import annotations

import functools
import json
import re

import pyarrow.parquet as pq
import pytest
from test_labeling import WERE_AFTER_IF, fixture_negatives, is_detection, labels, llm_cfg, numbered_lines, simple_latent, smart, write_fixture  # noqa: F401

from bbox_sae.labeling import detection_scores, run_label
from bbox_sae.layout import RunLayout
from helpers.fake_openai import FakeOpenAI, json_reply, user_text


def is_fuzz(body: dict) -> bool:
    return '"correct"' in user_text(body)


def is_label(body: dict) -> bool:
    return not is_detection(body) and not is_fuzz(body)


def fuzz_aware(body: dict, index: int):
    """`smart`, and a fuzzing judge that says a mark is right when it is on ' pos'."""
    if is_fuzz(body):
        return json_reply({"correct": [i for i, line in numbered_lines(user_text(body)) if "<< pos>>" in line]})
    return smart(body, index)


def fuzzable_latent(latent: int, n_holdout: int = 6, **extra) -> dict:
    """Holdout positives ' pos' inside longer excerpts, so a mark can be moved to another word."""
    return simple_latent(latent, holdout=[(f"held {r} more here", " pos", " and then some") for r in range(n_holdout)], **extra)


def test_label_prompt_is_contrastive_with_probabilities_and_the_offline_hint(tmp_path):
    contrast = [("plain one", " alpha", " again"), ("another line", " alpha", " too")]
    write_fixture(tmp_path, [simple_latent(1, contrast=contrast)])
    with FakeOpenAI(fuzz_aware) as server:
        run_label(llm_cfg(tmp_path, server, fuzz_examples=6))
    label_prompt = next(user_text(b) for b in server.requests if is_label(b))
    shown, counter = label_prompt.split("Counter-examples")
    # Activating excerpts carry each compared model's probability of the word (exp(-2) = 0.14).
    assert all(line.endswith("[p(a)=0.14, p(b)=0.14]") for _, line in numbered_lines(shown))
    assert len(numbered_lines(shown)) == 3 and "ctx1 example 0<< alpha>> end" in shown
    # Counter-examples: the same word form where the latent is inactive, never the validation negatives.
    assert all(f"- {left}<<{word}>>{right}" in counter for left, word, right in contrast)
    assert "<< neg>>" not in label_prompt and "<< pos>>" not in label_prompt
    # The offline label is given as a hint.
    assert "An automatic rule search describes the group as: 'alpha'" in counter
    detect = next(user_text(b) for b in server.requests if is_detection(b))
    assert "plain" not in detect and "p(a)" not in detect


def test_fuzzing_score_is_the_balanced_accuracy_of_the_judges_picks(tmp_path):
    write_fixture(tmp_path, [fuzzable_latent(1)])
    picks = {}

    def responder(body, index):
        if is_fuzz(body):
            lines = numbered_lines(user_text(body))
            right = [i for i, line in lines if "<< pos>>" in line]
            wrong = [i for i, line in lines if "<< pos>>" not in line]
            picks.update(right=right, wrong=wrong, lines=lines)
            return json_reply({"correct": right + wrong[:1]})  # every right mark, and one wrong one
        return smart(body, index)

    with FakeOpenAI(responder) as server:
        result = run_label(llm_cfg(tmp_path, server, fuzz_examples=6))
    # Every other holdout positive has its mark moved onto another word of the same excerpt.
    assert len(picks["right"]) == 3 and len(picks["wrong"]) == 3
    for _, line in picks["lines"]:
        marked = re.search(r"<<(.*?)>>", line).group(1)
        assert line.replace("<<", "").replace(">>", "").startswith("held") and " pos" in line.replace(f"<<{marked}>>", marked)
    row = labels(tmp_path)[1]
    # 3 of 3 right marks found, 1 of 3 wrong marks taken for right: (1 + 2/3) / 2.
    assert row["fuzz_score"] == pytest.approx(5 / 6)
    truth = [i in picks["right"] for i, _ in picks["lines"]]
    said = [i in picks["right"] + picks["wrong"][:1] for i, _ in picks["lines"]]
    assert row["fuzz_score"] == pytest.approx(detection_scores(truth, said).balanced_accuracy)
    assert row["label_score"] == 1.0 and row["label_source"] == "llm:judge"
    assert result["requests"] == 3  # label, detection, fuzzing


def test_the_offline_label_is_kept_when_it_scores_higher(tmp_path):
    write_fixture(tmp_path, [WERE_AFTER_IF])

    def says_everything_fits(body, index):
        if is_detection(body):
            return json_reply({"matches": [i for i, _ in numbered_lines(user_text(body))]})
        return json_reply({"coherent": True, "description": "verbs"})

    with FakeOpenAI(says_everything_fits) as server:
        run_label(llm_cfg(tmp_path, server))
    row = labels(tmp_path)[10]
    assert (row["label"], row["label_source"], row["label_score"]) == ("'were' after 'if'", "heuristic", 1.0)
    assert "scored higher than llm:judge's (detection 1.00 vs 0.50): verbs" in row["label_reason"]


def test_token_budget_stops_sending_and_says_why(tmp_path):
    write_fixture(tmp_path, [simple_latent(k) for k in (1, 2, 3)])
    # Each scripted reply costs 15 tokens: the budget allows two requests of the six needed.
    with FakeOpenAI(smart) as server:
        result = run_label(llm_cfg(tmp_path, server, concurrency=1, max_tokens_total=30))
    assert len(server.requests) == 2 and result["requests"] == 2
    # Refused: latent 3's label (so its detection is never asked) and the detections of 1 and 2.
    assert result["budget_exhausted"] is True and result["budget_refused"] == 3
    rows = labels(tmp_path)
    # Every latent misses at least one request, and says so.
    assert all("label.max_tokens_total=30" in r["label_reason"] for r in rows.values())
    # 1 and 2 got an LLM label but no judgement of it: unvalidated, it does not replace the offline one.
    for latent in (1, 2):
        assert rows[latent]["label_source"] == "heuristic" and rows[latent]["label_score"] is not None
        assert (
            rows[latent]["label_reason"].startswith("llm:judge's label was not validated (validation failed: ")
            and "words tagged ctx" in rows[latent]["label_reason"]
        )
    # Latent 3 got no LLM label: it keeps the offline one, scored by its own rule.
    assert rows[3]["label_source"] == "heuristic" and "'alpha'" in rows[3]["label"] and rows[3]["label_score"] is not None
    assert result["labels_failed"] == 0  # refused for the budget, which is no failure of the endpoint

    with FakeOpenAI(smart) as server:  # no budget: the two answers already paid for are reused
        result = run_label(llm_cfg(tmp_path, server))
    assert result["cache_hits"] == 2 and len(server.requests) == 4 and result["budget_exhausted"] is False
    assert all(r["label_reason"] is None and r["label_score"] == 1.0 for r in labels(tmp_path).values())


def test_second_run_is_served_entirely_from_the_cache(tmp_path):
    contrast = [("plain", " alpha", " again")]
    write_fixture(tmp_path, [fuzzable_latent(1, contrast=contrast), fuzzable_latent(2)])
    with FakeOpenAI(fuzz_aware) as server:
        cfg = llm_cfg(tmp_path, server, fuzz_examples=6)
        first = run_label(cfg)
        before = pq.read_table(RunLayout(tmp_path).labels)
        second = run_label(cfg)
    assert first["requests"] == 6 and len(server.requests) == 6  # label, detection, fuzzing per latent
    assert second["requests"] == 0 and second["cache_hits"] == 6 and second["prompt_tokens"] == 0
    assert pq.read_table(RunLayout(tmp_path).labels).equals(before)
    assert all(r["fuzz_score"] == 1.0 for r in labels(tmp_path).values())
    cached = [json.loads(p.read_text()) for p in RunLayout(tmp_path).label_cache.glob("*.json")]
    assert sorted(c["kind"] for c in cached) == ["detect", "detect", "fuzz", "fuzz", "label", "label"]


def test_llm_labeling_shows_a_progress_bar_over_its_latents(tmp_path, capsys, monkeypatch):
    from bbox_sae.labeling import llm

    # Every frame drawn (tqdm draws at most ten a second), so that each latent's step is seen.
    monkeypatch.setattr(llm, "tqdm", functools.partial(llm.tqdm, mininterval=0, miniters=1))
    write_fixture(tmp_path, [simple_latent(k) for k in (1, 2, 3)])
    with FakeOpenAI(smart) as server:
        run_label(llm_cfg(tmp_path, server, concurrency=1))
    err = capsys.readouterr().err
    # On stderr like every stage's bar: one step per latent whose label and scoring are done.
    frames = [f for f in re.split(r"[\r\n]", err) if f.startswith("label: latents (judge)")]
    assert [re.search(r"\| (\d)/3 \[", f).group(1) for f in frames] == ["0", "1", "2", "3"], err
