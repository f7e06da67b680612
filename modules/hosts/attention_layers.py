"""Transformer layers whose every attention (self, cross, pooling) is an attention variant.

The vision-language hosts (captioning decoder, MCAN co-attention) are built from these. The text hosts
use transformers' BertModel instead; these exist because neither torch's nn.MultiheadAttention nor
timm's blocks let a module replace the normalisation of the scores, which is what a variant is.

Every attention call appends `(kernel, AttentionResult)` to a `trace` list that the LightningModule
passes down: aux losses are then weighted by the kernel that produced them, whatever order the layers
ran in (beam search, MCAN's encoder-decoder stacks). Every host (GAT, the text encoders) collects its
per-layer results this one way.

Each kernel is told its site (`AttentionSite`): the host kind, and whether it is self-attention over a
token sequence, cross-attention, or pooling, so that variants set themselves up as their papers do there.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor, nn

from ..attention import AttentionKernel, AttentionResult, AttentionSite, DenseGroups, build_attention

Trace = list[tuple[AttentionKernel, AttentionResult]]
"""(kernel, result) of every attention call in the order they ran; see modules/lit/attention_terms.py."""


class VariantAttention(nn.Module):
    """Multi-head attention: Q/K/V/output projections around the variant's kernel."""

    def __init__(self, width: int, heads: int, attention: str | Mapping[str, Any], *, site: AttentionSite,
                 dropout: float = 0.1):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads, self.head_dim = heads, width // heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.dropout = dropout
        self.kernel = build_attention(attention, num_heads=heads, head_dim=self.head_dim, site=site)

    def _split(self, x: Tensor) -> Tensor:
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, context: Tensor, groups: DenseGroups, trace: Trace | None = None,
                *, need_weights: bool = False) -> Tensor:
        """x [B, Lq, D] attends to context [B, Lk, D] within `groups` (masks [B|1, 1, Lq|1, Lk])."""
        q, k, v = self._split(self.q(x)), self._split(self.k(context)), self._split(self.v(context))
        out, result = self.kernel(q, k, v, groups, dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights)
        if trace is not None:
            trace.append((self.kernel, result))
        return self.out(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class FeedForward(nn.Sequential):
    def __init__(self, width: int, hidden: int, dropout: float):
        super().__init__(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, width))


class TransformerLayer(nn.Module):
    """Self-attention, optional cross-attention to a context, feed-forward; each a post-norm residual
    block as in the original Transformer and MCAN (MCAN's SA is `cross=False`, its SGA `cross=True`;
    a captioning decoder layer is `cross=True` with causal self groups). `sequence`: the self-attention
    runs over an ordered token sequence (text), not a set such as an image grid."""

    def __init__(self, width: int, heads: int, attention: str | Mapping[str, Any], *, sequence: bool,
                 cross: bool = False, host: str = "vision-language", ffn_mult: int = 4, dropout: float = 0.1):
        super().__init__()
        self_site = AttentionSite(host, "self", sequence=sequence)
        self.self_attn = VariantAttention(width, heads, attention, site=self_site, dropout=dropout)
        self.cross_attn = (
            VariantAttention(width, heads, attention, site=AttentionSite(host, "cross"), dropout=dropout) if cross else None
        )
        self.ffn = FeedForward(width, ffn_mult * width, dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(3 if cross else 2))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, self_groups: DenseGroups, trace: Trace | None = None, *,
                context: Tensor | None = None, context_groups: DenseGroups | None = None,
                need_weights: bool = False) -> Tensor:
        x = self.norms[0](x + self.drop(self.self_attn(x, x, self_groups, trace, need_weights=need_weights)))
        if self.cross_attn is not None:
            if context is None or context_groups is None:
                raise ValueError("a cross-attention layer needs a context and its groups")
            x = self.norms[1](x + self.drop(self.cross_attn(x, context, context_groups, trace, need_weights=need_weights)))
        return self.norms[-1](x + self.drop(self.ffn(x)))


class AttentionPool(nn.Module):
    """A learned query attends over a sequence with the variant: MCAN's "attentional reduction"
    (AttFlat), with its MLP scorer replaced by the variant so that pooling is an attention too."""

    def __init__(self, width: int, heads: int, attention: str | Mapping[str, Any], *, host: str = "vision-language",
                 dropout: float = 0.1):
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, 1, width) * width**-0.5)
        self.attn = VariantAttention(width, heads, attention, site=AttentionSite(host, "pool"), dropout=dropout)

    def forward(self, x: Tensor, valid: Tensor, trace: Trace | None = None, *, need_weights: bool = False) -> Tensor:
        """x [B, L, D], valid [B, L] (True = real) -> [B, D]."""
        groups = DenseGroups.from_key_padding(valid)
        return self.attn(self.query.expand(x.shape[0], -1, -1), x, groups, trace, need_weights=need_weights).squeeze(1)


def variant_kernels(model: nn.Module) -> list[AttentionKernel]:
    return [m.kernel for m in model.modules() if isinstance(m, VariantAttention)]


def sinusoidal_positions(length: int, width: int) -> Tensor:
    """[length, width] fixed sinusoidal position codes (Vaswani et al.), so decoders need no maximum length."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-torch.log(torch.tensor(10000.0)) / width))
    codes = torch.zeros(length, width)
    codes[:, 0::2] = torch.sin(position * freq)
    codes[:, 1::2] = torch.cos(position * freq[: width // 2])
    return codes
