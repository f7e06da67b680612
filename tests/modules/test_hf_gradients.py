"""Nothing of a model is dropped silently by either door: every host parameter that trains in the plain model
trains with a variant, every kernel parameter a layer keeps trainable gets a gradient (what DistributedDataParallel
with its default settings needs), and a model that adds a bias of its own to the scores (Swin) is refused when it
is built, by both doors, naming the class and the layer. Tiny configs, offline."""

from __future__ import annotations

import pytest
import torch

from modules.attention import list_attentions
from modules.hf import FAMILIES, KERNEL, UnsupportedModelError, attention_terms, checked_families, register, use_attention
from tests.modules.test_hf_families import inputs

VARIANTS = list_attentions()


def build(family: str, implementation: str | None = None):
    import transformers

    spec = FAMILIES[family]
    cls = getattr(transformers, spec.model)
    torch.manual_seed(0)
    if implementation is None:
        return cls.from_config(spec.config()) if spec.model.startswith("Auto") else cls(spec.config())
    return (cls.from_config(spec.config(), attn_implementation=implementation) if spec.model.startswith("Auto")
            else cls._from_config(spec.config(), attn_implementation=implementation))


def trained(model, family: str) -> tuple[set[str], set[str]]:
    """(parameters with a gradient, parameters that require one) after one training forward and backward of
    the outputs (and the variant's weighted aux losses)."""
    model.train()
    out = model(**inputs(FAMILIES[family].inputs))
    if getattr(out, "text_embeds", None) is not None:
        loss = out.text_embeds.pow(2).mean() + out.image_embeds.pow(2).mean()
    else:
        x = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        loss = x.pow(2).mean()
    if any(KERNEL in name for name, _ in model.named_parameters()):
        terms = attention_terms(model, epoch=0)
        if terms.loss is not None:
            loss = loss + terms.loss
    loss.backward()
    return ({n for n, p in model.named_parameters() if p.grad is not None},
            {n for n, p in model.named_parameters() if p.requires_grad})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_host_parameter_trains_as_in_the_plain_model_and_every_trainable_kernel_parameter_is_read(family):
    """Per checked family and variant, by both doors: the host parameters with a gradient are the plain model's
    (Swin's position table lost its, silently, before Swin was refused), and every parameter left trainable gets
    a gradient at the first step (fenchel's degree coupling at ViT's layers and BART's cross-attention did not:
    DistributedDataParallel then fails at step 2)."""
    register()
    plain, _ = trained(build(family), family)
    for variant in VARIANTS:
        for door, model in (("use_attention", use_attention(build(family), variant)),
                            ("attn_implementation", build(family, f"attnbench-{variant}"))):
            with_grad, trainable = trained(model, family)
            host = {n for n in with_grad if KERNEL not in n}
            assert host == plain, (variant, door, sorted(host ^ plain))
            unread = {n for n in trainable - with_grad if KERNEL in n}
            assert not unread, (variant, door, sorted(unread))


def swin(depths):
    import transformers

    config = transformers.SwinConfig(image_size=16, patch_size=2, embed_dim=16, depths=depths, num_heads=[2, 4], window_size=2,
                                     num_labels=2)
    return transformers.SwinForImageClassification, config


@pytest.mark.parametrize("depths", [[1, 1], [2, 2]], ids=["windows", "shifted-windows"])
def test_a_model_that_adds_a_bias_to_its_scores_is_refused_when_built_by_either_door(depths):
    """Swin hands the interface its relative-position table added to the (shifted-window) mask. Was: depths [1,1]
    trained with the table's gradient None, silently; [2,2] failed at the first forward naming no class or layer."""
    cls, config = swin(depths)
    with pytest.raises(UnsupportedModelError) as by_name:
        use_attention(cls(config), "sparsemax")
    register("sparsemax")
    with pytest.raises(UnsupportedModelError) as at_load:
        cls._from_config(config, attn_implementation="attnbench-sparsemax")
    supported = ", ".join(checked_families())
    for refused in (by_name, at_load):
        message = str(refused.value)
        assert message.startswith("SwinForImageClassification cannot host") and "SwinAttention" in message
        assert "relative_position_bias" in message and supported in message


