"""The CUDA paths of the variants, run on CPU under the device policy's "as on CUDA" (`behave_as_cuda`), against the
CPU's own path (the reference every CPU record was made with): the same outputs, aux losses and gradients to float
tolerance, and the path taken. What each CUDA path spares (host syncs, a materialised L x L tensor, an L x L tensor
saved for the backward) is counted here with dispatch modes, never timed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from harness.studies.gpu_cost import cuda_sdpa_backend
from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.device_policy import behave_as_cuda

SITE = AttentionSite("text", "self", sequence=True)
HEADS, DIM, LENGTH = 3, 16, 24


def inputs(*, padded: bool, dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, LENGTH, DIM, generator=g, dtype=dtype) for _ in range(3))
    valid = torch.ones(2, LENGTH, dtype=torch.bool)
    if padded:
        valid[1, LENGTH - 5:] = False
    groups = DenseGroups.from_key_padding(valid, query_valid=valid) if padded else DenseGroups()
    return q, k, v, groups


def call(kernel, q, k, v, groups, *, seed: int = 7):
    """Output, aux losses and the gradients of q, k, v and the kernel's parameters of one call (need_weights=False)."""
    kernel.noise_generator = torch.Generator().manual_seed(seed)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    kernel.zero_grad(set_to_none=True)
    out, result = kernel(*leaves, groups, need_weights=False)
    rows = torch.ones_like(out) if groups.query_valid is None else groups.query_valid[:, None, :, None].to(out.dtype)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    loss = (out * upstream * rows).sum() + sum(0.37 * a for a in result.aux_losses.values())
    loss.backward()
    grads = {f"d{n}": t.grad for n, t in zip("qkv", leaves)}
    grads.update({f"d{n}": p.grad for n, p in kernel.named_parameters() if p.grad is not None})
    return (out * rows).detach(), {n: a.detach() for n, a in result.aux_losses.items()}, grads, kernel.last_path


def assert_same(cuda, cpu, rtol=1e-9, atol=1e-11):
    out, aux, grads, _ = cuda
    out0, aux0, grads0, _ = cpu
    torch.testing.assert_close(out, out0, rtol=rtol, atol=atol)
    assert aux.keys() == aux0.keys()
    for name in aux:
        torch.testing.assert_close(aux[name], aux0[name], rtol=rtol, atol=atol)
    assert grads.keys() == grads0.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads0[name], rtol=rtol, atol=atol, msg=name)


