"""Typed configuration: task Params and variant Configs are frozen dataclasses whose annotations declare each
field's type and range (`Annotated[int, Ge(1)]`, with annotated_types' Ge/Gt/Le/Lt, which pydantic reads);
`validate_fields` checks user values against them with pydantic before anything is built or run.

pydantic does the type work (it parses "5e-5" as a float and refuses "abc" for an int); this module only
turns its error into one line that names the key, the value and what was expected."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Mapping

import annotated_types

BOUND_SYMBOLS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="), (annotated_types.Lt, "lt", "<"),
                 (annotated_types.Le, "le", "<="))


class ConfigError(ValueError):
    """One bad configuration value: which key, which value, what was expected. `where` (the flag or suite
    entry it came from) is filled in by whoever knows it."""

    def __init__(self, owner: str, key: str, value: Any, expected: str, where: str = "", known: tuple[str, ...] = (), noun: str = "key"):
        self.owner, self.key, self.value, self.expected, self.where = owner, key, value, expected, where
        self.known, self.noun = known, noun
        """For an unknown key: the keys there are, and what the owner calls them ("parameter", "option")."""
        super().__init__(self.line())

    def line(self) -> str:
        source = f" ({self.where})" if self.where else ""
        if self.known:
            given = f"{self.key}={self.value!r}{', ' + self.where if self.where else ''}"
            return (f"{self.owner} has no {self.noun} {self.key!r} (given {given}); "
                    f"its {self.noun}s are {', '.join(self.known)}")
        return f"{self.owner}: {self.key}={self.value!r}{source}: expected {self.expected}"

    def at(self, where: str) -> "ConfigError":
        return ConfigError(self.owner, self.key, self.value, self.expected, where, self.known, self.noun)


@functools.lru_cache(maxsize=None)
def field_annotations(cls: type) -> dict[str, Any]:
    """Field name -> its annotation with the range metadata kept (the modules use postponed annotations)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


@functools.lru_cache(maxsize=None)
def _adapter(annotation: Any):
    import pydantic

    # strict=False: YAML and --set give strings for exponents without a dot ("5e-5"); pydantic reads them as numbers.
    return pydantic.TypeAdapter(annotation)


def split_type(annotation: Any) -> tuple[str, str]:
    """`Annotated[float | None, Gt(0)]` -> ("float or None", "> 0"): the type and the declared range."""
    bounds = []
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *metadata = typing.get_args(annotation)
        for item in metadata:
            for cls, attribute, symbol in BOUND_SYMBOLS:
                if isinstance(item, cls):
                    bounds.append(f"{symbol} {getattr(item, attribute)}")
            if isinstance(item, annotated_types.Interval):
                bounds += [f"{symbol} {getattr(item, attribute)}" for _, attribute, symbol in BOUND_SYMBOLS
                           if getattr(item, attribute) is not None]
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    members = typing.get_args(annotation) if union else (annotation,)
    names = [getattr(m, "__name__", str(m)) for m in members if m is not type(None)]
    return " or ".join(names) + (" or None" if type(None) in members else ""), " and ".join(bounds)


def describe_type(annotation: Any) -> str:
    """`Annotated[float | None, Gt(0)]` -> "float > 0 or None"; what an error message says was expected."""
    type_text, range_text = split_type(annotation)
    if not range_text:
        return type_text
    if type_text.endswith(" or None"):
        return f"{type_text.removesuffix(' or None')} {range_text} or None"
    return f"{type_text} {range_text}"


def validate_fields(cls: type, values: Mapping[str, Any], owner: str, noun: str = "key") -> dict[str, Any]:
    """Check `values` (a subset of `cls`'s fields) against their annotations; returns them with strings
    parsed into numbers where the field is numeric. Raises ConfigError for an unknown key or a bad value.

    A value that already has a valid type is returned as given (an int for a float field stays an int), so
    that the run keys of existing records, which hash these values, do not change."""
    return validate_values(field_annotations(cls), values, owner, noun)


def validate_values(annotations: Mapping[str, Any], values: Mapping[str, Any], owner: str, noun: str = "key") -> dict[str, Any]:
    """validate_fields against field name -> annotation (the CLI's catalogue has them without the classes)."""
    import pydantic

    checked = {}
    for key, value in values.items():
        if key not in annotations:
            raise ConfigError(owner, key, value, "a known key", known=tuple(sorted(annotations)) or ("none",), noun=noun)
        annotation = annotations[key]
        if isinstance(value, bool) and not _allows_bool(annotation):
            raise ConfigError(owner, key, value, describe_type(annotation))
        try:
            parsed = _adapter(annotation).validate_python(value)
        except pydantic.ValidationError:
            raise ConfigError(owner, key, value, describe_type(annotation)) from None
        checked[key] = parsed if isinstance(value, str) else value
    return checked


def _allows_bool(annotation: Any) -> bool:
    """pydantic's lax mode reads True as 1 for an int field; a flag given to a count is a mistake here."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation is bool or bool in typing.get_args(annotation) or annotation is Any
