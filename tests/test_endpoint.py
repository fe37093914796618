"""EndpointScorer against a vLLM-shaped server backed by the local scorer (tests/helpers/fake_vllm.py)."""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.config import ModelConfig
from bbox_sae.errors import ConfigError, EndpointError
from bbox_sae.models import load_causal_lm
from bbox_sae.scoring.base import plan_windows
from bbox_sae.scoring.endpoint import EndpointScorer
from bbox_sae.scoring.hf import HFScorer
from bbox_sae.scoring.stage import merge, word_logprob_rows
from helpers.assets import REPO, tiny_lm_dir
from helpers.fake_vllm import Backend, FakeVLLM
from helpers.project import Project, make_project
from helpers.stages import score

KINDS = ["smollm2", "gemma"]
START = {"smollm2": "<|endoftext|>", "gemma": None}
WINDOW, STRIDE = 32, 16
DOCS = [
    ("plain", "The quick brown fox jumps over the lazy dog."),
    ("unicode", "Ünïcödé — naïve café, 東京タワー 🙂 and e\u0301 combining.\n\nNew  paragraph\twith tabs."),
    ("long", " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(40))),
]


@functools.cache
def lm(kind):
    """One model and tokenizer per kind for the whole module: the Gemma tokenizer takes seconds to load."""
    return load_causal_lm(str(tiny_lm_dir(kind)), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def backends():
    return {kind: Backend(*lm(kind)) for kind in KINDS}


def local_scores(kind, docs):
    """batch_size 1 runs each window alone, as the server does."""
    local = HFScorer(kind, *lm(kind), start_token=START[kind], window=WINDOW, stride=STRIDE, batch_size=1)
    return {s.doc_id: s for s in local.score(docs)}


@pytest.fixture(scope="module")
def reference():
    return {kind: local_scores(kind, DOCS + TEXT_DOCS[1:2]) for kind in KINDS}


def make_scorer(kind, urls, **kw):
    kw = {"served_model": "tiny", "start_token": START[kind], "window": WINDOW, "stride": STRIDE, "backoff_base_s": 0.01, **kw}
    model = ModelConfig(name=kind, source="endpoint", endpoints=urls, tokenizer=str(tiny_lm_dir(kind)), **kw)
    return EndpointScorer(model, lm(kind)[1])


def n_windows(kind, docs):
    tok = lm(kind)[1]
    return sum(len(plan_windows(len(tok(text, add_special_tokens=False)["input_ids"]), WINDOW, STRIDE)) for _, text in docs)


def assert_same_as_local(ref, got, docs=DOCS):
    assert [s.doc_id for s in got] == [d for d, _ in docs]
    for (doc_id, text), s in zip(docs, got):
        r = ref[doc_id]
        np.testing.assert_array_equal(s.offsets, r.offsets)
        np.testing.assert_array_equal(s.token_ids, r.token_ids)
        np.testing.assert_allclose(s.logprobs, r.logprobs, atol=1e-5, rtol=0)
        words_remote = word_logprob_rows(doc_id, text, s.offsets, s.logprobs)[2]
        words_local = word_logprob_rows(doc_id, text, r.offsets, r.logprobs)[2]
        np.testing.assert_allclose(words_remote, words_local, atol=1e-5, rtol=0)


# Text prompts cannot start a window inside a character (see the test below), so the long
# document of the text mode is ASCII.
TEXT_DOCS = [DOCS[0], ("unicode-short", "Ünïcödé — naïve café 🙂"), DOCS[2]]
MODES = {"echo": {}, "echo+1": {"max_tokens": 1}, "prompt_logprobs": {"prompt_logprobs": True}, "text": {"prompt_format": "text", "max_tokens": 1}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_remote_scores_equal_local_scores(backends, reference, kind, mode):
    docs = TEXT_DOCS if mode == "text" else DOCS
    with FakeVLLM(backends[kind]) as srv:
        scorer = make_scorer(kind, [srv.url], **MODES[mode])
        got = list(scorer.score(docs))
    assert_same_as_local(reference[kind], got, docs)
    # every window went out once, the long document as several
    assert len(srv.requests) == n_windows(kind, docs) > len(docs)
    if mode != "text":
        start_id = scorer.start_id
        assert sum(r["prompt"][0] == start_id for r in srv.requests) == len(DOCS)
        assert max(len(r["prompt"]) for r in srv.requests) == WINDOW
    assert scorer.retries == scorer.failures == 0


def test_transient_faults_are_retried_and_numbers_unchanged(backends, reference):
    with FakeVLLM(backends["smollm2"]) as srv:
        srv.slow_s = 3.0
        srv.faults = ["429", "503", "drop", "slow", "malformed"]
        scorer = make_scorer("smollm2", [srv.url], timeout_s=1.0, concurrency=4)
        got = list(scorer.score(DOCS))
    assert_same_as_local(reference["smollm2"], got)
    assert scorer.retries == 5 and scorer.failures == 0
    assert len(srv.requests) == n_windows("smollm2", DOCS) + 5
    # the request answered 429 came back no sooner than its Retry-After (1 s)
    again = next(i for i in range(1, len(srv.requests)) if srv.requests[i]["prompt"] == srv.requests[0]["prompt"])
    assert srv.arrivals[again] - srv.arrivals[0] >= 0.95


@pytest.mark.parametrize("fault, message", [("503", "HTTP 503"), ("drop", "connection failed"), ("slow", "no answer within"), ("malformed", "malformed JSON")])
def test_exhausted_retries_name_the_document_and_the_last_error(backends, fault, message):
    with FakeVLLM(backends["smollm2"]) as srv:
        srv.always, srv.slow_s = fault, 2.0
        scorer = make_scorer("smollm2", [srv.url], max_retries=2, timeout_s=0.3)
        with pytest.raises(EndpointError, match=rf"document 'doc-x'.*3 attempt.*{message}"):
            list(scorer.score([("doc-x", "Some text to score.")]))
    assert len(srv.requests) == 3
    assert scorer.retries == 2 and scorer.failures == 1


def test_client_errors_are_not_retried(backends):
    with FakeVLLM(backends["smollm2"]) as srv:
        srv.always = "400"
        scorer = make_scorer("smollm2", [srv.url])
        with pytest.raises(EndpointError, match=r"document 'd1'.*HTTP 400.*Only no echo is supported"):
            list(scorer.score([("d1", "Some text.")]))
        assert len(srv.requests) == 1 and scorer.retries == 0
        srv.always = None
        with pytest.raises(EndpointError, match=r"document 'd2'.*HTTP 404.*does not exist"):
            list(make_scorer("smollm2", [srv.url], served_model="other").score([("d2", "Some text.")]))


@pytest.mark.parametrize("fault, mode", [("drop_first", {}), ("drop_first", {"prompt_format": "text"}), ("wrong_id", {"prompt_logprobs": True})])
def test_answers_that_do_not_align_fail_loudly(backends, fault, mode):
    with FakeVLLM(backends["smollm2"]) as srv:
        srv.always = fault
        scorer = make_scorer("smollm2", [srv.url], **mode)
        with pytest.raises(EndpointError, match=r"document 'odd'.*cannot be aligned"):
            list(scorer.score([("odd", "A document the server answers oddly.")]))
    assert scorer.retries == 0 and scorer.failures == 1


def test_text_mode_rejects_a_server_that_tokenizes_differently(backends):
    # The gemma server tokenizes the text its own way, so its tokens cannot be ours.
    with FakeVLLM(backends["gemma"]) as srv:
        scorer = make_scorer("smollm2", [srv.url], prompt_format="text")
        with pytest.raises(EndpointError, match=r"document 'plain'.*cannot be aligned"):
            list(scorer.score(DOCS[:1]))


def test_text_mode_refuses_a_window_that_starts_inside_a_character(backends):
    with FakeVLLM(backends["smollm2"]) as srv:
        scorer = make_scorer("smollm2", [srv.url], prompt_format="text")
        with pytest.raises(EndpointError, match=r"document 'unicode'.*inside a character.*prompt_format: tokens"):
            list(scorer.score(DOCS[1:2]))


def test_vllm_floor_reads_as_minus_infinity(backends):
    with FakeVLLM(backends["smollm2"]) as srv:
        srv.always = "floor"
        (s,) = make_scorer("smollm2", [srv.url]).score([("d", "Hello there")])
    assert len(s.logprobs) and np.all(s.logprobs == -np.inf)


def test_replicas_share_the_load_within_the_concurrency_limit(backends, reference):
    docs = [(f"d{i}", f"Document {i} is short but not empty.") for i in range(16)]
    ref = local_scores("smollm2", docs)
    with FakeVLLM(backends["smollm2"], delay_s=0.05) as a, FakeVLLM(backends["smollm2"], delay_s=0.05) as b:
        scorer = make_scorer("smollm2", [a.url, b.url], concurrency=2)
        got = list(scorer.score(docs))
    assert_same_as_local(ref, got, docs)
    assert len(a.requests) >= 4 and len(b.requests) >= 4 and len(a.requests) + len(b.requests) == 16
    assert max(a.max_in_flight, b.max_in_flight) == 2


def test_a_dead_replica_is_routed_around(backends, reference):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with FakeVLLM(backends["smollm2"]) as srv:
        scorer = make_scorer("smollm2", [dead, srv.url], max_retries=2)
        got = list(scorer.score(DOCS))
    assert_same_as_local(reference["smollm2"], got)
    assert scorer.retries >= 1 and scorer.failures == 0


# -- config and the score stage ------------------------------------------------------------------
# Two endpoint models ("a", "b"), each on its own smollm2 server, so requests count per model.


def endpoint_project(tmp_path, servers, out="run", **model_kw) -> Project:
    """The documents above and five more, each model served by its server; the run in `tmp_path/out`."""
    texts = [text for _, text in DOCS] + [f"Extra document {i}: café, naïve, 東京 {i}." for i in range(5)]
    models = [
        {
            "name": name,
            "source": "endpoint",
            "endpoints": [url],
            "tokenizer": str(tiny_lm_dir("smollm2")),
            "served_model": "tiny",
            "start_token": START["smollm2"],
            "window": WINDOW,
            "stride": STRIDE,
            "backoff_base_s": 0.01,
            "timeout_s": 10.0,
            **model_kw,
        }
        for name, url in servers.items()
    ]
    docs = {f"doc{i}": t for i, t in enumerate(texts)}
    return make_project(tmp_path, docs=docs, models=models, output_dir=str(tmp_path / out), config_name=f"{out}.yaml")


def test_api_key_comes_from_the_environment(backends, tmp_path, monkeypatch):
    with FakeVLLM(backends["smollm2"], api_key="s3cret") as srv:
        cfg = endpoint_project(tmp_path, {"a": srv.url, "b": srv.url}, api_key_env="BBOX_TEST_KEY").load()
        monkeypatch.delenv("BBOX_TEST_KEY", raising=False)
        with pytest.raises(ConfigError, match="BBOX_TEST_KEY"):
            EndpointScorer.from_config(cfg.models[0], cfg)
        monkeypatch.setenv("BBOX_TEST_KEY", "wrong")
        with pytest.raises(EndpointError, match="HTTP 401"):
            list(EndpointScorer.from_config(cfg.models[0], cfg).score(DOCS[:1]))
        monkeypatch.setenv("BBOX_TEST_KEY", "s3cret")
        assert len(list(EndpointScorer.from_config(cfg.models[0], cfg).score(DOCS[:1]))) == 1
    with pytest.raises(ConfigError, match="needs `tokenizer`"):
        endpoint_project(tmp_path, {"a": srv.url, "b": srv.url}, tokenizer=None).load()


def logprob_tables(cfg):
    return {m.name: read_table(cfg.paths.logprobs(m.name)).sort_by([("doc_id", "ascending"), ("word_idx", "ascending")]).to_pydict() for m in cfg.models}


def test_sharded_workers_fill_one_output_and_report_throughput(backends, tmp_path, capsys):
    with FakeVLLM(backends["smollm2"]) as a, FakeVLLM(backends["smollm2"]) as b:
        servers = {"a": a.url, "b": b.url}
        cfg = endpoint_project(tmp_path, servers).load()
        a.faults = ["503"]
        first = score(cfg, shard="0/2")
        second = score(cfg, shard="1/2")
        merge(cfg)
        whole = endpoint_project(tmp_path, servers, out="whole").load()
        score(whole)
    assert logprob_tables(cfg) == logprob_tables(whole)
    for name in servers:
        assert first[name]["documents"] + second[name]["documents"] == 8
        assert first[name]["tokens"] > 0 and first[name]["tokens_per_s"] > 0
    assert first["a"]["retries"] == 1 and first["a"]["failures"] == 0
    assert json.loads(cfg.paths.score_stats(0, 2).read_text()) == first
    err = capsys.readouterr().err
    assert f"score a: {first['a']['documents']} documents, {first['a']['tokens']} tokens in" in err
    assert "tokens/s), 1 retries, 0 failures" in err


def test_a_killed_worker_resumes_without_redoing_finished_shards(backends, tmp_path):
    with FakeVLLM(backends["smollm2"], delay_s=0.3) as a, FakeVLLM(backends["smollm2"], delay_s=0.3) as b:
        servers = {"a": a.url, "b": b.url}
        project = endpoint_project(tmp_path, servers, concurrency=1)
        cfg = project.load()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        worker = subprocess.Popen(
            [sys.executable, "-m", "bbox_sae", "score", "-c", str(project.config), "--shard", "0/2"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        a_shard, b_shard = (ShardedTable(cfg.paths.logprobs(m)).shard_path(0) for m in ("a", "b"))
        done = a_shard.with_suffix(".json")  # the sidecar, written once the shard is
        deadline = time.monotonic() + 60
        while not done.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert done.exists(), worker.stderr.read().decode()[-2000:]
        assert not b_shard.with_suffix(".json").exists()
        finished = a_shard
        mtime = finished.stat().st_mtime_ns
        a.delay_s = b.delay_s = 0.0
        before = {"a": len(a.requests), "b": len(b.requests)}
        score(cfg, shard="0/2")
        # worker 0 owns shards 0 and 2 (documents 0-1 and 4-5); only a's shard 0 was finished
        docs = read_table(cfg.paths.documents)
        pairs = list(zip(docs["doc_id"].to_pylist(), docs["text"].to_pylist()))
        assert len(a.requests) - before["a"] == n_windows("smollm2", pairs[4:6])
        assert len(b.requests) - before["b"] == n_windows("smollm2", pairs[0:2] + pairs[4:6])
        assert finished.stat().st_mtime_ns == mtime
        score(cfg, shard="1/2")
        merge(cfg)
        whole = endpoint_project(tmp_path, servers, out="whole").load()
        score(whole)
    assert logprob_tables(cfg) == logprob_tables(whole)
