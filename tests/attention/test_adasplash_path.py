"""Issue 37: sparsemax and entmax15 take AdaSplash's fused kernel where its contract fits, the eager path
elsewhere. AdaSplash's Triton kernels need CUDA, so on CPU a reference with its signature stands in for it:
what is checked here is the plumbing (when the path is chosen, q's rescaling, autocast, the record); the
kernel itself is checked against eager under the Triton interpreter (test_adasplash_interpreted.py), by the
`gpu` test below and by `make gpu-perf`."""

from __future__ import annotations

import math

import entmax
import pytest
import torch
from torch import nn

from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention.kernel import attention_paths
from modules.attention.variants import entmax as entmax_variant

SITE = AttentionSite("text", "self", sequence=True)
B, H, L, D = 2, 3, 10, 16


def reference(q, k, v, alpha=1.5, niter=10):
    """AdaSplash's contract in plain torch (the wrapper of modules/attention/adasplash_full_length.py, any length):
    entmax_alpha(q k^T / sqrt(d)) v."""
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return entmax.entmax_bisect(scores.float(), alpha, dim=-1, n_iter=50).to(v.dtype) @ v


@pytest.fixture
def stand_in():
    entmax_variant.use_adasplash_reference(reference)
    yield
    entmax_variant.use_adasplash_reference(None)


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(2 * torch.randn(B, H, L, D, generator=g)).to(dtype) for _ in range(3)]


def _kernel(name, **options):
    return build_attention({"name": name, **options}, num_heads=H, head_dim=D, site=SITE).eval()


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("scale", [D**-0.5, 0.3])
def test_an_unmasked_call_takes_adasplash_and_matches_the_eager_weights(stand_in, name, scale):
    kernel = _kernel(name)
    q, k, v = _inputs()
    eager, _ = kernel(q, k, v, DenseGroups(), scale=scale, need_weights=True)
    fused, result = kernel(q, k, v, DenseGroups(), scale=scale, need_weights=False)
    assert kernel.last_path == "adasplash" and result.weights is None
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    assert attention_paths(nn.Sequential(kernel)) == {"attention_paths": ["adasplash", "eager"]}


def test_outside_its_contract_the_call_is_eager(stand_in):
    q, k, v = _inputs()
    padded = DenseGroups.from_key_padding(torch.tensor([[True] * L, [True] * 6 + [False] * (L - 6)]))
    cases = [
        (_kernel("entmax15"), q, k, v, padded, 0.0),                       # a boolean mask
        (_kernel("entmax"), q, k, v, DenseGroups(), 0.0),                   # learned α: no dα from AdaSplash
        (_kernel("entmax15"), q, k[:, :, :7], v[:, :, :7], DenseGroups(), 0.0),  # cross-attention lengths
        (_kernel("entmax15"), q, k, v[..., :8], DenseGroups(), 0.0),        # v not shaped as q
        (_kernel("entmax15").train(), q, k, v, DenseGroups(), 0.1),         # attention dropout
    ]
    for kernel, q_, k_, v_, groups, dropout in cases:
        kernel(q_, k_, v_, groups, need_weights=False, dropout_p=dropout)
        assert kernel.last_path == "eager", kernel


def test_head_dimensions_adasplash_does_not_tile_stay_eager(stand_in):
    kernel = build_attention({"name": "sparsemax"}, num_heads=H, head_dim=24, site=SITE)
    q = torch.randn(B, H, L, 24)
    kernel(q, q, q, DenseGroups(), need_weights=False)
    assert kernel.last_path == "eager"


def test_without_the_library_or_a_gpu_nothing_changes_on_cpu():
    """No stand-in: on this CPU sparsemax and entmax15 keep the eager path, so CPU results are as before."""
    kernel = _kernel("entmax15")
    q, k, v = _inputs()
    assert kernel.fused_attention(q, k, DenseGroups(), scale=D**-0.5) is None
    kernel(q, k, v, DenseGroups(), need_weights=False)
    assert kernel.last_path == "eager"


def test_bf16_autocast_hands_the_library_bf16_inputs(stand_in):
    seen = []

    def spy(q, k, v, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return reference(q, k, v, **kw)

    entmax_variant.use_adasplash_reference(spy)
    kernel = _kernel("sparsemax")
    q, k, v = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = kernel(q, k, v, DenseGroups(), need_weights=False)
    assert seen == [(torch.bfloat16,) * 3] and out.dtype == torch.bfloat16


def test_the_gpu_perf_check_compares_the_adasplash_path(stand_in, monkeypatch):
    from harness.studies import gpu_perf

    monkeypatch.setattr(gpu_perf, "DEVICE", "cpu")
    errors = gpu_perf.check({"name": "entmax15"}, False, "fp32", padded=False)
    assert set(errors) == {"adasplash"} and errors["adasplash"] <= 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="AdaSplash's Triton kernels need CUDA")
@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_adasplash_on_cuda_matches_eager_forward_and_backward(name):
    pytest.importorskip("adasplash")
    kernel = _kernel(name).cuda()
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda") for _ in range(3))

    def run(need_weights):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, _ = kernel(*inputs, DenseGroups(), need_weights=need_weights)
        out.square().sum().backward()
        return out.detach(), [t.grad for t in inputs]

    (o0, g0), (o1, g1) = run(True), run(False)
    assert kernel.last_path == "adasplash"
    for a, b in zip([o1, *g1], [o0, *g0]):
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-4


@pytest.mark.parametrize("length", [40, 128, 160])
@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_the_adasplash_path_reads_nothing_on_the_host_at_any_length(name, length):
    """The cost page's count (fake tensors: each launch a custom op run in its fake form): two kernels forward, three
    backward, and no host read, also where the lengths go to the kernels (40 and 160: under 128, not a power of two)."""
    pytest.importorskip("adasplash")
    pytest.importorskip("triton")
    from harness.studies import gpu_cost

    counter, _, path = gpu_cost.count_step(name, length, 2, heads=2)
    assert path == "adasplash"
    assert not counter.syncs, dict(counter.syncs)
    triton = {kernel: n for kernel, n in counter.by_kernel.items() if kernel.startswith(("triton ", "attnbench::"))}
    assert triton == {"attnbench::adasplash_tau": 1, "attnbench::adasplash_output": 1,
                      "attnbench::adasplash_backward_delta": 1, "attnbench::adasplash_key_grad": 1,
                      "attnbench::adasplash_query_grad": 1}
