"""Every registered variant under causal groups (a decoder's self-attention, modules/hf.py's Llama host): the
weights are distributions over the past only, and a query's output does not move when a future token does.

Parametrised over the registry, as test_contract.py is: a new variant is covered without editing this file."""

import pytest
import torch

from modules.attention import AttentionSite, DenseGroups, build_attention, list_attentions

HEADS, DIM, LENGTH = 2, 4, 6
SITE = AttentionSite("text", "self", sequence=True)


def problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, HEADS, LENGTH, DIM, generator=g, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(2, LENGTH, dtype=torch.bool)
    valid[1, -2:] = False  # right padding, as a batch of prompts has
    return q, k, v, DenseGroups.from_key_padding(valid, causal=True, query_valid=valid), valid


@pytest.mark.parametrize("name", list_attentions())
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_causal_weights_and_outputs_ignore_the_future(name, mode):
    torch.manual_seed(0)
    kernel = build_attention(name, num_heads=HEADS, head_dim=DIM, site=SITE).double().train(mode == "train")
    q, k, v, groups, valid = problem()
    torch.manual_seed(1)
    out, result = kernel(q, k, v, groups, scale=DIM**-0.5, need_weights=True)
    weights = result.weights
    future = ~torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    assert torch.isfinite(weights).all() and (weights >= 0).all()
    assert (weights[..., future] == 0).all()
    rows = valid[:, None, :].expand(-1, HEADS, -1)
    torch.testing.assert_close(weights.sum(-1)[rows], torch.ones_like(weights.sum(-1)[rows]), atol=1e-6, rtol=0)
    # the last real token of the first sequence changes: every earlier query's output stays
    k2, v2 = k.clone(), v.clone()
    k2[0, :, -1] += 3.0
    v2[0, :, -1] -= 2.0
    torch.manual_seed(1)
    out2, _ = kernel(q, k2, v2, groups, scale=DIM**-0.5, need_weights=True)
    torch.testing.assert_close(out2[0, :, :-1], out[0, :, :-1], atol=1e-7, rtol=0)
    torch.testing.assert_close(out2[1], out[1], atol=1e-7, rtol=0)
