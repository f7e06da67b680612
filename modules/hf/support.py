"""Which transformers models can host a variant, decided before any variant is put in, by either door.

A model can when every layer that computes attention hands its scores -> weights -> values step to transformers'
attention interface (`ALL_ATTENTION_FUNCTIONS`) and adds nothing of its own to the scores. Refused:
- a model whose attention layers compute the scores themselves (BigBird, DeBERTa-v2) or pick a class per
  implementation from a table of their own (Falcon): the variant would never run, and the model would run with
  its own attention, silently;
- a layer that passes the interface something a variant does not take: T5's relative-position bias, Gemma-2's
  logit soft-capping, gpt-oss's attention sinks;
- a layer that adds a bias of its own to the scores through the mask it hands the interface (Swin's relative-
  position table and shifted-window masks, Parakeet's relative positions, Doge's dynamic mask): a variant takes
  a mask as "attend or not" only, so the bias would be dropped and its parameters would never train, silently
  (a zero-initialised table even passes a forward-time check). The mask argument is followed back through the
  forward's assignments (`mask_bias`); a layer whose mask is anything but the masks it is given, combined by
  masking operations, is refused.
The checks read the layers' source code (what transformers itself does in `_can_set_attn_implementation`): a
model is judged by its code, before a forward could show anything.
"""

from __future__ import annotations

import ast
import functools
import re
import inspect
import textwrap
from typing import Any

from torch import nn

from .families import checked_families

INTERFACE = "ALL_ATTENTION_FUNCTIONS"
SCORE_ARGUMENTS = {
    "position_bias": "an additive position bias (T5's relative buckets)",
    "softcap": "logit soft-capping",
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
}
"""Arguments of the attention-interface call that change the scores in ways a variant does not take."""


BIAS_WORDS = re.compile(r"bias|alibi|position|relative|dt_states", re.IGNORECASE)
"""Names that, read into the mask handed to the interface, put values of their own into the scores."""
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.MatMult, ast.Div, ast.Pow)
SHAPE_READS = {"shape", "size", "dtype", "device", "ndim", "dim", "finfo", "len", "numel"}


CLASS_CACHE = 1024
"""Attention-layer classes whose code reading (source, interface arguments, mask check) is kept, least recently
used dropped first: one entry per class, never per input; a process that loads every transformers family holds
under 1000 attention classes."""


class UnsupportedModelError(TypeError):
    """The model's attention does not go through transformers' attention interface alone."""


def refusal_message(model_or_class: Any, reason: str) -> str:
    name = model_or_class.__name__ if isinstance(model_or_class, type) else type(model_or_class).__name__
    return (f"{name} cannot host an attnbench variant: {reason}. Supported: transformers models whose every attention layer "
            f"calls transformers' attention interface ({INTERFACE}) and adds nothing of its own to the scores; checked: "
            f"{', '.join(checked_families())}")


@functools.lru_cache(maxsize=CLASS_CACHE)
def _forward_source(cls: type) -> str | None:
    try:
        return textwrap.dedent(inspect.getsource(cls.forward))
    except (OSError, TypeError, AttributeError):
        return None


def calls_interface(cls: type) -> bool:
    """Whether the class's forward calls transformers' attention interface."""
    source = _forward_source(cls)
    return source is not None and INTERFACE in source


@functools.lru_cache(maxsize=CLASS_CACHE)
def interface_arguments(cls: type) -> dict[str, str]:
    """Keyword -> its expression's source, for every call of the attention interface in the class's forward (the
    function transformers' layers name `attention_interface`, or a call of `ALL_ATTENTION_FUNCTIONS[...]`)."""
    source = _forward_source(cls)
    if source is None:
        return {}
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = ast.unparse(node.func)
        if "attention_interface" in called or INTERFACE in called:
            found.update({kw.arg: ast.unparse(kw.value) for kw in node.keywords if kw.arg is not None})
    return found


