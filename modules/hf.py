"""Any registered attnbench variant inside any Hugging Face transformers model.

    from modules.hf import use_attention, attention_terms
    model = use_attention(AutoModel.from_pretrained("albert-base-v2"), "entmax15", alpha=1.3)
    out = model(**batch); terms = attention_terms(model)   # terms.loss: the weighted aux losses (or None)

The variant enters through transformers' own attention registry (`AttentionInterface`, with an
`AttentionMaskInterface` entry under the same name): the model's projections, residuals, norms, rotary
embeddings, caches and dropout placement stay the library's code, and only the attention function, the
scores -> weights -> values step, is the variant's. Every attention module gets its own kernel as a submodule
(`attnbench_kernel`), so `model.parameters()` holds the kernels' parameters and a user's optimiser trains
them; the kernel is built at the AttentionSite its layer implies (text self-attention over tokens, ViT's
self-attention over patches, cross-attention, causal decoder self-attention).

`register()` also makes `attn_implementation="attnbench-<variant>"` a name transformers accepts at load time
(`from_pretrained`, `from_config`); kernels a model was not given by `use_attention` are then built at their
first call.

Only models whose attention layers call `ALL_ATTENTION_FUNCTIONS` (transformers' attention interface) can
host a variant; any other model is refused by name.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch
from torch import Tensor, nn

from .attention import AttentionKernel, AttentionResult, AttentionSite, DenseGroups, build_attention, list_attentions
from .attention.registry import resolve_config
from .lit.attention_terms import diagnostics, trace_aux_loss

PREFIX = "attnbench-"
KERNEL = "attnbench_kernel"
TESTED_FAMILIES = ("albert", "bert", "distilbert", "electra", "llama", "roberta", "vit")
"""Families the tests run every variant in (tests/modules/test_hf_models.py); any other whose attention
layers use the interface works the same way (BART, GPT-2, Mistral, Qwen2, ...)."""
UNSUPPORTED_KWARGS = ("position_bias", "softcap", "s_aux", "sinks")
"""Attention-function arguments that change the scores in ways a variant does not take (T5's additive
position bias, Gemma-2's logit soft-capping, gpt-oss's attention sinks): refused instead of ignored."""

log = logging.getLogger(__name__)

Trace = list[tuple[AttentionKernel, AttentionResult]]


class UnsupportedModelError(TypeError):
    """The model's attention layers do not go through transformers' attention interface."""


def implementation_name(variant: str) -> str:
    return f"{PREFIX}{variant}"


# ---- registration with transformers ----------------------------------------------------------------------

def register(variants: str | list[str] | None = None) -> list[str]:
    """Register `attn_implementation="attnbench-<variant>"` for every registered variant (plugins included)
    or the given ones, in transformers' AttentionInterface and AttentionMaskInterface; returns the names.
    Idempotent; call it again after loading a plugin."""
    names = list_attentions() if variants is None else [variants] if isinstance(variants, str) else list(variants)
    return [_register_one(name) for name in names]


@functools.lru_cache(maxsize=None)
def _register_one(variant: str) -> str:
    from transformers import AttentionInterface, AttentionMaskInterface

    resolve_config(variant)  # an unknown name fails here, with the registry's list of names
    name = implementation_name(variant)
    AttentionInterface.register(name, functools.partial(_attention, variant=variant))
    # Without a mask entry under the same name transformers builds no mask at all (masking_utils returns None
    # for implementations it does not know), and padding would be silently attended to.
    AttentionMaskInterface.register(name, _mask)
    return name


def _mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
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


# ---- the attention function ------------------------------------------------------------------------------

class Recorder:
    """The (kernel, result) of every attention call of a model's current forward, in call order (a module
    shared by several layers, as ALBERT's is, appears once per call). A forward pre-hook on the model clears
    it, so it holds one forward's results; `forwards` counts training forwards, the default aux-loss step."""

    def __init__(self, maxlen: int | None = None):
        self.trace: deque[tuple[AttentionKernel, AttentionResult]] = deque(maxlen=maxlen)
        self.forwards = 0
        self.need_weights = False

    def start(self, model: nn.Module, args: Any) -> None:
        self.trace.clear()
        if model.training:
            self.forwards += 1


