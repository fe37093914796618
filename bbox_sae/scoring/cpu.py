"""Causal attention by query blocks, for scoring on a CPU (numbers: benchmarks/RESULTS.md, issue 58).

PyTorch's CPU attention kernel meets every query with every key of the window and masks the later
half away. Cut into blocks of `QUERY_BLOCK` queries, each block meets only the keys up to its last
query: 56% of the work at the demo's 512-token windows. Only the order of sums changes (over the
whole demo, per word at most 3.8e-5 nats).

Two more things the kernel is faster with, both measured at SmolLM2's shapes (4 windows of 512
tokens, 9 query heads on 3 key/value heads: 25-27 ms a layer before, 16-17 after):
- an additive float mask, built once per forward pass (`eager_mask`), rather than a boolean one
  the kernel converts at every call of every layer;
- grouped-query attention inside the kernel (`enable_gqa`), rather than each block copying its
  keys and values once per query head that shares them (transformers' `repeat_kv`).
"""

from __future__ import annotations

import functools

import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward

QUERY_BLOCK = 64
ATTENTION = "bbox_causal_query_blocks"


def causal_attention_by_query_blocks(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """SDPA, one block of queries at a time, each against the keys up to its last query; the
    model's own mask (padding, sliding windows) is sliced, never rebuilt."""
    length = query.shape[2]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    # Decoding with a cache, an attention that is not causal, or one SDPA cannot run (a soft cap;
    # transformers says why): the keys past a query count, or its own checks should speak.
    if length <= QUERY_BLOCK or key.shape[2] != length or not causal or attention_mask is None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    grouped = query.shape[1] != key.shape[1]
    blocks = []
    for begin in range(0, length, QUERY_BLOCK):
        end = min(length, begin + QUERY_BLOCK)
        blocks.append(
            scaled_dot_product_attention(
                query[:, :, begin:end], key[:, :, :end], value[:, :, :end], attn_mask=attention_mask[..., begin:end, :end], scale=scaling, enable_gqa=grouped
            )
        )
    return torch.cat(blocks, dim=2).transpose(1, 2).contiguous(), None  # (batch, queries, heads, head_dim)


@functools.cache
def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION, causal_attention_by_query_blocks)
    # Always a mask, even where the attention is plainly causal (SDPA's masks leave it out then),
    # and additive, in the model's dtype: the blocks slice it.
    AttentionMaskInterface.register(ATTENTION, eager_mask)


def use_causal_query_blocks(model) -> None:
    """Switch a model that attends with SDPA to the blocked attention; others (eager for a
    soft-capped attention, flash kernels) are left as they are."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        _register_attention()
        model.set_attn_implementation(ATTENTION)
