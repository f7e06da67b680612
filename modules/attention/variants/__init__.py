"""Built-in variants: one file each, registered on import. Adding one = one file + one line here."""

from . import softmax  # noqa: F401
