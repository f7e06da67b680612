"""Registry of attention variants: `@register_attention`, `list_attentions`, `build_attention`."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..registry import Registry, keyed_version
from .kernel import AttentionConfig, AttentionKernel, AttentionSite, HeadShape

ENTRY_POINT_GROUP = "attnbench.attention"


@dataclass(frozen=True)
class AttentionEntry:
    cls: type[AttentionKernel]
    preset: Mapping[str, Any] = field(default_factory=dict)
    """Config values fixed by the name, e.g. bam-weibull = BAM with distribution='weibull'."""
    summary: str = ""

    @property
    def version(self) -> str:
        """What run keys record as the variant's version (modules/registry.py's keyed_version: a plugin's
        includes a hash of its source)."""
        return keyed_version(self.cls, AttentionKernel)


ATTENTIONS: Registry[AttentionEntry] = Registry("attention variant", ENTRY_POINT_GROUP)


def register_attention(name: str, **preset: Any):
    """Class decorator registering an AttentionKernel under `name`, with config values `preset` fixed.

    Stack it to register one class under several names (e.g. one per distribution)."""

    def decorator(cls: type[AttentionKernel]) -> type[AttentionKernel]:
        if not (isinstance(cls, type) and issubclass(cls, AttentionKernel)):
            raise TypeError(f"@register_attention({name!r}) must decorate an AttentionKernel subclass")
        _check_fields(name, cls.Config, preset)
        ATTENTIONS.register(name, AttentionEntry(cls, dict(preset), first_paragraph(cls.__doc__)))
        return cls

    return decorator


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph on one line: a summary whose sentence runs onto a second line is kept whole."""
    paragraph = inspect.cleandoc(doc or "").split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def list_attentions(pattern: str | None = None) -> list[str]:
    return ATTENTIONS.names(pattern)


def attention_entry(name: str) -> AttentionEntry:
    return ATTENTIONS.get(name)


def resolve_config(spec: str | Mapping[str, Any]) -> tuple[str, AttentionConfig]:
    """A variant spec ("name" or {"name": ..., **overrides}) -> (name, the full frozen config)."""
    if isinstance(spec, str):
        spec = {"name": spec}
    spec = dict(spec)
    try:
        name = spec.pop("name")
    except KeyError:
        raise ValueError(f"attention spec {spec} has no 'name'; write e.g. {{name: softmax}}") from None
    entry = ATTENTIONS.get(name)
    _check_fields(name, entry.cls.Config, spec)
    fixed = {k: v for k, v in spec.items() if k in entry.preset and v != entry.preset[k]}
    if fixed:
        raise ValueError(f"{name!r} fixes {sorted(fixed)} by its name; choose the variant name that has the value you want")
    overrides = {k: v for k, v in spec.items() if v is not None}  # None means "the default"
    try:
        config = entry.cls.Config(**{**entry.preset, **overrides})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad config for attention {name!r}: {exc}") from exc
    return name, config


def suggest_config(name: str, trial: Any) -> dict[str, Any]:
    """The variant's Optuna search space for this name: what its name fixes is not searched."""
    entry = ATTENTIONS.get(name)
    return {k: v for k, v in entry.cls.Config.suggest(trial).items() if k not in entry.preset}


def build_attention(
    spec: str | Mapping[str, Any], *, num_heads: int, head_dim: int, site: AttentionSite | None = None
) -> AttentionKernel:
    """The kernel for `spec` at `site` (default: a site that says nothing, where the config's own defaults apply)."""
    name, config = resolve_config(spec)
    kernel = ATTENTIONS.get(name).cls(config, HeadShape(num_heads, head_dim, site or AttentionSite()))
    kernel.name = name
    return kernel


REPRESENTATIVE_SITES: dict[str, AttentionSite] = {
    "graph self": AttentionSite("graph", "self"),
    "text self": AttentionSite("text", "self", sequence=True),
    "vision-language self-sequence": AttentionSite("vision-language", "self", sequence=True),
    "vision-language self-grid": AttentionSite("vision-language", "self"),
    "vision-language cross": AttentionSite("vision-language", "cross"),
    "vision-language pool": AttentionSite("vision-language", "pool"),
}
"""One site of each kind the hosts have: GAT layers, text-encoder layers, the VQA/captioning question or
caption self-attention, image-grid self-attention, caption -> grid cross-attention and attention pooling."""


def describe_defaults(spec: str | Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The config a kernel of `spec` gets at each representative site, after per-host defaults
    (site label -> resolved config as a dict), so a user can see what a variant runs with on each host."""
    _, config = resolve_config(spec)
    return {label: config.for_site(site).to_dict() for label, site in REPRESENTATIVE_SITES.items()}


def _check_fields(name: str, config_cls: type[AttentionConfig], values: Mapping[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(
            f"attention {name!r} has no option(s) {sorted(unknown)}; its options are {sorted(known) or 'none'}"
        )


def search_space_options(name: str) -> list[str]:
    """The option names variant `name`'s search space suggests (what its name fixes excluded), read by asking a
    throw-away in-memory Optuna study for one trial: `suggest` is code, so asking it is the only sure way to know.
    Here, beside `suggest_config`, so that planning can ask it without importing the tuning study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return sorted(suggest_config(name, optuna.create_study().ask()))