def _mask_expression(call: ast.Call) -> ast.expr | None:
    """The mask argument of an attention-interface call: `attention_mask=...` or the fifth positional argument
    (module, query, key, value, mask)."""
    for kw in call.keywords:
        if kw.arg == "attention_mask":
            return kw.value
    return call.args[4] if len(call.args) > 4 else None


def _is_shape_read(node: ast.AST) -> bool:
    """An expression that reads only sizes, dtypes or devices (`x.shape[-1]`, `torch.finfo(x.dtype).min`)."""
    text = ast.unparse(node)
    return any(re.search(rf"\b{word}\b", text) for word in SHAPE_READS) or isinstance(node, ast.Constant)


def _bias_in(node: ast.AST) -> str | None:
    """Why an expression puts values into scores: arithmetic between two tensors (not sizes), or a read of a name
    that says bias/position; None when it only selects, combines or fills masks."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ARITHMETIC) \
                and not _is_shape_read(sub.left) and not _is_shape_read(sub.right):
            return f"its mask is computed as {ast.unparse(sub)}"
        if isinstance(sub, (ast.Name, ast.Attribute, ast.keyword)):
            word = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else sub.arg
            if word and BIAS_WORDS.search(word) and not word.endswith(("_ids", "indices")):  # positions as indices select
                return f"its mask reads {word}"
    return None


@functools.lru_cache(maxsize=CLASS_CACHE)
def mask_bias(cls: type) -> str | None:
    """Why the class's forward hands the attention interface a mask that carries a bias of its own (Swin:
    `relative_position_bias + attention_mask`), or None. The mask argument is followed back through the
    forward's assignments to the names it is built from; a further mask combined into it (a name that says
    mask) is taken as the mask it says it is, and its values are checked at each forward (dispatch.boolean_mask)."""
    source = _forward_source(cls)
    return None if source is None else source_mask_bias(source)


def source_mask_bias(source: str) -> str | None:
    """mask_bias for a forward's source code."""
    tree = ast.parse(source)
    assignments: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        assignments.setdefault(name.id, []).append(node)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = ast.unparse(node.func)
        if "attention_interface" not in called and INTERFACE not in called:
            continue
        mask = _mask_expression(node)
        pending, seen = [mask] if mask is not None else [], set()
        while pending:
            expression = pending.pop()
            why = _bias_in(expression)
            if why is not None:
                return why
            for name in {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)} - seen:
                seen.add(name)
                if "mask" in name.lower() and expression is not mask:
                    continue  # another mask combined in (DeepSeek's top-k index mask): selecting, not scoring
                for assignment in assignments.get(name, ()):
                    if isinstance(assignment, ast.AugAssign) and isinstance(assignment.op, ARITHMETIC):
                        return f"its mask is updated by {ast.unparse(assignment)}"
                    pending.append(assignment.value)
    return None


def _passed_value(module: nn.Module, expression: str) -> Any:
    """The value an argument expression of the form `self.x` or `self.config.x` has on this module; anything else
    (a local variable) counts as passed."""
    parts = expression.split(".")
    if parts[0] != "self" or len(parts) == 1:
        return True
    value: Any = module
    for part in parts[1:]:
        value = getattr(value, part, None)
    return value


def is_transformers_module(module: nn.Module) -> bool:
    return type(module).__module__.startswith("transformers.")


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every module whose forward calls transformers' attention interface."""
    return [(name, m) for name, m in model.named_modules() if is_transformers_module(m) and calls_interface(type(m))]


