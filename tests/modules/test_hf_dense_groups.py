"""The HF door's masks as the kernels get them (modules/hf/dispatch.dense_groups): a causal layer with fewer
queries than keys and no mask (queries are the last positions: query i sees keys up to i + Lk - Lq), and the
query validity a key-padding mask [B, 1, 1, L] gives self-attention (a padded token is no query either)."""

from __future__ import annotations

import torch

from modules.attention import AttentionSite
from modules.hf import use_attention
from modules.hf.dispatch import attention, dense_groups

TEXT = AttentionSite("text", "self", sequence=True)


def test_a_causal_mask_with_fewer_queries_than_keys_is_offset_to_the_last_positions():
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 7, 8)
    groups = dense_groups(None, q, k, TEXT, is_causal=True)
    expected = torch.tensor([[j <= i + 4 for j in range(7)] for i in range(3)])
    assert groups.mask.shape[-2:] == (3, 7) and torch.equal(groups.mask[0, 0], expected)
    # the last query sees every key, the first all but the last 2: without the offset it would see key 0 only
    assert bool(groups.mask[0, 0, -1].all()) and int(groups.mask[0, 0, 0].sum()) == 5


def test_a_causal_layer_given_no_mask_attends_as_transformers_eager_attention_does():
    """Through the door's attention function at a Llama layer (a cached decode: 2 new queries over 6 keys)."""
    import transformers
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from modules.hf import FAMILIES

    torch.manual_seed(0)
    model = use_attention(transformers.LlamaForCausalLM(FAMILIES["llama"].config()), "softmax").eval()
    layer = model.model.layers[0].self_attn
    q, k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 6, 8), torch.randn(1, 4, 6, 8)
    bias = torch.zeros(2, 6).masked_fill(~torch.ones(2, 6, dtype=torch.bool).tril(diagonal=4), float("-inf"))
    with torch.no_grad():
        got, _ = attention(layer, q, k, v, None, scaling=0.35, is_causal=True, variant="softmax")
        layer.num_key_value_groups = 1
        expected, _ = eager_attention_forward(layer, q, k, v, bias[None, None], scaling=0.35)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_a_key_padding_mask_marks_padded_tokens_as_no_queries():
    q = torch.randn(2, 4, 5, 8)
    padding = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)[:, None, None, :]
    groups = dense_groups(padding, q, q, TEXT, is_causal=False)
    assert groups.query_valid is not None and torch.equal(groups.query_valid, padding[:, 0, 0, :])
    # as an additive float mask too (0 attend, min masked), the layout eager transformers models build
    additive = torch.zeros(2, 1, 1, 5).masked_fill(~padding, torch.finfo(torch.float32).min)
    assert torch.equal(dense_groups(additive, q, q, TEXT, is_causal=False).query_valid, padding[:, 0, 0, :])
    # cross-attention: the keys' padding says nothing about the queries
    assert dense_groups(padding, q, q, AttentionSite("text", "cross"), is_causal=False).query_valid is None


def test_padded_queries_leave_the_diagnostics_of_a_padded_batch_as_the_unpadded_rows_give_them():
    """The validity reaches what the kernels average over queries: a batch whose second row is padded reports,
    for that row, what the row alone (unpadded) reports."""
    import transformers

    from modules.hf import FAMILIES, trace

    torch.manual_seed(0)
    model = use_attention(transformers.BertModel(FAMILIES["bert"].config()), "sparsemax").eval()
    ids = torch.randint(3, 60, (1, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        padded = {name: value.clone() for name, value in trace(model)[0][1].diagnostics.items() if value.dim() == 0}
        model(input_ids=ids[:, :4])
        alone = {name: value for name, value in trace(model)[0][1].diagnostics.items() if value.dim() == 0}
    assert padded and set(padded) == set(alone)
    for name in padded:
        torch.testing.assert_close(padded[name], alone[name], atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
