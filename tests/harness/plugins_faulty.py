"""Test plugin: variants that fail on purpose, to check that failures are recorded and the suite goes on."""

import torch

from modules.attention import AttentionKernel, AttentionResult, register_attention


@register_attention("test-raises")
class RaisesAttention(AttentionKernel):
    """Raises inside normalize."""

    def normalize(self, logits, groups, *, q=None, k=None):
        raise RuntimeError("deliberate failure in test-raises")


@register_attention("test-nan")
class NanAttention(AttentionKernel):
    """Produces NaN weights, so the training loss becomes NaN."""

    def normalize(self, logits, groups, *, q=None, k=None):
        return AttentionResult(groups.softmax(logits) * torch.nan)