def _attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
               scaling: float | None = None, dropout: float = 0.0, *, variant: str, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature: query [B, H, Lq, d], key/value [B, Hkv, Lk, d] -> ([B, Lq, H, d], weights)."""
    kernel: AttentionKernel | None = getattr(module, KERNEL, None)
    if kernel is None:
        kernel = _late_kernel(module, variant, query)
    for name in UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{type(module).__name__} passes {name!r} to its attention function; attnbench variants "
                                      f"normalise plain scaled dot products and cannot take it")
    if key.shape[1] != query.shape[1]:  # grouped-query attention: the kernel sees one key/value head per query head
        from transformers.integrations.sdpa_attention import repeat_kv

        key, value = repeat_kv(key, query.shape[1] // key.shape[1]), repeat_kv(value, query.shape[1] // value.shape[1])
    is_causal = kwargs.get("is_causal")
    groups = _groups(attention_mask, query, key, kernel.site, getattr(module, "is_causal", False) if is_causal is None else is_causal)
    recorder: Recorder = kernel._attnbench_recorder
    out, result = kernel(query, key, value, groups, scale=scaling, dropout_p=dropout, need_weights=recorder.need_weights)
    recorder.trace.append((kernel, result))
    return out.transpose(1, 2).contiguous(), result.weights


def _groups(mask: Tensor | None, query: Tensor, key: Tensor, site: AttentionSite, is_causal: bool) -> DenseGroups:
    lq, lk = query.shape[-2], key.shape[-2]
    if mask is not None and mask.dtype != torch.bool:
        mask = _boolean(mask)
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


def _boolean(mask: Tensor) -> Tensor:
    """An additive float mask (0 = attend, a large negative number = masked) as a boolean one; a mask that
    also adds a bias (ALiBi) is refused, since a variant's scores are its own."""
    allowed = mask > torch.finfo(mask.dtype).min / 2
    if bool((mask[allowed] != 0).any()):
        raise NotImplementedError("the model adds a bias to the attention scores through its mask; attnbench variants cannot take it")
    return allowed


# ---- which modules, which sites ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _calls_interface(cls: type) -> bool:
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every module whose forward calls transformers' attention interface."""
    return [(name, m) for name, m in model.named_modules() if type(m).__module__.startswith("transformers.") and _calls_interface(type(m))]


