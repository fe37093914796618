import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbox_sae.corpus.words import word_spans
from bbox_sae.scoring.align import align_logprobs
from bbox_sae.scoring.base import plan_windows
from bbox_sae.scoring.hf import HFScorer
from helpers.project import make_project
from helpers.repo import load_script


@functools.cache
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_tiny(path: str):
    """A fresh fp32 model (tests change models) with its tokenizer read once per path: parsing Gemma's
    262k-entry tokenizer.json takes ~3.6 s, and these tests load a model a dozen times."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), _tokenizer(path)


KINDS = ["smollm2", "gemma", "minilm"]
START = {"smollm2": "<|endoftext|>", "gemma": None, "minilm": "[CLS]"}
PIECES = st.sampled_from(
    ["Hello", " world", "  ", "\t", "\r\n", "\n\n", "日本語", "🙂", "e\u0301", "café", "'s", " 12", "--", "!?", " If you were", "\u00a0", "Ω"]
)
TEXT = st.one_of(st.text(min_size=1, max_size=60), st.lists(PIECES, min_size=1, max_size=25).map("".join)).filter(lambda t: t.strip())


@pytest.fixture(scope="module")
def scorers(tiny_lm):
    out = {}
    for kind in KINDS:
        model, tok = load_tiny(str(tiny_lm(kind)))
        out[kind] = HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, batch_size=3)
    return out


@given(n=st.integers(0, 300), window=st.integers(2, 40), stride=st.integers(1, 39))
@settings(max_examples=300, deadline=None)
def test_windows_score_each_token_once_with_enough_context(n, window, stride):
    if stride >= window:
        return
    targets = []
    for w in plan_windows(n, window, stride):
        assert w.end - w.begin <= window
        for t in range(w.first_target, w.end):
            targets.append(t)
            assert t - w.begin >= min(window - stride, t)  # real left context (all of it near the start)
    assert targets == list(range(1, n + 1))


@pytest.mark.parametrize("kind", KINDS)
@given(text=TEXT)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_word_logprobs_sum_to_token_logprobs(scorers, kind, text):
    scores = next(scorers[kind].score([("d", text)]))
    words = align_logprobs(scores.offsets, scores.logprobs, word_spans(text))
    assert len(scores.logprobs) == len(scores.token_ids)
    assert np.isfinite(scores.logprobs).all()
    assert np.isclose(words.sum(), scores.logprobs.sum(), rtol=1e-9, atol=1e-6)


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
def test_sliding_windows_equal_one_window_when_it_covers_the_document(tiny_lm, kind):
    model, tok = load_tiny(str(tiny_lm(kind)))
    text = "Were I to say it, if you were there, 12 men would go.\nThen again: 日本語 and café."
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    one = HFScorer(kind, model, tok, start_token=START[kind], window=n + 1, stride=1)
    big = HFScorer(kind, model, tok, start_token=START[kind], window=4 * n, stride=n)
    a, b = next(one.score([("d", text)])), next(big.score([("d", text)]))
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_batching_and_padding_do_not_change_scores(tiny_lm):
    model, tok = load_tiny(str(tiny_lm("smollm2")))
    docs = [("a", "Short one."), ("b", "A rather longer document, " * 12), ("c", "Mid length text here, ok?")]
    batched = HFScorer("s", model, tok, start_token="<|endoftext|>", window=32, stride=16, batch_size=8)
    single = HFScorer("s", model, tok, start_token="<|endoftext|>", window=32, stride=16, batch_size=1)
    for x, y in zip(batched.score(docs), single.score(docs)):
        assert x.doc_id == y.doc_id
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)


def test_first_token_is_conditioned_on_the_start_token(tiny_lm):
    model, tok = load_tiny(str(tiny_lm("gemma")))
    scorer = HFScorer("g", model, tok, window=64, stride=32)
    text = "Hello there"
    scores = next(scorer.score([("d", text)]))
    ids = torch.tensor([[tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"]]])
    with torch.inference_mode():
        ref = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
    np.testing.assert_allclose(scores.logprobs, ref.numpy(), atol=1e-4)


def test_start_token_falls_back_to_eos_and_can_be_overridden(tokenizers):
    from bbox_sae.errors import ConfigError
    from bbox_sae.scoring.hf import start_token_id

    tok = tokenizers["smollm2"]
    assert start_token_id(tok, None) == tok.bos_token_id
    assert start_token_id(tok, "<|endoftext|>") == tok.convert_tokens_to_ids("<|endoftext|>")
    with pytest.raises(ConfigError, match="neither BOS nor EOS"):
        start_token_id(tokenizers["minilm"], None)


def _words(scorer, docs):
    return np.concatenate([align_logprobs(s.offsets, s.logprobs, word_spans(t)) for (_, t), s in zip(docs, scorer.score(docs))])


DOCS = [("a", "Were I to say it, if you were there, 12 men would go."), ("b", "Then again: 日本語 and café. " * 6)]


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
def test_fp32_heads_agree_with_the_models_own_head(tiny_lm, kind):
    """Without a precision change every head computes the same log-softmax."""
    ref = None
    for head in ("model", "float32", "refined"):
        model, tok = load_tiny(str(tiny_lm(kind)))
        words = _words(HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, head=head), DOCS)
        if ref is None:
            ref = words
        np.testing.assert_allclose(words, ref, atol=1e-4)


@pytest.mark.parametrize("head", ["float32", "refined"])
def test_streamed_heads_add_an_output_layers_bias(tiny_lm, head):
    """A biased output layer (as some causal LMs have) scores through the streamed heads too."""
    model, tok = load_tiny(str(tiny_lm("smollm2")))
    ref = _words(HFScorer("smollm2", model, tok, start_token=START["smollm2"], window=24, stride=8), DOCS)
    model, tok = load_tiny(str(tiny_lm("smollm2")))
    torch.manual_seed(0)
    model.get_output_embeddings().bias = torch.nn.Parameter(3 * torch.randn(model.config.vocab_size))
    biased = _words(HFScorer("smollm2", model, tok, start_token=START["smollm2"], window=24, stride=8), DOCS)
    # Its construction checks its head against the model's own logits, bias included.
    words = _words(HFScorer("smollm2", model, tok, start_token=START["smollm2"], window=24, stride=8, head=head, bf16_matmuls=head == "refined"), DOCS)
    assert np.abs(biased - ref).max() > 0.1
    np.testing.assert_allclose(words, biased, atol=1e-4 if head == "float32" else 0.05)


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
def test_refined_head_recovers_the_precision_a_bf16_head_loses(tiny_lm, kind):
    model, tok = load_tiny(str(tiny_lm(kind)))
    ref = _words(HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8), DOCS)
    err = {}
    for head in ("model", "refined", "float32"):
        model, tok = load_tiny(str(tiny_lm(kind)))
        scorer = HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, dtype=torch.bfloat16, head=head)
        assert next(model.parameters()).dtype == torch.bfloat16
        words = _words(scorer, DOCS)
        assert np.isfinite(words).all() and (words <= 1e-6).all()
        err[head] = np.abs(words - ref)
    # Same bf16 body: only the head differs, and the refined head is as good as an fp32 one.
    assert np.median(err["refined"]) <= np.median(err["model"])
    np.testing.assert_allclose(np.median(err["refined"]), np.median(err["float32"]), atol=0.01)


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
@pytest.mark.parametrize("head", ["float32", "refined"])
def test_streamed_heads_are_as_accurate_as_one_log_softmax_over_the_whole_vocabulary(tiny_lm, kind, head, monkeypatch):
    from bbox_sae.scoring import hf

    # The one-pass head the streamed one replaced, as the precision benchmark measures it.
    unstreamed_refined_logprobs = load_script("benchmarks/bench_precision.py").unstreamed_refined_logprobs

    model, tok = load_tiny(str(tiny_lm(kind)))
    scorer = HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, dtype=torch.bfloat16, head=head)
    torch.manual_seed(0)
    hidden = torch.randn(12, model.config.hidden_size)
    exact_logits = torch.nn.functional.linear(hidden.double(), scorer._head_weight.double())
    vocab = exact_logits.shape[1]
    # Half the targets are each row's most likely token (inside the refined set), half random.
    targets = torch.where(torch.arange(12) % 2 == 0, exact_logits.argmax(-1), torch.randint(0, vocab, (12,)))
    with torch.inference_mode():
        for block, refine_top, softcap in [(8192, 32, None), (1000, 1, None), (vocab + 7, 40, None), (777, 8, 30.0)]:
            monkeypatch.setattr(hf, "VOCAB_BLOCK", block)
            scorer.refine_top, scorer._softcap = refine_top, softcap
            streamed = scorer._target_logprobs(hidden, targets)[0].double()
            exact = torch.log_softmax(scorer._cap(exact_logits), -1).gather(1, targets[:, None])[:, 0]
            if head == "float32":
                np.testing.assert_allclose(streamed.numpy(), exact.numpy(), atol=1e-4, rtol=0)
                continue
            full = unstreamed_refined_logprobs(scorer, hidden, targets).double()
            # bf16 logits tie often: which tied logit joins the refined set may differ, nothing more.
            np.testing.assert_allclose(streamed.numpy(), full.numpy(), atol=1e-3, rtol=0)
            assert (streamed - exact).abs().max() <= (full - exact).abs().max() + 1e-4


def test_precision_is_resolved_per_device_and_part_of_the_cache_key(monkeypatch):
    from bbox_sae import models
    from bbox_sae.config import ModelConfig
    from bbox_sae.models import resolve_dtype, resolve_head, resolve_scoring_dtype
    from bbox_sae.scoring import precision
    from bbox_sae.scoring.stage import model_key

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert resolve_scoring_dtype("auto", cuda) == "bfloat16" and resolve_head("auto", cuda, "bfloat16") == "model"
    assert resolve_scoring_dtype("auto", cpu) == "mixed" and resolve_head("auto", cpu, "mixed") == "refined"
    assert resolve_head("auto", cpu, "bfloat16") == "refined" and resolve_head("auto", cpu, "float32") == "float32"
    assert resolve_scoring_dtype("float32", cpu) == "float32" and resolve_head("float32", cuda, "bfloat16") == "float32"
    assert resolve_dtype("auto", cpu) == torch.float32  # encoders keep fp32 on a CPU
    base = ModelConfig(name="m", path="x")
    updates = ({}, {"head": "float32"}, {"head": "refined", "refine_top": 8}, {"dtype": "float32"}, {"dtype": "mixed"})
    keys = {model_key(base.model_copy(update=u)) for u in updates}
    assert len(keys) == 5  # scores of another precision are never taken for these
    # What `auto` resolves to is part of its key: a new default re-scores instead of reusing.
    auto, explicit = model_key(base), model_key(base.model_copy(update={"dtype": "float32"}))
    monkeypatch.setitem(models.SCORING_DTYPE_AUTO, "cpu", "float32")
    assert model_key(base) != auto and model_key(base.model_copy(update={"dtype": "float32"})) == explicit
    # A CPU that emulates bf16 (about 30x slower than fp32 there) scores `auto` in float32, under a key of its own.
    with_bf16 = model_key(base)
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: False)
    assert resolve_scoring_dtype("auto", cpu) == "float32" and resolve_head("auto", cpu, "float32") == "float32"
    assert resolve_scoring_dtype("auto", cuda) == "bfloat16" and model_key(base) != with_bf16
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    # A new rounding scheme for `mixed` or the refined head re-scores those, and only those.
    mixed, refined = base.model_copy(update={"dtype": "mixed"}), base.model_copy(update={"dtype": "bfloat16", "head": "refined"})
    configs = (base, mixed, refined, base.model_copy(update={"dtype": "float32"}))
    before = [model_key(m) for m in configs]
    monkeypatch.setattr(precision, "PRECISION_VERSION", precision.PRECISION_VERSION + 1)
    assert [model_key(m) != k for m, k in zip(configs, before)] == [True, True, True, False]


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
def test_mixed_precision_rounds_only_the_middle_layers_matmuls(tiny_lm, kind):
    from bbox_sae.scoring.precision import Bf16Linear, decoder_layers

    path = str(tiny_lm(kind, layers=4))
    model, tok = load_tiny(path)
    fp32 = HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8)
    ref = _words(fp32, DOCS)
    model, tok = load_tiny(path)
    mixed = HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, bf16_matmuls=True, head="refined")
    # What the run records (scoring stats) of how it scored: `dtype: auto` resolves by host.
    assert (fp32.precision, mixed.precision) == ("float32; head model; cpu", "mixed: bf16 matmuls, fp32 elsewhere; head refined; cpu")
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        linears = [m for m in layer.modules() if isinstance(m, (torch.nn.Linear, Bf16Linear))]
        assert linears and all(isinstance(m, Bf16Linear) == (0 < i < len(layers) - 1) for m in linears)
    swapped = {id(p) for m in model.modules() if isinstance(m, Bf16Linear) for p in m.parameters()}
    # Everything but the swapped matmuls (embeddings, norms, the head's fp32 copy) stays fp32.
    assert all(p.dtype == torch.float32 for p in model.parameters() if id(p) not in swapped)
    assert all(model.get_submodule(n).weight.dtype == torch.bfloat16 for n, m in model.named_modules() if isinstance(m, Bf16Linear))
    words = _words(mixed, DOCS)
    assert np.isfinite(words).all() and (words <= 1e-6).all()
    err = np.abs(words - ref)
    assert 0 < np.median(err) < 0.05  # bf16 rounding happened, and stayed small

    model, tok = load_tiny(path)
    bf16_scorer = HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, dtype=torch.bfloat16, head="refined")
    assert bf16_scorer.precision == "bfloat16; head refined; cpu"
    bf16 = _words(bf16_scorer, DOCS)
    assert np.median(err) < np.median(np.abs(bf16 - ref))  # a bf16 residual stream loses more


def test_mixed_precision_names_a_model_without_decoder_layers():
    from types import SimpleNamespace

    from bbox_sae.errors import ConfigError
    from bbox_sae.scoring.precision import use_bf16_matmuls

    with pytest.raises(ConfigError, match="dtype: mixed needs one"):
        use_bf16_matmuls(SimpleNamespace(base_model=torch.nn.Linear(2, 2)))


def test_auto_precision_on_a_cpu_with_native_bf16_scores_with_bf16_matmuls(tiny_lm, tmp_path, monkeypatch):
    import bbox_sae.models

    monkeypatch.setattr(bbox_sae.models, "cpu_has_native_bf16", lambda: True)

    from bbox_sae.scoring.precision import Bf16Linear
    from bbox_sae.scoring.stage import make_scorer

    models = [{"name": "a", "path": str(tiny_lm("smollm2", layers=4)), "device": "cpu"}, {"name": "b", "path": "x"}]
    cfg = make_project(tmp_path, docs=None, models=models).load()
    scorer = make_scorer(cfg.model("a"), cfg)
    assert scorer.head == "refined" and isinstance(scorer._head, Bf16Linear)
    assert sum(isinstance(m, Bf16Linear) for m in scorer.model.modules()) == 2 * 7  # 2 middle layers x q, k, v, o, gate, up, down


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
@pytest.mark.parametrize("head", ["model", "float32", "refined"])
def test_each_head_keeps_the_tokens_the_model_expected_most(tiny_lm, kind, head, monkeypatch):
    """What the report shows a model expected at a word: its likeliest tokens, most likely first,
    with their log-probs, as one log-softmax over the whole vocabulary gives them, whichever head
    scored (the streamed ones across vocabulary blocks); keeping them changes no score."""
    from bbox_sae.scoring import hf

    monkeypatch.setattr(hf, "VOCAB_BLOCK", 1000)  # several blocks, on the tiny vocabularies too
    model, tok = load_tiny(str(tiny_lm(kind)))
    plain = list(HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, head=head).score(DOCS))
    scorer = HFScorer(kind, model, tok, start_token=START[kind], window=24, stride=8, head=head, alternatives=3)
    kept = list(scorer.score(DOCS))
    for before, after in zip(plain, kept):
        np.testing.assert_array_equal(before.logprobs, after.logprobs)
        assert before.top_tokens is None and len(after.top_tokens) == len(after.logprobs) and after.top_logprobs.shape == (len(after.logprobs), 3)
        ids = [scorer.start_id, *after.token_ids.tolist()]
        with torch.inference_mode():  # the first window's targets, each seen with all of its left context
            logits = model(torch.tensor([ids[:24]])).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).topk(3, dim=-1)
        n = len(logits)
        np.testing.assert_allclose(after.top_logprobs[:n], expected.values.numpy(), atol=1e-4)
        assert after.top_tokens[:n] == [[tok.decode([int(t)]) for t in row] for row in expected.indices]
        assert (np.diff(after.top_logprobs, axis=1) <= 1e-6).all() and (after.top_logprobs[:, 0] >= after.logprobs - 1e-4).all()


@pytest.mark.parametrize("kind", ["smollm2", "gemma"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_causal_query_blocks_score_as_one_attention_over_the_window(tiny_lm, kind, batch_size, monkeypatch):
    """A CPU attends one block of queries at a time (scoring/cpu.py): with padded batches, with
    windows longer than tiny Gemma's 64-token sliding window, and with one unpadded row (where
    SDPA's own masks are left out), the scores are those of one SDPA call."""
    from bbox_sae.scoring import cpu

    monkeypatch.setattr(cpu, "QUERY_BLOCK", 16)
    docs = [("a", "Were I to say it, if you were there, 12 men would go. " * 9), ("b", "Then again: café. " * 4), ("c", "Short.")]
    model, tok = load_tiny(str(tiny_lm(kind)))
    blocked = HFScorer(kind, model, tok, start_token=START[kind], window=96, stride=32, batch_size=batch_size)
    assert model.config._attn_implementation == cpu.ATTENTION
    calls, sdpa = [], cpu.scaled_dot_product_attention

    # What each blocked SDPA call got: its queries, its mask's dtype, and whether heads share keys.
    def record(query, key, value, attn_mask, **kwargs):
        calls.append((query.shape[2], attn_mask.dtype, kwargs["enable_gqa"] == (query.shape[1] != key.shape[1])))
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(cpu, "scaled_dot_product_attention", record)
    first = list(blocked.score(docs))
    assert len(first[0].logprobs) > 96 and max(q for q, _, _ in calls) == 16  # 'a' spans windows, each attended block by block
    # Every block, padded or not, got the additive mask built once per pass, and shared keys unrepeated.
    assert {dtype for _, dtype, _ in calls} == {model.dtype} and all(gqa for _, _, gqa in calls)
    model.set_attn_implementation("sdpa")
    for x, y in zip(first, blocked.score(docs)):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
