"""Putting a variant into a transformers model, by either door, with one behaviour behind both.

- `use_attention(model, variant, **options)` on a built model;
- `attn_implementation="attnbench-<variant>"` at `from_pretrained` / `from_config` / `Model(config)` /
  `set_attn_implementation`, after `register()`.

Both end in `install`: the model is checked (support.py), every attention module gets a kernel of its own at the
site its layer implies, the kernels report to one Recorder cleared by a forward pre-hook on the model, and the
model's config records the variant, so that `save_pretrained` writes it and `from_pretrained` rebuilds it.

transformers' attention interface is stateless: it has no hook for an implementation whose attention has
parameters, which must exist before `from_pretrained` loads weights into them. `register()` therefore wraps three
methods of `PreTrainedModel`, each a no-op unless the model's implementation is an attnbench one:
- `_check_and_adjust_attn_implementation`, where transformers validates an implementation name at construction
  and in `set_attn_implementation`: the class is refused here, before its layers are built (Falcon would raise a
  KeyError from its own table otherwise), and a built model switched by `set_attn_implementation` gets its kernels;
- `post_init`, which every model runs at the end of its construction (inner models first): kernels are put in
  here, so that `from_pretrained` finds them and loads their trained weights;
- `from_pretrained`: kernels that the checkpoint did not hold (a plain pretrained checkpoint given a variant) and
  buffers that are not saved are set to a fresh kernel's values, since transformers builds the model on the meta
  device and initialises only the modules it knows.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import difflib
import functools
import types
import typing
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from ..attention import AttentionKernel, AttentionResult, AttentionSite, build_attention, list_attentions
from ..attention.registry import attention_entry, resolve_config
from .dispatch import KERNEL, Recorder, attention, mask
from .support import UnsupportedModelError, attention_modules, check_class, check_supported

PREFIX = "attnbench-"
CONFIG_KEY = "attnbench"
"""The config attribute that holds the variant's spec ({"name": ..., **options}); config.json gets it too."""
LOAD_HINT = "an attnbench variant: install attnbench (pip install -e on its checkout) and call modules.hf.register() before loading"
"""Appended to the implementation name written into config.json: transformers echoes the name when it does not
know it, so loading the checkpoint without attnbench fails with this line instead of running plain attention."""

Trace = list[tuple[AttentionKernel, AttentionResult]]

_installing = contextvars.ContextVar("attnbench_installing", default=False)


def implementation_name(variant: str) -> str:
    return f"{PREFIX}{variant}"


def saved_implementation_name(variant: str) -> str:
    """The implementation name config.json holds: the registered name with what loading it needs."""
    return f"{implementation_name(variant)} [{LOAD_HINT}]"


def variant_of(implementation: Any) -> str | None:
    """The variant an implementation name ("attnbench-<variant>", or the saved form) stands for; None for others."""
    if not isinstance(implementation, str) or not implementation.startswith(PREFIX):
        return None
    return implementation.removeprefix(PREFIX).split(" [", 1)[0]


# ---- options ----------------------------------------------------------------------------------------------