def check_supported(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from transformers import PreTrainedModel

    found = attention_modules(model) if isinstance(model, PreTrainedModel) else []
    if not found or not model._can_set_attn_implementation():
        raise UnsupportedModelError(
            f"{type(model).__name__} cannot host an attnbench variant: its attention layers do not call transformers' "
            f"attention interface (ALL_ATTENTION_FUNCTIONS). Supported: transformers models whose attention does, e.g. "
            f"{', '.join(TESTED_FAMILIES)} (tested), BART, GPT-2, Mistral, Qwen2")
    return found


def site_of(model: nn.Module, name: str, module: nn.Module) -> AttentionSite:
    """The site a layer implies: cross-attention where it attends to another sequence; else self-attention over
    text tokens (an ordered sequence, encoder or causal decoder), over image patches, or over other inputs."""
    last = name.rsplit(".", 1)[-1].lower()
    cross = bool(getattr(module, "is_cross_attention", False)) or "cross" in type(module).__name__.lower() \
        or "cross" in last or last == "encoder_attn"
    host = _host(model, name)
    if cross:
        return AttentionSite(host, "cross")
    return AttentionSite(host, "self", sequence=host == "text")


def _host(model: nn.Module, name: str) -> str:
    from transformers import PreTrainedModel

    owner = model  # the innermost transformers model around the layer says what its inputs are
    for prefix, sub in model.named_modules():
        if isinstance(sub, PreTrainedModel) and (prefix == "" or name.startswith(prefix + ".")):
            owner = sub
    main = getattr(owner, "main_input_name", "input_ids")
    return {"input_ids": "text", "pixel_values": "vision-language"}.get(main, "any")


def _head_shape(module: nn.Module) -> tuple[int, int]:
    config = getattr(module, "config", None)
    heads = next((getattr(module, a) for a in ("num_attention_heads", "num_heads", "n_heads") if isinstance(getattr(module, a, None), int)),
                 getattr(config, "num_attention_heads", None))
    head_dim = next((getattr(module, a) for a in ("head_dim", "attention_head_size") if isinstance(getattr(module, a, None), int)), None)
    if head_dim is None and heads and config is not None:
        head_dim = config.hidden_size // heads
    if not heads or not head_dim:
        raise UnsupportedModelError(f"{type(module).__name__}: cannot tell its number of heads and head size")
    return heads, head_dim


def _kernel_for(spec: str | Mapping[str, Any], module: nn.Module, site: AttentionSite) -> AttentionKernel:
    heads, head_dim = _head_shape(module)
    kernel = build_attention(spec, num_heads=heads, head_dim=head_dim, site=site)
    reference = next(module.parameters(), None)
    if reference is not None:
        kernel.to(device=reference.device, dtype=reference.dtype if reference.is_floating_point() else None)
    return kernel


def _late_kernel(module: nn.Module, variant: str, query: Tensor) -> AttentionKernel:
    """The kernel of a module in a model loaded with attn_implementation="attnbench-<variant>" and never given
    one by `use_attention`: built at its first call. Its site is what the module alone shows (self or cross;
    text unless it says otherwise), and since its parameters did not exist when the optimiser was built, the
    user is told to call use_attention after loading."""
    cross = bool(getattr(module, "is_cross_attention", False)) or "cross" in type(module).__name__.lower()
    site = AttentionSite("text", "cross") if cross else AttentionSite("text", "self", sequence=True)
    kernel = _kernel_for(variant, module, site).to(query.device)
    # No model-level hook can clear these results (the module does not know its model): keep a bounded window.
    kernel._attnbench_recorder = Recorder(maxlen=1024)
    setattr(module, KERNEL, kernel)
    if any(p.requires_grad for p in kernel.parameters()):
        _warn_late(variant, type(module).__name__)
    return kernel


@functools.lru_cache(maxsize=None)
def _warn_late(variant: str, module: str) -> None:
    log.warning("attnbench: built %s kernels with parameters at the first call of each %s; call modules.hf.use_attention(model) "
                "after loading, before building the optimiser, so that it trains them", variant, module)


# ---- the public entry point ---------------------------------------------------------------------------------

def use_attention(model: nn.Module, variant: str | Mapping[str, Any] | None = None, **config: Any) -> nn.Module:
    """Put the variant (a name with its options as keywords, or a spec mapping {"name": ..., **options}) into
    every attention module of `model`, in place; returns the model. Each module gets a kernel of its own at
    its site. With no variant, the model's own `attn_implementation="attnbench-<variant>"` names it.

    The model gets its own copy of its config: transformers reads the attention implementation from the
    config, which models built from one config object share, and converting this model must leave them alone."""
    modules = check_supported(model)
    if variant is None:
        current = getattr(model.config, "_attn_implementation", None) or ""
        if not current.startswith(PREFIX):
            raise ValueError(f"use_attention: name a variant (the model's attn_implementation is {current!r}); "
                             f"the variants are {', '.join(list_attentions())}")
        variant = current.removeprefix(PREFIX)
    spec = {"name": variant, **config} if isinstance(variant, str) else {**variant, **config}
    name, _ = resolve_config(spec)  # a bad option fails before the model is touched
    _own_config(model)
    implementation = _register_one(name)
    model.set_attn_implementation(implementation)
    if model.config._attn_implementation != implementation:
        raise UnsupportedModelError(f"{type(model).__name__} did not accept attn_implementation={implementation!r}")
    recorder = _recorder(model)
    for qualified, module in modules:
        kernel = _kernel_for(spec, module, site_of(model, qualified, module))
        kernel._attnbench_recorder = recorder
        setattr(module, KERNEL, kernel)
    return model


def _own_config(model: nn.Module) -> None:
    """Give `model` (and its submodels and layers) a private deep copy of the config objects they share."""
    from transformers import PretrainedConfig

    memo: dict[int, Any] = {}
    copied = copy.deepcopy(model.config, memo)
    for module in model.modules():
        current = module.__dict__.get("config")
        if isinstance(current, PretrainedConfig):
            module.config = memo.get(id(current), current)
    model.config = copied


def _recorder(model: nn.Module) -> Recorder:
    recorder = model.__dict__.get("_attnbench_recorder")
    if recorder is None:
        recorder = Recorder()
        model._attnbench_recorder = recorder
        model.register_forward_pre_hook(recorder.start)
    return recorder


def kernels(model: nn.Module) -> list[AttentionKernel]:
    """The model's attnbench kernels, one per attention module, in module order."""
    return [k for _, m in attention_modules(model) if (k := getattr(m, KERNEL, None)) is not None]


def trace(model: nn.Module) -> Trace:
    """(kernel, result) of every attention call of the model's last forward, in call order."""
    recorders = {id(r): r for k in kernels(model) if (r := getattr(k, "_attnbench_recorder", None)) is not None}
    own = model.__dict__.get("_attnbench_recorder")
    if own is not None and len(recorders) <= 1:
        return list(own.trace)
    return [pair for r in recorders.values() for pair in r.trace]


@contextmanager
def weights_formed(model: nn.Module, on: bool = True) -> Iterator[None]:
    """Within it, kernels form their weights (fused softmax paths do not), for diagnostics and for the
    attention weights the model returns."""
    recorders = [r for k in kernels(model) if (r := getattr(k, "_attnbench_recorder", None)) is not None]
    before = [r.need_weights for r in recorders]
    for r in recorders:
        r.need_weights = on
    try:
        yield
    finally:
        for r, value in zip(recorders, before):
            r.need_weights = value


@dataclass
class AttentionTerms:
    loss: Tensor | None
    """Every aux term the variant returned, each averaged over the attention calls that returned it and weighted
    as its config says at this step: add it to your loss. None when no term is weighted (softmax, entmax)."""
    aux: dict[str, Tensor] = field(default_factory=dict)
    """Each aux term's unweighted mean over the calls ("aux/kl"), detached, for logging."""
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    """Per call ("attn/l0/entropy") and averaged ("attn/entropy"); kernels report them in evaluation mode."""


def attention_terms(model: nn.Module, *, step: int | None = None, epoch: int | None = None) -> AttentionTerms:
    """The variant's aux losses, weighted, and its diagnostics, from the model's last forward. `step`: the
    optimiser step the schedules count (default: the number of training forwards before the last one);
    `epoch`: completed epochs, needed by variants whose schedule counts epochs (BAM)."""
    pairs = trace(model)
    if step is None:
        own = model.__dict__.get("_attnbench_recorder")
        step = max((own.forwards if own is not None else 1) - 1, 0)
    for kernel, _ in pairs:
        if kernel.config.schedule_unit == "epoch" and epoch is None:
            raise ValueError(f"{kernel.name}'s aux-loss schedule counts epochs: call attention_terms(model, epoch=<completed epochs>)")
    loss, aux = trace_aux_loss(pairs, step, 0 if epoch is None else epoch)
    return AttentionTerms(loss, aux, diagnostics(pairs))
