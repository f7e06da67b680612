"""Scaled dot-product softmax attention: the baseline every variant is compared with."""

from __future__ import annotations

from torch import Tensor

from ..groups import Groups
from ..kernel import AttentionKernel, AttentionResult, FusedAttention, standard_diagnostics
from ..registry import register_attention


@register_attention("softmax")
class SoftmaxAttention(AttentionKernel):
    """Softmax over scaled dot products (SDPA on dense groups, segment softmax on graphs)."""

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        weights = groups.softmax(logits)
        return AttentionResult(weights, diagnostics=standard_diagnostics(weights, groups, self))

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention:
        # The fused kernel never materialises the [B, H, Lq, Lk] weights.
        return FusedAttention(q, k, scale)