def test_the_mask_check_follows_the_mask_back_through_the_forward():
    """The static check reads the layer's code: a bias added to the mask, or a mask that takes values of its own,
    is found however it is spelled; masks combined by masking operations (DeepSeek's top-k index mask) pass."""
    from modules.hf.support import source_mask_bias

    biased = {
        "def forward(self, x, attention_mask):\n    m = self.table() + attention_mask\n    return attention_interface(self, q, k, v, m)\n":
            "its mask",
        "def forward(self, x, attention_mask):\n    m = attention_mask\n    m += self.rel\n    return attention_interface(self, q, k, v, attention_mask=m)\n":
            "updated by",
        "def forward(self, x, attention_mask):\n    s = q @ k\n    return attention_interface(self, q, k, v, s)\n": "q @ k",
        "def forward(self, x, dt_states, attention_mask):\n    m = self.prepare(dt_states=dt_states, attention_mask=attention_mask)\n"
        "    return attention_interface(self, q, k, v, m)\n": "dt_states",
    }
    for source, why in biased.items():
        found = source_mask_bias(source)
        assert found is not None and why in found, source
    plain = [
        "def forward(self, x, attention_mask):\n    return attention_interface(self, q, k, v, attention_mask)\n",
        "def forward(self, x, attention_mask, index):\n    index_mask = self.top(q + k)\n    attention_mask = attention_mask & ~index_mask\n"
        "    return attention_interface(self, q, k, v, attention_mask[:, :, :, : k.shape[-2] - 0])\n",
        "def forward(self, x, attention_mask):\n    m = attention_mask.masked_fill(attention_mask == 0, torch.finfo(x.dtype).min)\n"
        "    return attention_interface(self, q, k, v, attention_mask=m, position_ids=position_ids)\n",
    ]
    for source in plain:
        assert source_mask_bias(source) is None, source


def test_a_learned_bias_in_a_mask_at_a_forward_is_refused_naming_the_layer():
    """The forward-time check behind the static one: a float mask that carries a gradient is a learned bias,
    zero or not (a fresh Swin table is zero, and passed the value check)."""
    from modules.hf.dispatch import attention

    model = use_attention(build("vit"), "softmax")
    name, module = next((n, m) for n, m in model.named_modules() if hasattr(m, KERNEL))
    q = torch.randn(1, 4, 5, 8)
    bias = torch.zeros(1, 1, 5, 5, requires_grad=True)
    with pytest.raises(UnsupportedModelError, match=rf"ViTAttention \({name}\): the model adds a learned bias"):
        attention(module, q, q, q, bias, variant="softmax")


def test_a_per_pair_mask_at_a_layer_that_froze_what_it_reads_stops_naming_the_parameter_and_the_fix():
    """fenchel's degree coupling is frozen at ViT's (non-causal) layers; a per-pair mask handed to one in a training
    forward would read it while frozen, so the forward stops with the parameter and the fix named. Once unfrozen
    as the message says, it trains."""
    from modules.hf.dispatch import attention

    model = use_attention(build("vit"), "fenchel").train()
    name, module = next((n, m) for n, m in model.named_modules() if hasattr(m, KERNEL))
    q = torch.randn(1, 4, 5, 8, requires_grad=True)
    pairs = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()
    with pytest.raises(RuntimeError, match=rf"\({name}\): fenchel's degree_weight was frozen .*requires_grad_\(True\)"):
        attention(module, q, q, q, pairs, variant="fenchel")
    with torch.no_grad():
        attention(module, q, q, q, pairs, variant="fenchel")  # reading it without training is fine
    model.get_submodule(name).attnbench_kernel.degree_weight.requires_grad_(True)
    out, _ = attention(module, q, q, q, pairs, variant="fenchel")
    out.sum().backward()
    assert getattr(module, KERNEL).degree_weight.grad is not None
