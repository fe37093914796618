"""The LLM labeler end to end against a real OpenAI-compatible server: llama-cpp-python's, serving
the packaged SmolLM2-135M-Instruct (`make llamacpp`). Label quality is not asserted (a 135M model
labels badly); the protocol is: chat requests in JSON mode, replies parsed or retried, every request
accounted for, scores in range, and a re-run served from the cache."""

import importlib.util

import pytest
from test_labeling import COMMA_BEFORE_NAME, NEWLINE_RUNS, WERE_AFTER_IF, fixture_negatives, labels, make_cfg, write_fixture  # noqa: F401
from test_llamacpp import gguf, server  # noqa: F401  (the llama_cpp.server fixture)

from bbox_sae.labeling import run_label
from bbox_sae.layout import RunLayout

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed (make llamacpp)"),
]


def test_labels_features_through_a_real_openai_compatible_server(server, tmp_path):  # noqa: F811
    write_fixture(tmp_path, [WERE_AFTER_IF, COMMA_BEFORE_NAME, NEWLINE_RUNS])
    cfg = make_cfg(
        tmp_path,
        labeler="llm",
        base_url=f"{server}/v1",
        model="SmolLM2-135M-Instruct",
        api_key_env="BBOX_TEST_UNSET_KEY",
        concurrency=1,
        max_retries=2,
        timeout_s=300,
        examples=5,
        fuzz_examples=2,
        contrast_examples=2,
    )
    first = run_label(cfg)
    answered = len(list(RunLayout(tmp_path).label_cache.glob("*.json")))
    # Every request either got a parsed answer (cached at once), was retried, or failed for good.
    assert first["requests"] == answered + first["retries"] + first["failures"] >= 3
    assert first["prompt_tokens"] > 0 and first["completion_tokens"] > 0
    rows = labels(tmp_path)
    assert set(rows) == {10, 11, 12}
    for r in rows.values():
        assert r["label_source"] in {"llm:SmolLM2-135M-Instruct", "heuristic", "unlabeled"}
        if r["label_source"] == "unlabeled":
            assert r["label"] is None and "attempt" in r["label_reason"]
            continue
        assert r["label"].strip()
        for score in ("label_score", "fuzz_score"):
            assert r[score] is None or 0.0 <= r[score] <= 1.0

    second = run_label(cfg)
    assert second["cache_hits"] == answered  # every answer paid for once is reused
    assert second["requests"] == second["retries"] + second["failures"] + len(list(RunLayout(tmp_path).label_cache.glob("*.json"))) - answered
