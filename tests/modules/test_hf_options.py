"""Options given through `config.attnbench` with attn_implementation="attnbench-<variant>" reach the kernels, or
are refused with the reason, never dropped; the saved config holds what the kernels used. Tiny BERT, offline."""

from __future__ import annotations

import json

import pytest
import torch

from modules.hf import FAMILIES, kernels, register, use_attention


def config_with(entry):
    config = FAMILIES["bert"].config()
    config.attnbench = entry
    return config


def registered(entry):
    import transformers

    register()
    torch.manual_seed(0)
    return transformers.BertModel._from_config(config_with(entry), attn_implementation="attnbench-fenchel")


def test_options_through_the_config_reach_the_kernels_and_come_back_from_a_save(tmp_path):
    """Was: config.attnbench = {"alpha": 0.5} built kernels with alpha=None and became {"name": "fenchel"}."""
    import transformers

    model = registered({"alpha": 0.5, "learn_alpha": True}).eval()
    by_name = use_attention(transformers.BertModel(FAMILIES["bert"].config()), "fenchel", alpha=0.5, learn_alpha=True)
    assert [k.config for k in kernels(model)] == [k.config for k in kernels(by_name)]
    assert all(k.config.alpha == 0.5 and k.config.learn_alpha for k in kernels(model))
    assert model.config.attnbench == {"name": "fenchel", "alpha": 0.5, "learn_alpha": True}
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["attnbench"] == {"name": "fenchel", "alpha": 0.5, "learn_alpha": True}
    loaded = transformers.BertModel.from_pretrained(tmp_path).eval()
    assert [k.config for k in kernels(loaded)] == [k.config for k in kernels(model)]
    ids = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state, atol=0, rtol=0)


def test_an_entry_naming_its_variant_is_taken_as_it_is():
    model = registered({"name": "fenchel", "alpha": 2.0})
    assert all(k.config.alpha == 2.0 for k in kernels(model))


@pytest.mark.parametrize("entry, message", [
    ({"name": "entmax", "alpha": 1.5}, r"config.attnbench names the variant 'entmax' but the attention implementation is 'attnbench-fenchel'"),
    ({"alhpa": 0.5}, r"fenchel: has no option 'alhpa' \(did you mean 'alpha'\?\)"),
    ({"alpha": "big"}, r"fenchel: option alpha='big' \(str\) is not a float > 0 \(or None for the default\)"),
    ({"alpha": -1.0}, r"fenchel: option alpha=-1.0 \(float\) is not a float > 0"),
    ("fenchel", r"config.attnbench must be a mapping"),
], ids=["other-name", "unknown", "wrong-type", "out-of-range", "not-a-mapping"])
def test_an_entry_that_cannot_be_used_is_refused_with_the_reason(entry, message):
    """Was: a different name or an unknown option dropped silently, a wrong type failed with "'>' not supported
    between instances of 'str' and 'int'"."""
    with pytest.raises(ValueError, match=message):
        registered(entry)


def test_both_doors_refuse_an_option_with_the_same_message():
    import transformers

    for options in ({"alpha": "big"}, {"alhpa": 0.5}):
        with pytest.raises(ValueError) as by_name:
            use_attention(transformers.BertModel(FAMILIES["bert"].config()), "fenchel", **options)
        with pytest.raises(ValueError) as by_config:
            registered(options)
        assert str(by_name.value) == str(by_config.value)


def test_a_model_switched_to_another_variant_takes_the_new_one():
    """The entry the door wrote for the kernels a model has is theirs: set_attn_implementation to another variant
    replaces it rather than being refused as a clash."""
    import transformers

    model = use_attention(transformers.BertModel(FAMILIES["bert"].config()), "fenchel", alpha=0.5)
    model.set_attn_implementation("attnbench-entmax15")
    assert {k.name for k in kernels(model)} == {"entmax15"} and model.config.attnbench == {"name": "entmax15"}