def variant_spec(variant: str | Mapping[str, Any], options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{"name": ..., **options} checked: the name (the registry's did-you-mean), each option's name and type (the
    config field's annotation, e.g. alpha: float > 0), then the variant's own checks (resolve_config)."""
    spec = {"name": variant, **(options or {})} if isinstance(variant, str) else {**variant, **(options or {})}
    if "name" not in spec:
        raise ValueError(f"a variant spec needs a 'name', got {dict(spec)}; the variants are {', '.join(list_attentions())}")
    name = spec["name"]
    fields = typing.get_type_hints(attention_entry(name).cls.Config, include_extras=True)
    options = sorted(f.name for f in dataclasses.fields(attention_entry(name).cls.Config))
    for option in spec:
        if option != "name" and option not in options:
            close = difflib.get_close_matches(option, options, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{name}: has no option {option!r}{hint}; its options are {', '.join(options) or 'none'}")
    for option, value in spec.items():
        if option != "name" and option in fields and value is not None:
            _check_type(name, option, value, fields[option])
    resolve_config(spec)  # unknown options, preset clashes and the variant's own range checks, each named
    return spec


def _check_type(variant: str, option: str, value: Any, annotation: Any) -> None:
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(annotation).validate_python(value, strict=True)
    except ValidationError as exc:
        detail = exc.errors()[0]["msg"]
        raise ValueError(f"{variant}: option {option}={value!r} ({type(value).__name__}) is not {describe_type(annotation)} "
                         f"({detail[0].lower()}{detail[1:]})") from None


def describe_type(annotation: Any) -> str:
    """A config field's annotation in words: Annotated[float | None, Gt(0)] -> 'a float > 0 (or None for the default)'."""
    constraints = []
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *metadata = typing.get_args(annotation)
        for item in metadata:
            for attribute, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                if getattr(item, attribute, None) is not None:
                    constraints.append(f"{symbol} {getattr(item, attribute)}")
    members = list(typing.get_args(annotation)) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else [annotation]
    optional = type(None) in members
    names = [getattr(m, "__name__", str(m)) for m in members if m is not type(None)]
    text = f"a{'n' if names and names[0][0] in 'aeiou' else ''} {' or '.join(names)}"
    if constraints:
        text += " " + " and ".join(constraints)
    return text + (" (or None for the default)" if optional else "")


# ---- sites and kernels --------------------------------------------------------------------------------------

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


def _reference(module: nn.Module) -> torch.Tensor | None:
    """A parameter of the layer itself (not of its kernel): the device and dtype its kernel takes."""
    return next((p for n, p in module.named_parameters() if not n.startswith(f"{KERNEL}.")), None)


def build_kernel(spec: Mapping[str, Any], module: nn.Module, site: AttentionSite) -> AttentionKernel:
    """A fresh kernel for the layer, on its device and in its dtype. Marked initialised for transformers, whose
    weight initialisation (run again by an outer model's post_init) would otherwise overwrite the kernel's own."""
    heads, head_dim = _head_shape(module)
    kernel = build_attention(spec, num_heads=heads, head_dim=head_dim, site=site)
    reference = _reference(module)
    if reference is not None:
        kernel.to(device=reference.device, dtype=reference.dtype if reference.is_floating_point() else None)
    for sub in kernel.modules():
        sub._is_hf_initialized = True
    kernel._attnbench_spec = dict(spec)
    return kernel


def freeze_unread(kernel: AttentionKernel, module: nn.Module) -> None:
    """Freeze the kernel parameters this layer never reads, so that DistributedDataParallel with its default
    settings does not wait for their gradients (it fails at the second step otherwise, naming none of them).
    A kernel freezes what its site alone rules out (fenchel's position table away from token sequences); here
    the layer adds what the door knows: a layer that is not causal gets a key-padding mask or none (mask()
    below), never a per-pair one, so the kernel's `pair_mask_parameters` (fenchel's degree coupling at ViT's
    layers and BART's cross-attention) are never read there. A forward that hands such a layer a per-pair mask
    anyway (a custom 4-D mask) is stopped by dispatch.attention, naming the parameter and the fix."""
    frozen = set(getattr(kernel, "_attnbench_frozen", ()))
    if not getattr(module, "is_causal", False):
        for name in getattr(type(kernel), "pair_mask_parameters", ()):
            parameter = getattr(kernel, name, None)
            if isinstance(parameter, nn.Parameter) and parameter.requires_grad:
                parameter.requires_grad_(False)
                frozen.add(name)
    kernel._attnbench_frozen = tuple(sorted(frozen))


def _same_kernel(kernel: AttentionKernel, spec: Mapping[str, Any], site: AttentionSite) -> bool:
    name, config = resolve_config(spec)
    return kernel.name == name and kernel.site == site and kernel.config == config.for_site(site)


def install(model: nn.Module, spec: Mapping[str, Any]) -> None:
    """Kernels of `spec` at every attention module of `model` (a kernel of the same variant, options and site is
    kept: loading, then use_attention, keeps the trained weights), one Recorder, and the config marks."""
    modules = check_supported(model)
    recorder = _adopt_recorder(model)
    for qualified, module in modules:
        site = site_of(model, qualified, module)
        kernel = getattr(module, KERNEL, None)
        if not isinstance(kernel, AttentionKernel) or not _same_kernel(kernel, spec, site):
            kernel = build_kernel(spec, module, site)
            setattr(module, KERNEL, kernel)
        kernel._attnbench_recorder = recorder
        kernel._attnbench_layer = qualified or "the model"  # named in errors a forward raises
        freeze_unread(kernel, module)
    model.config.attn_implementation = saved_implementation_name(spec["name"])  # what config.json says
    setattr(model.config, CONFIG_KEY, dict(spec))


def _adopt_recorder(model: nn.Module) -> Recorder:
    """The model's Recorder, cleared by a forward pre-hook on it; the Recorders of models inside it (an inner
    model's post_init ran first) are retired, so that one forward of the outer model is one trace."""
    recorder = model.__dict__.get("_attnbench_recorder")
    if recorder is None:
        recorder = Recorder()
        model._attnbench_recorder = recorder
        model._attnbench_recorder_hook = model.register_forward_pre_hook(recorder.start)
    for sub in model.modules():
        if sub is not model and "_attnbench_recorder_hook" in sub.__dict__:
            sub._attnbench_recorder_hook.remove()
            del sub._attnbench_recorder, sub._attnbench_recorder_hook
    return recorder


def _clear_marks(config: Any) -> None:
    for name in ("attn_implementation", CONFIG_KEY):
        if name in config.__dict__:
            delattr(config, name)


def _registered_spec(model: nn.Module, variant: str) -> dict[str, Any]:
    """The spec a model built with implementation attnbench-<variant> takes: its config's `attnbench` entry
    (options, with or without the name, as a user sets it or config.json stores it), checked as use_attention
    checks its options; else the spec of the kernels it has; else the variant's defaults. An entry is never
    dropped: one that names another variant, an unknown option or a value of the wrong type is refused with
    the reason. An entry the door itself wrote for the kernels the model has now (a model switched to another
    variant by set_attn_implementation) is theirs, not a request, and gives way to the new variant."""
    saved = getattr(model.config, CONFIG_KEY, None)
    current = next((k for _, m in attention_modules(model) if (k := getattr(m, KERNEL, None)) is not None), None)
    current_spec = getattr(current, "_attnbench_spec", None)
    if saved is not None and not (current_spec is not None and dict(saved) == current_spec and current_spec.get("name") != variant):
        if not isinstance(saved, Mapping):
            raise ValueError(f"config.{CONFIG_KEY} must be a mapping of {variant}'s options (e.g. {{'alpha': 0.5}}), got {saved!r}")
        named = saved.get("name", variant)
        if named != variant:
            raise ValueError(f"config.{CONFIG_KEY} names the variant {named!r} but the attention implementation is "
                             f"{implementation_name(variant)!r}: give both the same variant (or leave the name out of "
                             f"config.{CONFIG_KEY}: its options are then {variant}'s). To load a checkpoint saved with "
                             f"{named} as {variant}, pass a config without the entry: config = AutoConfig.from_pretrained(path); "
                             f"del config.{CONFIG_KEY}; from_pretrained(path, config=config, attn_implementation=...)")
        return variant_spec({"name": variant, **{k: v for k, v in saved.items() if k != "name"}})
    if current_spec is not None and current_spec.get("name") == variant:
        return dict(current_spec)
    return {"name": variant}


# ---- transformers' side: the registration door ------------------------------------------------------------

def register(variants: str | list[str] | None = None) -> list[str]:
    """Register `attn_implementation="attnbench-<variant>"` for every registered variant (plugins included)
    or the given ones, in transformers' AttentionInterface and AttentionMaskInterface, and hook model
    construction and loading (module docstring); returns the names. Idempotent; call it again after loading a
    plugin."""
    names = list_attentions() if variants is None else [variants] if isinstance(variants, str) else list(variants)
    _hook_transformers()
    return [register_one(name) for name in names]


@functools.lru_cache(maxsize=None)
def register_one(variant: str) -> str:
    from transformers import AttentionInterface, AttentionMaskInterface

    resolve_config(variant)  # an unknown name fails here, with the registry's list of names
    name = implementation_name(variant)
    AttentionInterface.register(name, functools.partial(attention, variant=variant))
    # Without a mask entry under the same name transformers builds no mask at all (masking_utils returns None
    # for implementations it does not know), and padding would be silently attended to.
    AttentionMaskInterface.register(name, mask)
    return name


@functools.lru_cache(maxsize=None)
def _hook_transformers() -> None:
    from transformers import PreTrainedModel

    check_and_adjust = PreTrainedModel._check_and_adjust_attn_implementation
    post_init = PreTrainedModel.post_init
    from_pretrained = PreTrainedModel.from_pretrained.__func__

    @functools.wraps(check_and_adjust)
    def checked(self, attn_implementation=None, *args, **kwargs):
        variant = variant_of(attn_implementation)
        if variant is None:
            if attn_implementation is not None:
                _clear_marks(self.config)  # switched away from a variant: a save must not claim it
            return check_and_adjust(self, attn_implementation, *args, **kwargs)
        check_class(type(self), getattr(self, "config", None))
        implementation = register_one(variant)
        result = check_and_adjust(self, implementation, *args, **kwargs)
        built = not kwargs.get("is_init_check", args[0] if args else False)
        if built and not _installing.get():  # set_attn_implementation on a built model
            install(self, _registered_spec(self, variant))
        return result

    @functools.wraps(post_init)
    def post_init_then_install(self):
        post_init(self)
        variant = variant_of(getattr(self.config, "_attn_implementation", None))
        if variant is not None:
            install(self, _registered_spec(self, variant))

    @functools.wraps(from_pretrained)
    def from_pretrained_then_settle(cls, *args, **kwargs):
        wants_info = kwargs.get("output_loading_info", False)
        model, info = from_pretrained(cls, *args, **{**kwargs, "output_loading_info": True})
        if kernels(model):
            missing = set(info.get("missing_keys", ())) | {entry[0] for entry in info.get("mismatched_keys", ())}
            settle_loaded_kernels(model, missing)
        return (model, info) if wants_info else model

    PreTrainedModel._check_and_adjust_attn_implementation = checked
    PreTrainedModel.post_init = post_init_then_install
    PreTrainedModel.from_pretrained = classmethod(from_pretrained_then_settle)


def settle_loaded_kernels(model: nn.Module, missing: Iterable[str]) -> None:
    """After from_pretrained: each kernel tensor the checkpoint did not hold (`missing`, as transformers reports
    them), and every buffer a kernel does not save, gets a fresh kernel's value, in place. transformers built the
    kernels on the meta device and gave those tensors empty memory; the ones it loaded are kept."""
    missing = set(missing)
    for qualified, module in attention_modules(model):
        kernel = getattr(module, KERNEL, None)
        if kernel is None:
            continue
        fresh = build_kernel(kernel._attnbench_spec, module, kernel.site)
        prefix = f"{qualified}.{KERNEL}." if qualified else f"{KERNEL}."
        saved = kernel.state_dict(keep_vars=True)
        fresh_tensors = dict(fresh.named_parameters()) | dict(fresh.named_buffers())
        with torch.no_grad():
            for name, tensor in list(kernel.named_parameters()) + list(kernel.named_buffers()):
                if name not in saved or prefix + name in missing:
                    tensor.copy_(fresh_tensors[name])


# ---- the public entry point ---------------------------------------------------------------------------------

def use_attention(model: nn.Module, variant: str | Mapping[str, Any] | None = None, **config: Any) -> nn.Module:
    """Put the variant (a name with its options as keywords, or a spec mapping {"name": ..., **options}) into
    every attention module of `model`, in place; returns the model. Each module gets a kernel of its own at
    its site; a module that has one of the same variant, options and site keeps it (and its trained weights).
    With no variant, the model's own `attn_implementation="attnbench-<variant>"` names it.

    The model gets its own copy of its config: transformers reads the attention implementation from the
    config, which models built from one config object share, and converting this model must leave them alone."""
    check_supported(model)
    if variant is None:
        current = variant_of(getattr(model.config, "_attn_implementation", None))
        if current is None:
            raise ValueError(f"use_attention: name a variant (the model's attn_implementation is "
                             f"{model.config._attn_implementation!r}); the variants are {', '.join(list_attentions())}")
        variant = _registered_spec(model, current) if not config else current
    spec = variant_spec(variant, config)  # a bad option fails before the model is touched
    _own_config(model)
    implementation = register_one(spec["name"])
    _hook_transformers()
    token = _installing.set(True)
    try:
        model.set_attn_implementation(implementation)
    finally:
        _installing.reset(token)
    if model.config._attn_implementation != implementation:
        raise UnsupportedModelError(f"{type(model).__name__} did not accept attn_implementation={implementation!r}")
    install(model, spec)
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


def kernels(model: nn.Module) -> list[AttentionKernel]:
    """The model's attnbench kernels, one per attention module, in module order."""
    return [k for _, m in attention_modules(model) if (k := getattr(m, KERNEL, None)) is not None]


def trace(model: nn.Module) -> Trace:
    """(kernel, result) of every attention call of the model's last forward, in call order."""
    own = model.__dict__.get("_attnbench_recorder")
    if own is not None:
        return list(own.trace)
    recorders = {id(r): r for k in kernels(model) if (r := getattr(k, "_attnbench_recorder", None)) is not None}
    return [pair for r in recorders.values() for pair in r.trace]


@contextmanager
def weights_formed(model: nn.Module, on: bool = True) -> Iterator[None]:
    """Within it, kernels form their weights (fused softmax paths do not) and the trace keeps them, for
    diagnostics and for the attention weights the model returns."""
    recorders = list({id(r): r for k in kernels(model) if (r := getattr(k, "_attnbench_recorder", None)) is not None}.values())
    before = [r.need_weights for r in recorders]
    for r in recorders:
        r.need_weights = on
    try:
        yield
    finally:
        for r, value in zip(recorders, before):
            r.need_weights = value
