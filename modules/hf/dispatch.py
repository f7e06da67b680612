"""What runs at each attention call: transformers' attention-function signature in, the module's kernel out.

transformers calls `attention(module, query, key, value, attention_mask, ...)` for every attention layer of a model
whose implementation is "attnbench-<variant>"; the layer's kernel (`module.attnbench_kernel`, put there by
install.py before the first call) computes the weights and the output, and the (kernel, result) pair is recorded
for the model's forward in the model's Recorder (attention_terms reads it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import AttentionKernel, AttentionResult, AttentionSite, DenseGroups
from .support import SCORE_ARGUMENTS, UnsupportedModelError

KERNEL = "attnbench_kernel"
"""The attribute of an attention module that holds its kernel (a submodule: its parameters are the model's)."""


def recomputing() -> bool:
    """Whether this forward runs inside a backward pass: activation checkpointing recomputing a layer. Its results
    were recorded in the forward; recording them again would double the trace after every backward. A compiled
    forward does not ask (the query is a graph break, and a compiled region is not recomputed eagerly)."""
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1


class Recorder:
    """The (kernel, result) of every attention call of the model's current forward, in call order (a module
    shared by several layers, as ALBERT's is, appears once per call). A forward pre-hook on the model clears it,
    so it never holds more than one forward's results; `forwards` counts training forwards, the default step of
    the aux-loss schedules. A result keeps its weights only while they are asked for (`need_weights`, set by
    `weights_formed`): an evaluation forward of a sparse variant would otherwise hold every layer's [B, H, L, L]
    map until the next forward."""

    def __init__(self) -> None:
        self.trace: list[tuple[AttentionKernel, AttentionResult]] = []
        self.forwards = 0
        self.need_weights = False

    def start(self, model: nn.Module, args: Any) -> None:
        self.trace.clear()
        if model.training:
            self.forwards += 1

    def record(self, kernel: AttentionKernel, result: AttentionResult) -> None:
        if recomputing():
            return
        if result.weights is not None and not self.need_weights:
            result = dataclasses.replace(result, weights=None)
        self.trace.append((kernel, result))


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
              scaling: float | None = None, dropout: float = 0.0, *, variant: str, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature: query [B, H, Lq, d], key/value [B, Hkv, Lk, d] -> ([B, Lq, H, d], weights).
    The weights are formed (not left to a fused kernel) when the model is asked for them (`output_attentions`)."""
    kernel: AttentionKernel | None = getattr(module, KERNEL, None)
    if kernel is None:
        raise RuntimeError(
            f"{type(module).__name__} runs attn_implementation='attnbench-{variant}' but has no attnbench kernel: its model was "
            f"not built by transformers with that implementation (from_pretrained/from_config after modules.hf.register()) nor given "
            f"the variant by modules.hf.use_attention(model, {variant!r}); call use_attention on the model")
    for name, meaning in SCORE_ARGUMENTS.items():
        if kwargs.get(name) is not None:
            raise UnsupportedModelError(f"{type(module).__name__} passes {name!r} ({meaning}) to its attention function; attnbench "
                                        f"variants normalise plain scaled dot products and cannot take it")
    if key.shape[1] != query.shape[1]:  # grouped-query attention: the kernel sees one key/value head per query head
        from transformers.integrations.sdpa_attention import repeat_kv

        key, value = repeat_kv(key, query.shape[1] // key.shape[1]), repeat_kv(value, query.shape[1] // value.shape[1])
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        try:
            attention_mask = boolean_mask(attention_mask)
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"{type(module).__name__} ({getattr(kernel, '_attnbench_layer', 'a layer')}): {exc}") from None
    is_causal = kwargs.get("is_causal")
    groups = dense_groups(attention_mask, query, key, kernel.site, getattr(module, "is_causal", False) if is_causal is None else is_causal)
    if groups.mask is not None and groups.mask.shape[-2] != 1 and kernel.training and torch.is_grad_enabled():
        check_frozen_unread(module, kernel)
    recorder: Recorder = kernel._attnbench_recorder
    need_weights = recorder.need_weights or bool(kwargs.get("output_attentions"))
    out, result = kernel(query, key, value, groups, scale=scaling, dropout_p=dropout, need_weights=need_weights)
    recorder.record(kernel, result)
    return out.transpose(1, 2).contiguous(), result.weights


def check_frozen_unread(module: nn.Module, kernel: AttentionKernel) -> None:
    """A per-pair mask reached a layer whose kernel had parameters frozen as never read there (install.py's
    freeze_unread): training on would leave them at their initial values, silently. Stop, naming them and the fix."""
    frozen = [name for name in getattr(kernel, "_attnbench_frozen", ()) if not getattr(kernel, name).requires_grad]
    if not frozen:
        return
    layer = getattr(kernel, "_attnbench_layer", "a layer")
    names = ", ".join(frozen)
    raise RuntimeError(
        f"{type(module).__name__} ({layer}): {kernel.name}'s {names} was frozen when the model was built, because this layer is "
        f"not causal and was expected to get a key-padding mask or none, under which {names} is never read (frozen, "
        f"DistributedDataParallel's default settings work); this training forward passes a per-pair mask [B, 1, Lq, Lk], which "
        f"reads it. Either pass a key-padding mask [B, L], or train it: before wrapping the model in DistributedDataParallel, "
        f"model.get_submodule({layer!r}).{KERNEL}.{frozen[0]}.requires_grad_(True) at every such layer (and pass "
        f"find_unused_parameters=True if some layers never get a per-pair mask)")


def mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
         mask_function=None, attention_mask: Tensor | None = None, **kwargs: Any) -> Tensor | None:
    """A boolean mask (True = attend), the layout DenseGroups takes. Bidirectional attention gets the key-padding
    mask [B, 1, 1, Lk] (None without padding): it broadcasts where sdpa's [B, 1, Lq, Lk] would be materialised,
    and it is the layout the BERT host always used, so records made through it stay bit-identical. Everything
    else (causal, sliding windows, chunks, packed sequences) is sdpa's full mask, never skipped: a variant
    has no `is_causal` shortcut to fall back on."""
    from transformers.masking_utils import bidirectional_mask_function, prepare_padding_mask, sdpa_mask

    if mask_function is bidirectional_mask_function:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        return None if padding is None else padding[:, None, None, :]
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    if mask_function is not None:
        kwargs["mask_function"] = mask_function
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask, **kwargs)


def dense_groups(mask: Tensor | None, query: Tensor, key: Tensor, site: AttentionSite, is_causal: bool) -> DenseGroups:
    lq, lk = query.shape[-2], key.shape[-2]
    if mask is not None and mask.dtype != torch.bool:
        mask = boolean_mask(mask)
    if mask is None and is_causal and lq > 1:
        # A mask built outside our mask function (or none at all) on a causal layer: sdpa would pass is_causal.
        mask = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(diagonal=lk - lq)[None, None]
    query_valid = None
    if mask is not None and site.role == "self":
        # A padded token is no query either: in self-attention it is the token whose own key is masked, the
        # (offset) diagonal of the mask; a key-padding mask [B, 1, 1, L] is that diagonal already.
        if mask.shape[-2] == 1:
            query_valid = mask[:, 0, 0, :] if lq == lk else None
        else:
            query_valid = mask[:, 0].diagonal(offset=lk - lq, dim1=-2, dim2=-1)
        if query_valid is not None:
            query_valid = query_valid.expand(query.shape[0], lq)
    return DenseGroups(mask, query_valid)


def boolean_mask(mask: Tensor) -> Tensor:
    """An additive float mask (0 = attend, a large negative number = masked) as a boolean one; a mask that
    also adds a bias (ALiBi), or one that carries a gradient (a learned bias, zero or not), is refused, since a
    variant's scores are its own. The layers' code is checked for such masks at construction (support.py); this
    is the check of the values a forward hands in, for a bias the code does not show."""
    if mask.requires_grad:  # a learned bias, even while it is zero (Swin's fresh relative-position table)
        raise UnsupportedModelError("the model adds a learned bias to the attention scores through its mask; attnbench variants "
                                    "take a mask as attend-or-not only, so the bias would be dropped and would not train")
    allowed = mask > torch.finfo(mask.dtype).min / 2
    if bool((mask[allowed] != 0).any()):
        raise UnsupportedModelError("the model adds a bias to the attention scores through its mask; attnbench variants cannot take it")
    return allowed
