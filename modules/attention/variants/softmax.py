"""Scaled dot-product softmax attention: the baseline every variant is compared with."""

from __future__ import annotations

from torch import Tensor

from ..groups import Groups
from ..kernel import AttentionKernel, AttentionResult, FusedAttention, MechanismDiagnostic, qk_diagnostics, standard_diagnostics
from ..registry import register_attention


@register_attention("softmax")
class SoftmaxAttention(AttentionKernel):
    """Softmax over scaled dot products (SDPA on dense groups, segment softmax on graphs)."""

    # No mechanism of its own: its query/key distance is the reference the alignment variants are read against.
    mechanism = (MechanismDiagnostic("qk_distance", "relative sliced Wasserstein-1 distance between the query and key clouds per head",
                                     in_training=False),)
    independent_heads = True
    """Each head's softmax over its own logits, nothing drawn, no state, and nothing returned but the weights while
    nothing is measured: a seed batch may fold its seeds into the heads axis (kernel.folds_heads)."""

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor, k: Tensor) -> AttentionResult:
        weights = groups.softmax(logits)
        return AttentionResult(weights, diagnostics={**standard_diagnostics(weights, groups, self), **qk_diagnostics(self, q, k, groups)})

    def fused_attention(self, q: Tensor, k: Tensor, groups: Groups, *, scale: float) -> FusedAttention:
        # The fused kernel never materialises the [B, H, Lq, Lk] weights.
        return FusedAttention(q, k, scale, diagnostics=qk_diagnostics(self, q, k, groups))
