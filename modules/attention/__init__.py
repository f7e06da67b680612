"""Attention variants and the interface they share (docs/guides/adding-a-variant.md)."""

from .groups import DenseGroups, Groups, SegmentGroups
from .kernel import (
    AttentionConfig,
    AttentionKernel,
    AttentionResult,
    AttentionSite,
    FusedAttention,
    HeadShape,
    full_precision,
    per_head,
    standard_diagnostics,
)
from .registry import (
    ATTENTIONS,
    attention_entry,
    build_attention,
    list_attentions,
    register_attention,
    resolve_config,
    suggest_config,
)

from . import variants  # noqa: F401,E402  (registers the built-in variants)

__all__ = [
    "ATTENTIONS",
    "AttentionConfig",
    "AttentionKernel",
    "AttentionResult",
    "AttentionSite",
    "DenseGroups",
    "FusedAttention",
    "Groups",
    "HeadShape",
    "SegmentGroups",
    "attention_entry",
    "build_attention",
    "full_precision",
    "list_attentions",
    "per_head",
    "register_attention",
    "resolve_config",
    "standard_diagnostics",
    "suggest_config",
]