class SdpaWidths(TorchDispatchMode):
    """The head widths (q, k, v) of every SDPA kernel, and whether any op formed a softmax (SDPA's math path)."""

    def __init__(self):
        super().__init__()
        self.widths, self.softmax = [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if "scaled_dot_product" in str(func) and "backward" not in name:
            self.widths.append(tuple(t.shape[-1] for t in args[:3]))
        if "softmax" in name:
            self.softmax = True
        return func(*args, **(kwargs or {}))


class SdpaCalls(TorchFunctionMode):
    """The head widths (q, k, v) of every F.scaled_dot_product_attention call, whichever backend then runs it."""

    def __init__(self):
        super().__init__()
        self.widths = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.widths.append(tuple(t.shape[-1] for t in args[:3]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("config", [{}, {"prior": "uniform"}, {"prior_offset": True}, {"prior": "magnitude"}])
@pytest.mark.parametrize("padded", [False, True])
def test_gmm_s_cuda_path_pads_its_head_to_a_fused_width_and_equals_the_cpu_path(config, padded):
    """gmm's fused form appends the key terms' column to q and k: a 64-wide head became 65, which sent CUDA's SDPA to
    the math path, which forms the weights. On the CUDA path q' and k' are padded with zero columns to a multiple of 8
    and v keeps its width (CUDA's memory-efficient kernel takes it), with the CPU path's results."""
    torch.manual_seed(0)
    kernel = build_attention({"name": "gmm", **config}, num_heads=HEADS, head_dim=DIM, site=SITE).double().train()
    with torch.no_grad():
        for p in kernel.parameters():
            p.add_(0.3 * torch.randn_like(p))
    q, k, v, groups = inputs(padded=padded)
    cpu = call(kernel, q, k, v, groups)
    with behave_as_cuda(), SdpaWidths() as seen, SdpaCalls() as called:
        cuda = call(kernel, q, k, v, groups)
    assert cuda[3] == cpu[3] == "sdpa"
    assert_same(cuda, cpu)
    has_column = config.get("prior") != "magnitude" or config.get("prior_offset")
    if has_column:
        # the CPU's SDPA runs a v narrower than q and k on its math path (this test's stand-in for CUDA's kernel)
        assert called.widths == [(24, 24, DIM)]
        assert cuda_sdpa_backend(torch.empty(1, 1, 1, 24), None, v=torch.empty(1, 1, 1, DIM)) == "efficient"
    else:
        assert seen.widths == [(DIM, DIM, DIM)] and not seen.softmax


def test_gmm_s_cpu_path_is_unpadded():
    """Off the CUDA path q' and k' stay one column wider than v (SDPA's math path on CPU, as the CPU records ran)."""
    kernel = build_attention({"name": "gmm"}, num_heads=HEADS, head_dim=DIM, site=SITE).double().train()
    q, k, v, groups = inputs(padded=False)
    with SdpaWidths() as seen:
        call(kernel, q, k, v, groups)
    assert seen.widths == [] and seen.softmax


@pytest.mark.parametrize("name", ["bam-weibull", "bam-lognormal"])
@pytest.mark.parametrize("prior", ["fixed", "contextual"])
def test_bams_cuda_path_keeps_no_noise_for_the_backward_and_equals_the_cpu_path(name, prior):
    """BAM's CUDA path hands SDPA the sampled weights' noise as a logits bias; SDPA kept that [B, H, Lq, Lk] bias for
    its backward. Now the SDPA call is recomputed in the backward from the noise redrawn from the stream's state before
    the forward's draw: nothing of the noise's size is kept, the output, KL and gradients are the CPU path's (the
    same draw), and the stream ends where the forward left it."""
    torch.manual_seed(0)
    noisy = {"bam-weibull": {"k": 3.0}, "bam-lognormal": {"sigma": 0.7}}[name]
    kernel = build_attention({"name": name, "prior": prior, **noisy}, num_heads=HEADS, head_dim=DIM, site=SITE).double().train()
    q, k, v, groups = inputs(padded=True)
    cpu = call(kernel, q, k, v, groups)
    after_cpu = torch.rand(3, generator=kernel.noise_generator)
    pair_sized = 2 * HEADS * LENGTH * LENGTH
    kept = []

    def pack(t):
        kept.append(t.numel())
        return t

    with behave_as_cuda(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        cuda = call(kernel, q, k, v, groups)
    after_cuda = torch.rand(3, generator=kernel.noise_generator)
    assert cpu[3] == "eager" and cuda[3] == "sdpa"
    assert_same(cuda, cpu, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(after_cuda, after_cpu, rtol=0, atol=0)
    assert kept and max(kept) < pair_sized, max(kept)


def test_bams_cuda_path_keeps_the_noise_bias_under_attention_dropout():
    """With attention dropout SDPA draws its own mask too; there the noise stays SDPA's saved bias (the former form)."""
    kernel = build_attention({"name": "bam-weibull", "k": 3.0}, num_heads=HEADS, head_dim=DIM, site=SITE).double().train()
    q, k, v, groups = inputs(padded=False)
    with behave_as_cuda():
        kernel.noise_generator = torch.Generator().manual_seed(7)
        out, _ = kernel(q, k, v, groups, need_weights=False, dropout_p=0.1)
    assert kernel.last_path == "sdpa" and out.shape == q.shape
