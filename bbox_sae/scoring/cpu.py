"""Causal attention by query blocks, for scoring on a CPU (numbers: benchmarks/RESULTS.md, issue 58).

PyTorch's CPU attention kernel meets every query with every key of the window and masks the later
half away. Cut into blocks of `QUERY_BLOCK` queries, each block meets only the keys up to its last
query: 56% of the work at the demo's 512-token windows. Only the order of sums changes (over the
whole demo, per word at most 3.8e-5 nats).
"""

from __future__ import annotations

import functools

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

QUERY_BLOCK = 64
ATTENTION = "bbox_causal_query_blocks"


def causal_attention_by_query_blocks(module, query, key, value, attention_mask, **kwargs):
    """Transformers' SDPA attention, one block of queries at a time, each against the keys up to
    its last query; the model's own mask (padding, sliding windows) is sliced, never rebuilt."""
    length = query.shape[2]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    # Decoding with a cache, or an attention that is not causal: the keys past a query count.
    if length <= QUERY_BLOCK or key.shape[2] != length or not causal:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    blocks = []
    for begin in range(0, length, QUERY_BLOCK):
        end = min(length, begin + QUERY_BLOCK)
        if attention_mask is None:
            # Transformers leaves the mask out where it is plainly causal (no padding, no window).
            mask = torch.ones(end - begin, end, dtype=torch.bool, device=query.device).tril(begin)
        else:
            mask = attention_mask[..., begin:end, :end]
        out, _ = sdpa_attention_forward(module, query[:, :, begin:end], key[:, :, :end], value[:, :, :end], mask, **kwargs)
        blocks.append(out)  # (batch, queries, heads, head_dim)
    return torch.cat(blocks, dim=1), None


@functools.cache
def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, causal_attention_by_query_blocks)
    # The masks are SDPA's: the blocks slice them.
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def use_causal_query_blocks(model) -> None:
    """Switch a model that attends with SDPA to the blocked attention; others (eager for a
    soft-capped attention, flash kernels) are left as they are."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        _register_attention()
        model.set_attn_implementation(ATTENTION)
