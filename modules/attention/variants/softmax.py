"""Scaled dot-product softmax attention: the baseline every variant is compared with."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..groups import DenseGroups, Groups
from ..kernel import AttentionKernel, AttentionResult, standard_diagnostics
from ..registry import register_attention


@register_attention("softmax")
class SoftmaxAttention(AttentionKernel):
    """Softmax over scaled dot products (SDPA on dense groups, segment softmax on graphs)."""

    def normalize(self, logits: Tensor, groups: Groups, *, q: Tensor | None = None, k: Tensor | None = None) -> AttentionResult:
        weights = groups.softmax(logits)
        return AttentionResult(weights, diagnostics=standard_diagnostics(weights, groups, self))

    def forward(self, q, k, v, groups, *, scale=None, dropout_p=0.0, need_weights=True):
        if not need_weights and isinstance(groups, DenseGroups):
            # Fused kernel: never materialises the [B, H, Lq, Lk] weights.
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=groups.mask, dropout_p=dropout_p if self.training else 0.0, scale=scale
            )
            return out, AttentionResult(weights=None)
        return super().forward(q, k, v, groups, scale=scale, dropout_p=dropout_p, need_weights=need_weights)
