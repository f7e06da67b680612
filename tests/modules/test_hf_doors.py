"""The two doors into a transformers model (modules/hf): `use_attention(model, variant)` and
`attn_implementation="attnbench-<variant>"` after `register()` give the same kernels at the same sites, the same
per-forward trace, outputs and losses; what they refuse, they refuse alike; a saved model comes back with its
variant and its kernels' trained weights. Tiny models built from configs, offline."""

from __future__ import annotations

import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from modules.attention import AttentionSite, list_attentions
from modules.hf import (
    FAMILIES,
    UnsupportedModelError,
    attention_terms,
    checked_families,
    kernels,
    register,
    trace,
    use_attention,
    weights_formed,
)

REPO = Path(__file__).resolve().parents[2]
VARIANTS = list_attentions()
DOOR_FAMILIES = ["bert", "albert", "llama", "bart"]


def build(family: str, **implementation):
    """The family's tiny model from its config: eager, or with attn_implementation=... (the registration door)."""
    import transformers

    spec = FAMILIES[family]
    cls = getattr(transformers, spec.model)
    config = spec.config()
    return cls.from_config(config, **implementation) if spec.model.startswith("Auto") else cls._from_config(config, **implementation)


def batch(family: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 60, (3, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    if FAMILIES[family].inputs == "seq2seq":
        return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :5]}
    return {"input_ids": ids, "attention_mask": mask}


def first_output(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.fixture(scope="module", autouse=True)
def registered():
    register()


@pytest.mark.parametrize("family", DOOR_FAMILIES)
def test_both_doors_give_the_same_kernels_outputs_and_losses(family):
    """Every variant: the registration door's model, its weights loaded into a use_attention model (strictly: the
    same parameters), gives the same kernel sites, outputs and weighted aux losses in a training forward."""
    for variant in VARIANTS:
        torch.manual_seed(0)
        registered_model = build(family, attn_implementation=f"attnbench-{variant}").train()
        converted = use_attention(build(family), variant).train()
        converted.load_state_dict(registered_model.state_dict())
        assert [(k.name, k.site) for k in kernels(converted)] == [(k.name, k.site) for k in kernels(registered_model)]
        results = []
        for model in (registered_model, converted):
            torch.manual_seed(1)  # dropout and the stochastic variants' noise drawn alike
            out = first_output(model(**batch(family)))
            results.append((out, attention_terms(model).loss, len(trace(model))))
        (a, loss_a, calls_a), (b, loss_b, calls_b) = results
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=f"{variant} in {family}")
        assert (loss_a is None) == (loss_b is None) and calls_a == calls_b, variant
        if loss_a is not None:
            torch.testing.assert_close(loss_a, loss_b, atol=1e-7, rtol=1e-6, msg=f"{variant} in {family}")


def test_set_attn_implementation_on_a_built_model_is_the_same_door():
    """transformers' own switch on a built model gives it kernels as use_attention does (it ran without any before)."""
    switched = build("bert")
    switched.set_attn_implementation("attnbench-entmax15")
    converted = use_attention(build("bert"), "entmax15")
    converted.load_state_dict(switched.state_dict())
    assert [(k.name, k.site) for k in kernels(switched)] == [(k.name, k.site) for k in kernels(converted)]
    with torch.no_grad():
        torch.testing.assert_close(switched.eval()(**batch("bert")).last_hidden_state, converted.eval()(**batch("bert")).last_hidden_state)
    switched.set_attn_implementation("eager")  # and away again: a save would not claim the variant
    assert "attnbench" not in switched.config.to_json_string()


def test_cross_attention_and_patches_get_their_sites_by_either_door():
    """BART's decoder cross-attention is a cross site (no alignment or position prior there), ViT's patches are no
    token sequence (no position prior), by the registration door as by use_attention."""
    import transformers

    bart = build("bart", attn_implementation="attnbench-align-ct")
    sites = {name: module.attnbench_kernel.site for name, module in bart.named_modules() if hasattr(module, "attnbench_kernel")}
    assert all(site == AttentionSite("text", "cross") for name, site in sites.items() if name.endswith("encoder_attn"))
    assert sum(name.endswith("encoder_attn") for name in sites) == 2
    assert all(site == AttentionSite("text", "self", sequence=True) for name, site in sites.items() if not name.endswith("encoder_attn"))
    vit = transformers.ViTModel._from_config(FAMILIES["vit"].config(), attn_implementation="attnbench-fenchel")
    assert {k.site for k in kernels(vit)} == {AttentionSite("vision-language", "self")}
    assert all(not k.site.sequence for k in kernels(vit))