def own_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules named as attention (class name with "Attention") that hold weights and compute attention without
    the interface: neither they nor any module inside them calls it, and they are not inside one that does."""
    interface = {name for name, _ in attention_modules(model)}
    found = []
    for name, module in model.named_modules():
        if not is_transformers_module(module) and not isinstance(module, nn.MultiheadAttention):
            continue
        if "Attention" not in type(module).__name__ and not isinstance(module, nn.MultiheadAttention):
            continue
        if name in interface or not any(True for _ in module.parameters()):
            continue
        prefix = f"{name}." if name else ""
        inside = any(name.startswith(f"{i}.") for i in interface if i)
        wraps = any(i.startswith(prefix) for i in interface)
        if not inside and not wraps:
            found.append((name, module))
    return found


def check_class(cls: type, config: Any = None) -> None:
    """Refuse, before its layers are built, a class whose attention is not dispatched by name (transformers' own
    test of the class's code, `_can_set_attn_implementation`: Falcon would otherwise fail with a KeyError from its
    own table of attention classes) or whose attention classes pass the interface what a variant does not take,
    as `config` sets it (Gemma-2's soft-capping is off when its config says None)."""
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        own = _own_attention_classes(cls.__module__)
        what = f"its {', '.join(own)} compute{'s' if len(own) == 1 else ''} attention itself" if own else \
            f"the attention classes of {cls.__module__} do not all call the interface"
        raise UnsupportedModelError(refusal_message(cls, what))
    for layer in _module_classes(cls.__module__):
        if calls_interface(layer):
            why = mask_bias(layer)
            if why is not None:
                raise UnsupportedModelError(refusal_message(cls, _bias_reason(layer.__name__, why)))
            for argument, expression in interface_arguments(layer).items():
                if argument in SCORE_ARGUMENTS and _configured(config, expression) is not None:
                    raise UnsupportedModelError(refusal_message(
                        cls, f"its {layer.__name__} passes the interface {argument}={expression}, {SCORE_ARGUMENTS[argument]}, "
                             f"which attnbench variants do not take"))


def _bias_reason(layer: str, why: str) -> str:
    return (f"its {layer} adds a bias of its own to the attention scores through the mask it passes the interface ({why}); "
            f"attnbench variants take a mask as attend-or-not only, so the bias would be dropped and its parameters "
            f"would not train")


def _configured(config: Any, expression: str) -> Any:
    """What an argument expression `self.x` / `self.config.x` will be, read from the config a layer copies it from;
    anything else (a local variable, an attribute the config does not have) counts as passed."""
    parts = expression.split(".")
    name = parts[-1] if parts[0] == "self" and len(parts) in (2, 3) and (len(parts) == 2 or parts[1] == "config") else None
    if name is None or config is None:
        return True
    return getattr(config, name, True)


def _module_classes(module_name: str) -> list[type]:
    import sys

    namespace = vars(sys.modules.get(module_name, object()))
    return [value for value in namespace.values()
            if isinstance(value, type) and issubclass(value, nn.Module) and value.__module__ == module_name]


def _own_attention_classes(module_name: str) -> list[str]:
    """The attention classes (named "...Attention...") of a modeling module whose forward does not call the interface."""
    return sorted(value.__name__ for value in _module_classes(module_name)
                  if "Attention" in value.__name__ and "forward" in vars(value) and not calls_interface(value))


def check_supported(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's attention modules, or UnsupportedModelError naming the model, the layer and the reason."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise UnsupportedModelError(refusal_message(model, "it is not a transformers model (PreTrainedModel)"))
    check_class(type(model), model.config)
    own = own_attention_modules(model)
    if own:
        name, module = own[0]
        raise UnsupportedModelError(refusal_message(
            model, f"its {type(module).__name__} ({name or 'the model'}) computes attention itself, not through the interface"))
    found = attention_modules(model)
    if not found:
        raise UnsupportedModelError(refusal_message(model, "none of its layers calls the interface"))
    for name, module in found:
        why = mask_bias(type(module))
        if why is not None:
            raise UnsupportedModelError(refusal_message(model, _bias_reason(f"{type(module).__name__} ({name})", why)))
        for argument, expression in interface_arguments(type(module)).items():
            if argument in SCORE_ARGUMENTS and _passed_value(module, expression) is not None:
                raise UnsupportedModelError(refusal_message(
                    model, f"its {type(module).__name__} ({name}) passes the interface {argument}={expression}, "
                           f"{SCORE_ARGUMENTS[argument]}, which attnbench variants do not take"))
    return found
