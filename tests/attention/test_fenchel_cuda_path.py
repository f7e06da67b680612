"""fenchel's CUDA path where its bias needs a gradient: SDPA in blocks of heads and samples (`_BiasGradientBlocks`), so
that CUDA's [B, H, Lq, Lk] gradient of the broadcast bias exists one block at a time. Run on CPU under the device
policy's "as on CUDA" against the CPU's own path (one SDPA call, what the CPU records ran); the peak it spares is read
on the GPU cost page's counter, never timed."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
import torch.nn.functional as F

from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention.variants import fenchel as fenchel_module
from modules.device_policy import behave_as_cuda

SITE = AttentionSite("text", "self", sequence=True)
HEADS, DIM, LENGTH = 3, 16, 24


class SdpaCalls(TorchFunctionMode):
    """The (q shape, bias shape) of every F.scaled_dot_product_attention call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.calls.append((tuple(args[0].shape), None if mask is None else tuple(mask.shape)))
        return func(*args, **kwargs)


def kernel_and_inputs(*, padded: bool, learn_alpha: bool = True):
    torch.manual_seed(0)
    kernel = build_attention({"name": "fenchel", "learn_alpha": learn_alpha, "alpha": 0.8}, num_heads=HEADS,
                             head_dim=DIM, site=SITE).double().train()
    with torch.no_grad():
        for p in kernel.parameters():
            p.add_(0.3 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, LENGTH, DIM, generator=g, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(2, LENGTH, dtype=torch.bool)
    if padded:
        valid[1, LENGTH - 5:] = False
    groups = DenseGroups.from_key_padding(valid, query_valid=valid) if padded else DenseGroups()
    return kernel, q, k, v, groups


def call(kernel, q, k, v, groups, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    kernel.zero_grad(set_to_none=True)
    out, _ = kernel(*leaves, groups, need_weights=False, **kwargs)
    rows = torch.ones_like(out) if groups.query_valid is None else groups.query_valid[:, None, :, None].to(out.dtype)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    (out * upstream * rows).sum().backward()
    grads = {f"d{n}": t.grad for n, t in zip("qkv", leaves)}
    grads.update({f"d{n}": p.grad for n, p in kernel.named_parameters() if p.grad is not None})
    return (out * rows).detach(), grads, kernel.last_path


# budgets (multiples of q's size) that force blocks at these sizes: one head and one sample a block; one head of both
# samples a block (where it fits, and where the bias alone is past the budget)
@pytest.mark.parametrize("budget, blocks", [(1.8, (1, 1)), (2.0, (2, 1)), (1.0, (2, 1))])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("learn_alpha", [False, True])
def test_blocked_cuda_path_equals_the_cpu_path(budget, blocks, padded, learn_alpha, monkeypatch):
    kernel, q, k, v, groups = kernel_and_inputs(padded=padded, learn_alpha=learn_alpha)
    with SdpaCalls() as cpu_calls:
        cpu = call(kernel, q, k, v, groups)
    monkeypatch.setattr(fenchel_module, "BIAS_GRADIENT_BUDGET", budget)
    with behave_as_cuda(), SdpaCalls() as cuda_calls:
        cuda = call(kernel, q, k, v, groups)
    assert cpu[2] == cuda[2] == "sdpa"
    assert len(cpu_calls.calls) == 1
    samples, heads = blocks
    assert len(cuda_calls.calls) == (2 // samples) * (HEADS // heads)
    assert all(shape == (samples, heads, LENGTH, DIM) for shape, _ in cuda_calls.calls)
    torch.testing.assert_close(cuda[0], cpu[0], rtol=1e-9, atol=1e-11)
    assert cuda[1].keys() == cpu[1].keys() and "dposition_bias.weight" in cpu[1]
    for name in cpu[1]:
        torch.testing.assert_close(cuda[1][name], cpu[1][name], rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("budget, calls", [(0.5, 2 * HEADS), (1.0, HEADS)])
def test_a_per_sample_degree_bias_is_blocked_by_samples_too(budget, calls, monkeypatch):
    """The degree prior under a per-pair (causal) mask away from token sequences: a [B, H, 1, Lk] bias with a gradient
    (the coupling), split with its samples."""
    torch.manual_seed(0)
    site = AttentionSite("text", "self", sequence=False)
    kernel = build_attention({"name": "fenchel", "prior": "degree"}, num_heads=HEADS, head_dim=DIM, site=site).double().train()
    with torch.no_grad():
        kernel.degree_weight.add_(0.5)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, LENGTH, DIM, generator=g, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(2, LENGTH, dtype=torch.bool)
    valid[1, LENGTH - 5:] = False
    groups = DenseGroups.from_key_padding(valid, causal=True)
    cpu = call(kernel, q, k, v, groups)
    monkeypatch.setattr(fenchel_module, "BIAS_GRADIENT_BUDGET", budget)
    with behave_as_cuda(), SdpaCalls() as seen:
        cuda = call(kernel, q, k, v, groups)
    assert len(seen.calls) == calls and "ddegree_weight" in cpu[1]
    torch.testing.assert_close(cuda[0], cpu[0], rtol=1e-9, atol=1e-11)
    for name in cpu[1]:
        torch.testing.assert_close(cuda[1][name], cpu[1][name], rtol=1e-9, atol=1e-11, msg=name)


def test_an_infinite_budget_is_one_call(monkeypatch):
    monkeypatch.setattr(fenchel_module, "BIAS_GRADIENT_BUDGET", float("inf"))
    kernel, q, k, v, groups = kernel_and_inputs(padded=True)
    with behave_as_cuda(), SdpaCalls() as seen:
        call(kernel, q, k, v, groups)
    assert len(seen.calls) == 1


def test_one_call_off_the_cuda_path_without_a_gradient_and_under_dropout(monkeypatch):
    """The CPU path (its records), an evaluation call and a call with attention dropout (which the blocked form does not
    take) each run SDPA once on the whole batch."""
    monkeypatch.setattr(fenchel_module, "BIAS_GRADIENT_BUDGET", 1.8)
    kernel, q, k, v, groups = kernel_and_inputs(padded=False)
    with SdpaCalls() as seen:
        kernel(q, k, v, groups, need_weights=False)
    assert len(seen.calls) == 1
    with behave_as_cuda():
        with SdpaCalls() as seen, torch.no_grad():
            kernel(q, k, v, groups, need_weights=False)
        assert len(seen.calls) == 1
        with SdpaCalls() as seen:
            out, _ = kernel(q, k, v, groups, need_weights=False, dropout_p=0.1)
        assert len(seen.calls) == 1 and kernel.last_path == "sdpa" and out.shape == q.shape
        with SdpaCalls() as seen:
            kernel(q, k, v, groups, need_weights=False)
        assert len(seen.calls) == 2 * HEADS
    assert kernel.call_dropout == 0.0


@pytest.mark.parametrize("length", [512, 2048])
def test_gpu_cost_page_peak_within_one_and_a_half_sdpa(length):
    """The page's goal for fenchel (B = 32, H = 12, d = 64, CUDA path): peak live bytes within 1.5x SDPA softmax's, no
    host sync, saved-for-backward within 1.5x FlashAttention's ideal. One [B, H, L, L] bias gradient made it 2.07x at
    L = 512 and 5.28x at 2048."""
    from harness.studies.gpu_cost import Count, count_step

    from modules.device_policy import triton_installed

    fenchel, saved, path = count_step("fenchel", length, 32)
    softmax, _, _ = count_step("softmax", length, 32)
    # the page counts the path a GPU with the same packages takes: the Triton softmax kernel where Triton is installed
    assert path == ("triton-softmax" if triton_installed() else "sdpa")
    assert fenchel.peak <= 1.5 * softmax.peak, fenchel.peak / softmax.peak
    assert sum(fenchel.syncs.values()) == 0
    flash_ideal = Count("fenchel", length, 32).flash_ideal
    assert saved <= 1.5 * flash_ideal, saved / flash_ideal