@pytest.mark.parametrize("variant", ["bam-weibull", "align-ct"])
def test_three_training_steps_through_the_registration_door(variant):
    """Was: 'Trying to backward through the graph a second time' at the second step, the per-layer results of
    earlier forwards kept and summed into the loss."""
    import transformers

    torch.manual_seed(0)
    config = FAMILIES["bert"].config()
    model = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation=f"attnbench-{variant}").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "attnbench_kernel" in n}
    inputs = {**batch("bert"), "labels": torch.tensor([0, 1, 1])}
    for _ in range(3):
        out = model(**inputs)
        terms = attention_terms(model)
        assert len(trace(model)) == config.num_hidden_layers  # this forward's calls only
        assert terms.loss is not None and torch.isfinite(terms.loss)
        (out.loss + terms.loss).backward()
        optimizer.step()
        optimizer.zero_grad()
    moved = [n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert not before or moved, "the kernels' parameters are the model's and train"


def test_evaluation_forwards_hold_one_forwards_results():
    """40 evaluation forwards of a variant that forms its weights (entmax15): the trace holds one forward's
    results, without their [B, H, L, L] weights, and the results of earlier forwards are freed."""
    model = build("bert", attn_implementation="attnbench-entmax15").eval()
    layers = model.config.num_hidden_layers
    earlier: list[weakref.ref] = []
    with torch.no_grad():
        for _ in range(40):
            model(**batch("bert"))
            pairs = trace(model)
            assert len(pairs) == layers and all(result.weights is None for _, result in pairs)
            earlier.extend(weakref.ref(value) for _, result in pairs for value in result.diagnostics.values())
    alive = sum(ref() is not None for ref in earlier)
    assert alive == sum(len(result.diagnostics) for _, result in trace(model)), "only the last forward's results are held"
    with torch.no_grad(), weights_formed(model):  # asked for, the weights are kept
        model(**batch("bert"))
    assert all(result.weights is not None and result.weights.shape[-1] == 7 for _, result in trace(model))


def test_activation_checkpointing_records_each_call_once_and_trains_the_terms():
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(FAMILIES["bert"].config(), attn_implementation="attnbench-align-ct").train()
    model.activation_checkpointing_enable()
    out = model(**batch("bert"))
    terms = attention_terms(model)
    (out.last_hidden_state.square().mean() + terms.loss).backward()
    assert len(trace(model)) == model.config.num_hidden_layers  # the backward's recomputation is not recorded again
    assert all(p.grad is not None for k in kernels(model) for p in k.parameters() if p.requires_grad)


def test_output_attentions_returns_the_maps():
    """softmax, whose fused path forms no weights, returns them when the model is asked: those of the model's
    own eager attention."""
    reference = build("bert").eval()
    model = build("bert", attn_implementation="attnbench-softmax").eval()
    model.load_state_dict(reference.state_dict(), strict=False)
    with torch.no_grad():
        got = model(**batch("bert"), output_attentions=True).attentions
        expected = reference(**batch("bert"), output_attentions=True).attentions
    assert len(got) == len(expected) == 2
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# ---- refusals ----------------------------------------------------------------------------------------------

def refused_configs():
    import transformers as t

    tiny = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=1, vocab_size=60)
    return {
        "BigBirdModel": (t.BigBirdModel, t.BigBirdConfig(attention_type="original_full", **tiny), "BigBirdSelfAttention"),
        "DebertaV2Model": (t.DebertaV2Model, t.DebertaV2Config(**tiny), "DisentangledSelfAttention"),
        "T5Model": (t.T5Model, t.T5Config(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4), "position_bias"),
        "Gemma2ForCausalLM": (t.Gemma2ForCausalLM, t.Gemma2Config(num_key_value_heads=2, head_dim=8, **tiny), "softcap"),
        "FalconForCausalLM": (t.FalconForCausalLM, t.FalconConfig(**tiny), "FalconAttention"),
    }


@pytest.mark.parametrize("name", ["BigBirdModel", "DebertaV2Model", "T5Model", "Gemma2ForCausalLM", "FalconForCausalLM"])
def test_a_model_that_does_not_dispatch_is_refused_by_either_door(name):
    """Was: BigBird and DeBERTa-v2 ran their own attention with no word (and BigBird added attnbench's boolean mask
    to its scores), T5 and Gemma-2 failed at the first forward, Falcon with a raw KeyError."""
    cls, config, layer = refused_configs()[name]
    supported = ", ".join(checked_families())
    with pytest.raises(UnsupportedModelError) as by_name:
        use_attention(cls(config), "sparsemax")
    with pytest.raises(UnsupportedModelError) as at_load:
        cls._from_config(config, attn_implementation="attnbench-sparsemax")
    for refused in (by_name, at_load):
        message = str(refused.value)
        assert message.startswith(f"{name} cannot host") and layer in message and supported in message


