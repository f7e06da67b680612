"""Any registered attnbench variant inside any Hugging Face transformers model, by either of two doors.

    from modules.hf import use_attention, attention_terms
    model = use_attention(AutoModel.from_pretrained("albert-base-v2"), "entmax15", alpha=1.3)
    out = model(**batch); terms = attention_terms(model)   # terms.loss: the weighted aux losses (or None)

    from modules.hf import register
    register()   # then attn_implementation="attnbench-<variant>" at from_pretrained / from_config
    model = AutoModelForSequenceClassification.from_pretrained(path, attn_implementation="attnbench-align-ct")

Both doors give the same kernels at the same sites, the same per-forward trace and the same losses (install.py).
The variant enters through transformers' own attention registry (`AttentionInterface`, with an
`AttentionMaskInterface` entry under the same name): the model's projections, residuals, norms, rotary
embeddings, caches and dropout placement stay the library's code, and only the attention function, the
scores -> weights -> values step, is the variant's (dispatch.py). Every attention module gets its own kernel as
a submodule (`attnbench_kernel`), so `model.parameters()` holds the kernels' parameters, an optimiser trains
them, and `save_pretrained` writes them with the variant named in config.json; `from_pretrained` rebuilds them.
Models whose attention does not go through the interface alone are refused by name (support.py); families.py
lists the families checked. `modules.hf.trainer.AttnbenchTrainer` adds the variant's losses to a `Trainer`'s.

Importing this package imports neither transformers nor torch_geometric; the functions import transformers
when called.
"""

from .dispatch import KERNEL, Recorder
from .families import FAMILIES, checked_families
from .install import (
    CONFIG_KEY,
    PREFIX,
    Trace,
    build_kernel,
    implementation_name,
    install,
    kernels,
    register,
    saved_implementation_name,
    site_of,
    trace,
    use_attention,
    variant_of,
    variant_spec,
    weights_formed,
)
from .support import UnsupportedModelError, attention_modules, check_supported
from .terms import AttentionTerms, attention_terms

__all__ = [
    "AttentionTerms", "CONFIG_KEY", "FAMILIES", "KERNEL", "PREFIX", "Recorder", "Trace", "UnsupportedModelError",
    "attention_modules", "attention_terms", "build_kernel", "check_supported", "checked_families", "implementation_name",
    "install", "kernels", "register", "saved_implementation_name", "site_of", "trace", "use_attention", "variant_of",
    "variant_spec", "weights_formed",
]
