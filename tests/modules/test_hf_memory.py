"""Memory stays flat over forwards at random lengths, for every variant: no kernel or door keeps something per
sequence length or shape without bound (fenchel kept an int64 bucket table per (Lq, Lk) per kernel: 342 MB per
kernel after lengths 1..512, about 4 GB for a 12-layer model). Counted as the bytes of every live CPU tensor
(found by the garbage collector: caches anywhere, in a kernel, a module global or the door), not RSS, which the
allocator and other processes make noisy."""

from __future__ import annotations

import gc
import random

import torch

from modules.attention import list_attentions
from modules.hf import FAMILIES, use_attention
from modules.hf.dispatch import attention

FORWARDS = 200
LONGEST = 512
MARGIN = 64 * 1024
"""Bytes the variants' forwards may leave alive beyond what the plain model's leave: a few small tensors (a
per-head-dim constant), far under one bucket table of a single length (2 MB at 512)."""


def live_tensor_bytes() -> int:
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            try:
                pointer = storage.data_ptr()
            except RuntimeError:  # a fake or functional tensor (torch.compile's caches from earlier tests) holds no memory
                continue
            storages[pointer] = storage.nbytes()
    return sum(storages.values())


def layer_calls():
    """(name, call) per variant and the plain model: one BERT self-attention layer (a token-sequence site, where
    fenchel's position prior runs) through the door's attention function, or transformers' own eager one."""
    import transformers
    from transformers.models.bert.modeling_bert import eager_attention_forward

    config = FAMILIES["bert"].config()
    config.update(dict(hidden_size=8, num_attention_heads=1, intermediate_size=16, num_hidden_layers=1, max_position_embeddings=LONGEST))
    calls = []
    for variant in [None, *list_attentions()]:
        torch.manual_seed(0)
        model = transformers.BertModel(config)
        if variant is not None:
            use_attention(model, variant)
        layer = model.eval().encoder.layer[0].attention.self
        if variant is None:
            calls.append(("plain", model, lambda q, layer=layer: eager_attention_forward(layer, q, q, q, None, scaling=0.5)))
        else:
            calls.append((variant, model, lambda q, layer=layer, variant=variant: attention(layer, q, q, q, None, scaling=0.5, variant=variant)))
    return calls


def run(call, lengths) -> None:
    with torch.no_grad():
        for length in lengths:
            call(torch.randn(1, 1, length, 8))


def test_memory_stays_flat_over_forwards_at_random_lengths_for_every_variant():
    calls = layer_calls()
    draw = random.Random(0)
    lengths = [draw.randint(1, LONGEST) for _ in range(FORWARDS)]
    for _, _, call in calls:
        run(call, [LONGEST])  # warm: whatever is sized by the longest length is there before the count
    plain = calls[0][2]
    before = live_tensor_bytes()
    run(plain, lengths)
    plain_growth = live_tensor_bytes() - before
    before = live_tensor_bytes()
    for _, _, call in calls[1:]:
        run(call, lengths)
    growth = live_tensor_bytes() - before
    if growth > max(plain_growth, 0) + MARGIN:
        # which variant: counted one by one only when the total is over
        grown = {}
        for name, _, call in calls[1:]:
            start = live_tensor_bytes()
            run(call, [draw.randint(1, LONGEST) for _ in range(FORWARDS // 4)])
            grown[name] = live_tensor_bytes() - start
        raise AssertionError(f"live tensors grew {growth} bytes over {FORWARDS} forwards per variant (plain model: {plain_growth}); "
                             f"by variant over {FORWARDS // 4} more: {grown}")
