"""Built-in variants: one file each, registered on import. Adding one = one file + one line here."""

from . import softmax  # noqa: F401
from . import fenchel  # noqa: F401
from . import bam  # noqa: F401
from . import alignment  # noqa: F401
from . import entmax  # noqa: F401
from . import gmm  # noqa: F401
