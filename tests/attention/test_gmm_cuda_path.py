"""gmm's fused form on the CUDA path (`_PaddedMixtureForm`): its hand-written backward against autograd
(gradcheck, and a composed form under bf16), and what it spares, counted with a dispatch mode. That the whole CUDA path
equals the CPU path is tests/attention/test_cuda_path.py's."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.studies.gpu_cost import CostCounter, CudaSDPA
from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention.variants.gmm import _PaddedMixtureForm
from modules.device_policy import behave_as_cuda

B, H, L, D = 2, 3, 5, 4


def form_inputs(dtype=torch.float64, *, coef: bool, extra: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, L, D, generator=g, dtype=dtype).requires_grad_() for _ in range(2))
    alpha = (0.5 + torch.rand(H, generator=g, dtype=dtype)).requires_grad_()
    c = torch.randn(H, generator=g, dtype=dtype).requires_grad_() if coef else None
    e = torch.randn(B, H, L, generator=g, dtype=dtype).requires_grad_() if extra else None
    return q, k, alpha, c, e


@pytest.mark.parametrize("coef", [True, False])
@pytest.mark.parametrize("extra", [True, False])
@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("width", [D + 1, D + 4])
def test_padded_form_backward_is_autograds(coef, extra, centred, width):
    """Through the products q' k'ᵀ, the only use SDPA makes of them (α's gradient is read from the keys' side, which
    holds there: see `_PaddedMixtureForm`)."""
    if not coef and not extra:
        pytest.skip("no key terms: the padded form is not built")
    q, k, alpha, c, e = form_inputs(coef=coef, extra=extra)

    def form(q, k, alpha, c, e):
        q_prime, k_prime = _PaddedMixtureForm.apply(q, k, alpha, c, e, centred, width, torch.float64)
        return q_prime @ k_prime.transpose(-1, -2)

    inputs = tuple(t for t in (q, k, alpha, c, e))
    assert torch.autograd.gradcheck(form, inputs)


def composed(q, k, alpha, c, e, centred, width, dtype):
    """The same q', k' from autograd ops (the CUDA path's form before `_PaddedMixtureForm`)."""
    terms = torch.zeros((), dtype=torch.float32)
    if c is not None:
        sq = k.float().square().sum(-1)
        terms = c.view(1, -1, 1).float() * sq
    if e is not None:
        terms = terms + e
    if centred:
        terms = terms - terms.nan_to_num(0.0, 0.0, 0.0).mean(-1, keepdim=True)
    terms = terms.expand(k.shape[:-1])
    zeros = k.new_zeros((*k.shape[:-1], width - k.shape[-1] - 1))
    q_prime = torch.cat([q * alpha.view(1, -1, 1, 1), torch.ones_like(q[..., :1]), zeros], -1).to(dtype)
    k_prime = torch.cat([k, terms.unsqueeze(-1).to(k.dtype), zeros], -1).to(dtype)
    return q_prime, k_prime


def test_padded_form_in_bfloat16_rounds_as_the_composed_form():
    """Built in bf16 from float32 inputs (autocast's case), q' and k' are the composed form's, bit for bit (α applied
    in float32, one rounding), and so are the gradients they pass back through their products, to a few bf16
    roundings."""
    q, k, alpha, c, e = form_inputs(torch.float32, coef=True, extra=True, seed=1)
    g = torch.Generator().manual_seed(2)
    upstream = torch.randn(B, H, L, L, generator=g).bfloat16()
    results = []
    for build in (lambda *a: _PaddedMixtureForm.apply(*a, True, D + 4, torch.bfloat16),
                  lambda *a: composed(*a, True, D + 4, torch.bfloat16)):
        outs = build(q, k, alpha, c, e)
        grads = torch.autograd.grad(outs[0] @ outs[1].transpose(-1, -2), (q, k, alpha, c, e), upstream)
        results.append((outs, grads))
    (outs, grads), (outs0, grads0) = results
    for o, o0 in zip(outs, outs0):
        assert o.dtype == torch.bfloat16 and torch.equal(o, o0)
    for name, grad, grad0 in zip(("q", "k", "alpha", "coef", "extra"), grads, grads0):
        torch.testing.assert_close(grad, grad0, rtol=2e-2, atol=2e-2, msg=name)


class FullSizeWrites(TorchDispatchMode):
    """The ATen kernels whose output is a full-size tensor [B, H, L, >= d] (q's or a padded q's), by name, outside the
    GPU cost page's stand-in for CUDA's fused SDPA (whose own ops compute its result on this CPU: `counter.paused`)."""

    def __init__(self, dim: int, counter: CostCounter):
        super().__init__()
        self.dim, self.counter, self.names = dim, counter, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        view = func.is_view or func.__name__.startswith(("detach", "new_empty", "empty"))
        full = isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[-1] >= self.dim
        if not view and full and not self.counter.paused:
            self.names.append(func.__name__)
        return out


def test_cuda_paths_form_writes_each_padded_tensor_once_and_each_gradient_once():
    """Forward: q' and k' written once each (a multiply into q', a copy into k'), v not padded (SDPA runs CUDA's
    memory-efficient kernel, which takes a v narrower than q' and k'); backward: dq in one op (α dq'[:d], contiguous,
    so the leaf keeps it without a copy), dk in one (the length term added to dk'[:d]), dv and the output's gradient as
    they are: where the composed form wrote (and padded, sliced, added) some fifteen full-size tensors."""
    torch.manual_seed(0)
    kernel = build_attention({"name": "gmm"}, num_heads=3, head_dim=16,
                             site=AttentionSite("text", "self", sequence=True)).double().train()
    q, k, v = (torch.randn(2, 3, 24, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    counter = CostCounter(where=False, storage=False)
    forward, backward = FullSizeWrites(16, counter), FullSizeWrites(16, counter)
    with behave_as_cuda(), CudaSDPA(counter):
        with forward:
            out, _ = kernel(q, k, v, DenseGroups(), need_weights=False)
        upstream = torch.randn_like(out)
        with backward:
            out.backward(upstream)
    assert kernel.last_path == "sdpa" and dict(counter.sdpa_backends) == {"efficient": 1}
    assert out.shape[-1] == 16
    assert sorted(forward.names) == sorted(["mul.out", "copy_.default"])
    # no copy: the leaves take dq, dk and dv as they come (the trace's [d x d] product is reshaped by a view)
    kernels = [n for n in backward.names if n != "_unsafe_view.default"]
    assert sorted(kernels) == sorted(["mul.Tensor", "addcmul.default"])
