"""Every family of modules/hf/families.py, the list refusals name as checked: softmax through attnbench is the
model's own eager attention on padded (and causal) inputs, by the registration door, and every attention module
holds a kernel at the site its layer implies. Tiny configs, offline."""

from __future__ import annotations

import pytest
import torch

from modules.attention import AttentionSite
from modules.hf import FAMILIES, kernels, register

VOCAB = 60


def inputs(kind: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (2, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    pixels = torch.randn(2, 3, 16, 16, generator=generator)
    return {
        "tokens": {"input_ids": ids, "attention_mask": mask},
        "image": {"pixel_values": pixels},
        "tokens+image": {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels},
        "seq2seq": {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :5]},
        "audio": {"input_features": torch.randn(2, 8, 16, generator=generator), "decoder_input_ids": ids[:, :5]},
    }[kind]


def outputs(out, kind: str, mask: torch.Tensor | None) -> list[torch.Tensor]:
    """The outputs that padding leaves defined: the rows of real tokens (a padded token's row is free to differ)."""
    if kind == "tokens+image":
        return [out.text_embeds, out.image_embeds]
    x = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    return [x[mask.bool()] if kind == "tokens" and mask is not None else x]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_softmax_through_the_registration_door_is_the_models_own_eager_attention(family):
    import transformers

    register("softmax")
    spec = FAMILIES[family]
    cls = getattr(transformers, spec.model)
    torch.manual_seed(0)
    reference = (cls.from_config(spec.config()) if spec.model.startswith("Auto") else cls(spec.config())).eval()
    converted = (cls.from_config(spec.config(), attn_implementation="attnbench-softmax") if spec.model.startswith("Auto")
                 else cls._from_config(spec.config(), attn_implementation="attnbench-softmax")).eval()
    converted.load_state_dict(reference.state_dict())
    batch = inputs(spec.inputs)
    with torch.no_grad():
        expected = outputs(reference(**batch), spec.inputs, batch.get("attention_mask"))
        got = outputs(converted(**batch), spec.inputs, batch.get("attention_mask"))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=0)
    found = kernels(converted)
    modules = [m for m in converted.modules() if hasattr(m, "attnbench_kernel")]
    assert found and len(found) == len(modules)
    sites = {k.site for k in found}
    if spec.inputs == "image":
        assert sites == {AttentionSite("vision-language", "self")}
    elif spec.inputs in ("tokens", "seq2seq") and not spec.causal:
        assert AttentionSite("text", "self", sequence=True) in sites
    if spec.inputs in ("seq2seq", "audio"):
        assert any(site.role == "cross" for site in sites)