def test_refusal_names_exactly_the_checked_families():
    assert checked_families() == sorted(FAMILIES) and {"bert", "albert", "llama", "bart", "vit"} <= set(FAMILIES)


# ---- save and load -----------------------------------------------------------------------------------------

SAVED = [{"name": "fenchel", "alpha": 0.5, "learn_alpha": True}, {"name": "bam-weibull", "prior": "contextual"}, {"name": "align-ct"}]


def trained_look(model) -> None:
    """Kernel weights unlike any fresh kernel's, so that a dropped or re-initialised one changes the outputs."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for kernel in kernels(model):
            for p in kernel.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)


@pytest.mark.parametrize("spec", SAVED, ids=[s["name"] for s in SAVED])
def test_a_saved_model_comes_back_with_its_variant_and_weights(spec, tmp_path):
    import transformers

    torch.manual_seed(0)
    model = use_attention(transformers.AutoModelForSequenceClassification.from_config(FAMILIES["bert"].config()), spec).eval()
    trained_look(model)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attnbench"] == spec and saved["attn_implementation"].startswith(f"attnbench-{spec['name']} [")
    with torch.no_grad():
        before = model(**batch("bert")).logits
    for loaded in (transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path),
                   use_attention(transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, attn_implementation=f"attnbench-{spec['name']}"))):
        loaded.eval()
        assert [k.config for k in kernels(loaded)] == [k.config for k in kernels(model)]
        with torch.no_grad():
            torch.testing.assert_close(loaded(**batch("bert")).logits, before, atol=0, rtol=0)
        state = loaded.state_dict()
        assert all(torch.equal(state[n], v) for n, v in model.state_dict().items())


def test_a_plain_checkpoint_given_a_variant_gets_fresh_kernels(tmp_path):
    """MiniLM-style: a checkpoint without kernels, loaded with a variant: every kernel tensor the checkpoint lacks,
    and fenchel's unsaved α, is a fresh kernel's (transformers would leave empty memory there)."""
    import transformers

    transformers.BertModel(FAMILIES["bert"].config()).save_pretrained(tmp_path)
    config = transformers.BertConfig.from_pretrained(tmp_path)
    config.attnbench = {"name": "fenchel", "alpha": 2.0}  # options through the config
    loaded = transformers.BertModel.from_pretrained(tmp_path, config=config, attn_implementation="attnbench-fenchel")
    fresh = use_attention(transformers.BertModel(FAMILIES["bert"].config()), "fenchel", alpha=2.0)
    for got, expected in zip(kernels(loaded), kernels(fresh), strict=True):
        assert got.config == expected.config
        for (name, a), (_, b) in zip(list(got.named_parameters()) + list(got.named_buffers()),
                                     list(expected.named_parameters()) + list(expected.named_buffers()), strict=True):
            assert torch.equal(a, b), name


def test_a_saved_variant_fails_to_load_without_attnbench_saying_what_to_install(tmp_path):
    """Where attnbench is not installed (here: not imported, nothing registered), loading fails and says what to
    install and call; it never comes back as plain attention."""
    model = use_attention(build("bert"), "entmax15")
    model.save_pretrained(tmp_path)
    code = ("import transformers\n"
            f"transformers.AutoModel.from_pretrained({str(tmp_path)!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert "attnbench-entmax15" in done.stderr and "install attnbench" in done.stderr and "modules.hf.register()" in done.stderr


# ---- options and imports -----------------------------------------------------------------------------------

def test_an_option_of_the_wrong_type_is_named_with_the_type_it_needs():
    with pytest.raises(ValueError, match=r"entmax: option alpha='big' \(str\) is not a float > 1"):
        use_attention(build("bert"), "entmax", alpha="big")
    with pytest.raises(ValueError, match=r"fenchel: option alpha='big' \(str\) is not a float > 0 \(or None for the default\)"):
        use_attention(build("bert"), "fenchel", alpha="big")
    with pytest.raises(ValueError, match="has no option"):
        use_attention(build("bert"), "fenchel", alhpa=1.0)


def test_importing_the_package_imports_neither_transformers_nor_pyg():
    code = "import sys, modules.hf; print(sorted({'transformers', 'torch_geometric'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]" and "FutureWarning" not in done.stderr
