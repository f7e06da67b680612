"""The learned-α `entmax` takes its fused Triton kernel (modules/attention/triton_entmax.py) on the CUDA path where
the contract fits, the eager path elsewhere. Triton needs CUDA, so on CPU a reference with the kernel's signature
stands in: what is checked here is the plumbing (when the path is chosen, α per head and its gradient, autocast, the
α diagnostic) and the cost page's count; the kernel itself is checked against eager under the Triton interpreter
(test_entmax_triton_interpreted.py) and by the `gpu` test below."""

from __future__ import annotations

import entmax
import pytest
import torch

from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention.variants import entmax as entmax_variant

SITE = AttentionSite("text", "self", sequence=True)
B, H, L, D = 2, 3, 10, 16


def reference(q, k, v, alpha, scale):
    """The kernel's contract in plain torch: entmax_α(scale·q kᵀ) v with α [H] per head."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    weights = entmax.entmax_bisect(scores, alpha.float().view(1, -1, 1, 1), dim=-1, n_iter=50)
    return (weights @ v.float()).to(v.dtype)


@pytest.fixture
def stand_in():
    entmax_variant.use_learned_alpha_reference(reference)
    yield
    entmax_variant.use_learned_alpha_reference(None)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(2 * torch.randn(B, H, L, D, generator=g)).requires_grad_() for _ in range(3)]


def _kernel(**options):
    kernel = build_attention({"name": "entmax", **options}, num_heads=H, head_dim=D, site=SITE).train()
    with torch.no_grad():
        kernel.alpha_logit.copy_(torch.linspace(-1.5, 1.5, H))
    return kernel


def test_an_unmasked_call_takes_the_kernel_with_alpha_per_head_and_its_gradient(stand_in):
    kernel = _kernel()
    q, k, v = _inputs()
    eager, _ = kernel(q, k, v, DenseGroups(), scale=0.3, need_weights=True)
    eager_grads = torch.autograd.grad(eager.square().sum(), (q, k, v, kernel.alpha_logit))
    fused, result = kernel(q, k, v, DenseGroups(), scale=0.3, need_weights=False)
    assert kernel.last_path == "triton-entmax" and result.weights is None
    fused_grads = torch.autograd.grad(fused.square().sum(), (q, k, v, kernel.alpha_logit))
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert fused_grads[3].abs().min() > 0  # every head's α learns


def test_outside_its_contract_the_call_is_eager_or_blocked(stand_in):
    q, k, v = _inputs()
    padded = DenseGroups.from_key_padding(torch.tensor([[True] * L, [True] * 6 + [False] * (L - 6)]))
    cases = [
        (padded, q, k, v, 0.0),                              # a boolean mask
        (DenseGroups(), q, k[:, :, :7], v[:, :, :7], 0.0),   # cross-attention lengths
        (DenseGroups(), q, k, v[..., :8], 0.0),              # v not shaped as q
        (DenseGroups(), q, k, v, 0.1),                       # attention dropout
    ]
    for groups, q_, k_, v_, dropout in cases:
        kernel = _kernel()
        kernel(q_, k_, v_, groups, need_weights=False, dropout_p=dropout)
        assert kernel.last_path == "eager", groups


def test_without_triton_or_a_gpu_nothing_changes_on_cpu():
    kernel = _kernel()
    q, k, v = _inputs()
    assert kernel.fused_attention(q, k, DenseGroups(), scale=D**-0.5) is None
    kernel(q, k, v, DenseGroups(), need_weights=False)
    assert kernel.last_path == "eager"


def test_bf16_autocast_hands_the_kernel_bf16_inputs_and_alpha_in_float32(stand_in):
    seen = []

    def spy(q, k, v, alpha, scale):
        seen.append((q.dtype, k.dtype, v.dtype, alpha.dtype))
        return reference(q, k, v, alpha, scale)

    entmax_variant.use_learned_alpha_reference(spy)
    kernel = _kernel()
    q, k, v = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = kernel(q, k, v, DenseGroups(), need_weights=False)
    assert seen == [(torch.bfloat16,) * 3 + (torch.float32,)] and out.dtype == torch.bfloat16


def test_in_eval_the_fused_call_reports_the_mean_alpha(stand_in):
    kernel = _kernel().eval()
    q, k, v = _inputs()
    _, result = kernel(q, k, v, DenseGroups(), need_weights=False)
    assert kernel.last_path == "triton-entmax"
    torch.testing.assert_close(result.diagnostics["alpha"], kernel.alpha().mean())


@pytest.mark.parametrize("length", [40, 128])
def test_the_cost_page_counts_its_four_launches_and_no_host_read(length):
    pytest.importorskip("triton")
    from harness.studies import gpu_cost

    counter, saved, path = gpu_cost.count_step("entmax", length, 2, heads=2)
    assert path == "triton-entmax"
    assert not counter.syncs, dict(counter.syncs)
    triton = {kernel: n for kernel, n in counter.by_kernel.items() if kernel.startswith(("triton ", "attnbench::"))}
    assert triton == {"attnbench::entmax_tau": 1, "attnbench::entmax_output": 1, "attnbench::entmax_key_grad": 1,
                      "attnbench::entmax_query_grad": 1}
    # q, k, v, o2 (float32, counted at 2 bytes as every float), τ and Z per row, α: FlashAttention's set and one row
    flash = gpu_cost.Count("entmax", length, 2).flash_ideal * 2 / gpu_cost.HEADS
    assert saved <= 1.1 * flash


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels need CUDA")
@pytest.mark.parametrize("length", [128, 200])
def test_the_kernel_on_cuda_matches_eager_forward_and_backward(length):
    pytest.importorskip("triton")
    q, k, v = (torch.randn(2, H, length, 64, device="cuda") for _ in range(3))
    kernel = build_attention({"name": "entmax"}, num_heads=H, head_dim=64, site=SITE).cuda().train()
    with torch.no_grad():
        kernel.alpha_logit.copy_(torch.linspace(-1.5, 1.5, H))

    def run(need_weights):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        kernel.zero_grad()
        out, _ = kernel(*inputs, DenseGroups(), need_weights=need_weights)
        out.square().sum().backward()
        return out.detach(), [t.grad for t in inputs] + [kernel.alpha_logit.grad.clone()]

    (o0, g0), (o1, g1) = run(True), run(False)
    assert kernel.last_path == "triton-entmax"
    for a, b in zip([o1, *g1], [o0, *g0]):
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-4
