"""Resource bounds: scoring one very long document needs memory for a window
batch, not for the document.

Each size is scored in a fresh process (tiny SmolLM2-tokenizer model, the default window 1024 /
stride 512 / batch 8 / log-softmax chunk 256), after a warm-up on a short document; the peak
resident memory during scoring (Linux VmHWM, reset through /proc/self/clear_refs) is compared
for a document and one 10x longer. Retaining logits would cost ~200 KB per token (49k vocab),
so the per-token growth bound below catches it; what does grow with the document is the output
(token log-probs, offsets, word spans) and the Rust tokenizer's transient encoding of the whole
text (~0.5 KB/token). Default sizes are 20k vs 200k characters (the tiny model scores ~2k
tokens/s on one thread); BBOX_MEMTEST_FULL=1 runs the 100k vs 1M characters of the issue
(measured: +113 MB vs +247 MB over the loaded model, 27k vs 269k tokens).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.assets import tiny_lm_dir

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")]

MEASURE = textwrap.dedent(
    """
    import json, re, sys, torch
    import numpy as np
    torch.set_num_threads(1)
    from bbox_sae.models import load_causal_lm
    from bbox_sae.scoring.hf import HFScorer
    from bbox_sae.scoring.stage import word_logprob_rows

    def status(key):
        return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    n_chars = int(sys.argv[1])
    rng = np.random.default_rng(0)
    vocab = ["the", "ships", "were", "late,", "and", "men", "tired.", "Romeo!", "wherefore", "café", "12", "crowns", "steward", "\\n"]
    text = " ".join(rng.choice(vocab, size=n_chars // 3))[:n_chars]
    model, tok = load_causal_lm(sys.argv[2], torch.device("cpu"), torch.float32)
    scorer = HFScorer("s", model, tok, start_token="<|endoftext|>", window=1024, stride=512, batch_size=8, logprob_chunk=256)
    warm = text[:8000]  # several full window batches: the window-level buffers exist from here on
    scores = next(scorer.score([("w", warm)]))
    word_logprob_rows("w", warm, scores.offsets, scores.logprobs)
    del scores
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
    base = status("VmRSS")
    scores = next(scorer.score([("d", text)]))
    ids, idx, lp = word_logprob_rows("d", text, scores.offsets, scores.logprobs)
    assert len(lp) > 0 and np.isfinite(scores.logprobs).all()
    print(json.dumps({"chars": len(text), "tokens": len(scores.logprobs), "peak": status("VmHWM") - base}))
    """
)


def _peak(n_chars: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(n_chars), str(tiny_lm_dir("smollm2"))], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_peak_memory_grows_far_less_than_the_document():
    small_chars = 100_000 if os.environ.get("BBOX_MEMTEST_FULL") else 20_000
    small, big = _peak(small_chars), _peak(10 * small_chars)
    assert big["chars"] == 10 * small["chars"] and big["tokens"] > 9 * small["tokens"]
    print(f"peak over the loaded model: {small} vs {big}")
    # A document 10x longer: far less than 10x the peak.
    assert big["peak"] < 3 * max(small["peak"], 32 << 20), (small, big)
    # What grows is bounded per token (retained logits alone would be ~200 KB/token).
    growth = (big["peak"] - small["peak"]) / (big["tokens"] - small["tokens"])
    assert growth < 1500, f"{growth:.0f} bytes per extra token: {small} vs {big}"
