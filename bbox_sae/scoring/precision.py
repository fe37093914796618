"""`dtype: mixed`: bf16 matmuls in the decoder's linear layers, fp32 everywhere else.

A CPU with AVX512-BF16 runs a bf16 matmul about 4.6x faster than fp32, but a model converted to
bf16 throughout also rounds its residual stream, norms and attention at every layer, and its
per-word log-probs miss the fp32 ones by more than the bound a default must meet (median 0.02,
p99 0.1 nats). Most of that error is not in the matmuls: with only the linear layers in bf16 and
the first and last decoder layer left whole in fp32 (errors there pass through every later layer,
or straight into the logits), both demo models stay within the bound at 2.1-2.5x the fp32
tokens/s (benchmarks/bench_precision.py, variants `mixed-refined` and `mixed-all-refined`).
"""

from __future__ import annotations

import torch

from bbox_sae.errors import ConfigError

# The version of the rounding of `dtype: mixed` and of the refined head (scoring/hf.py), part of the key
# of each model that uses them (scoring/stage.py `model_key`): bump it when the scores they give change,
# so that those models are scored again. 2: the refined head streams the vocabulary; 3: a tie at its
# top-k's edge may pick another logit.
PRECISION_VERSION = 3


class Bf16Linear(torch.nn.Module):
    """A linear layer with bf16 weights whose inputs are rounded to bf16 and outputs returned in fp32."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight = torch.nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.to(torch.bfloat16), self.weight).float()
        return y if self.bias is None else y + self.bias


def decoder_layers(model) -> torch.nn.ModuleList:
    """The stack of decoder layers (`layers` in Llama, Gemma, OLMo and most causal LMs)."""
    layers = getattr(model.base_model, "layers", None)
    if not (isinstance(layers, torch.nn.ModuleList) and len(layers)):
        raise ConfigError(f"{type(model).__name__}: no `layers` list of decoder layers; dtype: mixed needs one (use float32 or bfloat16)")
    return layers


def use_bf16_matmuls(model, keep_fp32: int = 1) -> None:
    """Swap the linear layers of every decoder layer but the first and last `keep_fp32` for
    `Bf16Linear`, in place."""
    layers = decoder_layers(model)
    for layer in list(layers)[keep_fp32 : len(layers) - keep_fp32]:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, Bf16Linear(child))
