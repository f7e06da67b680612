"""The align-* variants' CUDA path (run on CPU "as on CUDA"): the fused kernel reads q and k through `SampledRows`, so
that the regulariser's gradient for its subsampled rows lands in the fused kernel's gradient in place. Results equal
the CPU path's exactly (each sampled row's gradient is kernel + regulariser either way); what it spares (a zero
tensor of q's size and a full-size add per tensor the regulariser moves) is counted with a dispatch mode."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.device_policy import behave_as_cuda

NAMES = ["align-gan", "align-ot", "align-ct"]
SITE = AttentionSite("text", "self", sequence=True)
HEADS, DIM, LENGTH, POINTS = 2, 8, 20, 6


def inputs(padded: bool):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, LENGTH, DIM, generator=g, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(2, LENGTH, dtype=torch.bool)
    if padded:
        valid[1, LENGTH - 7:] = False
    groups = DenseGroups.from_key_padding(valid, query_valid=valid) if padded else DenseGroups()
    return q, k, v, groups


class FullSizeOps(TorchDispatchMode):
    """The ATen ops whose output has q's full shape [B, H, L, d], by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and tuple(out.shape) in ((2, HEADS, LENGTH, DIM), (2 * HEADS, LENGTH, DIM)):
            self.names.append(func.__name__)
        return out


def call(kernel, q, k, v, groups, count: FullSizeOps | None = None):
    kernel.noise_generator = torch.Generator().manual_seed(5)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    kernel.zero_grad(set_to_none=True)
    out, result = kernel(*leaves, groups, need_weights=False)
    rows = torch.ones_like(out) if groups.query_valid is None else groups.query_valid[:, None, :, None].to(out.dtype)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    loss = (out * upstream * rows).sum() + 0.37 * result.aux_losses["align"]
    if count is None:
        loss.backward()
    else:
        with count:
            loss.backward()
    grads = {f"d{n}": t.grad for n, t in zip("qkv", leaves)}
    grads.update({n: p.grad for n, p in kernel.named_parameters() if p.grad is not None})
    return out.detach(), result.aux_losses["align"].detach(), grads, kernel.last_path


@pytest.mark.parametrize("name, config", [(name, {}) for name in NAMES] + [("align-gan", {"detach_queries": False}),
                                                                          ("align-ot", {"cost": "sqeuclidean"})])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_cuda_path_equals_the_cpu_path_exactly(name, config, padded, training):
    torch.manual_seed(0)
    kernel = build_attention({"name": name, "max_points": POINTS, **config}, num_heads=HEADS, head_dim=DIM,
                             site=SITE).double()
    kernel.train(training)
    q, k, v, groups = inputs(padded)
    cpu = call(kernel, q, k, v, groups)
    with behave_as_cuda():
        cuda = call(kernel, q, k, v, groups)
    assert cpu[3] == cuda[3] == "sdpa"
    torch.testing.assert_close(cuda[0], cpu[0], rtol=0, atol=0)
    torch.testing.assert_close(cuda[1], cpu[1], rtol=0, atol=0)
    assert cuda[2].keys() == cpu[2].keys()
    for key in cpu[2]:
        torch.testing.assert_close(cuda[2][key], cpu[2][key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("name, moved", [("align-gan", 1), ("align-ot", 2), ("align-ct", 2)])
def test_cuda_paths_backward_adds_the_regularisers_rows_in_place(name, moved):
    """Per tensor the regulariser moves (k for align-gan, whose queries are detached; q and k otherwise): the CPU path's
    backward writes a zero tensor, scatters the rows into it and adds it to the kernel's gradient; the CUDA path scatters
    them into the kernel's gradient, and nothing else of that size is written."""
    torch.manual_seed(0)
    kernel = build_attention({"name": name, "max_points": POINTS}, num_heads=HEADS, head_dim=DIM, site=SITE).double()
    q, k, v, groups = inputs(False)
    cpu, cuda = FullSizeOps(), FullSizeOps()
    call(kernel, q, k, v, groups, cpu)
    with behave_as_cuda():
        call(kernel, q, k, v, groups, cuda)
    for op in ("new_zeros.default", "index_add.default", "add.Tensor"):
        assert cpu.names.count(op) == moved, op
        assert op not in cuda.names, op
    assert cuda.names.count("index_add_.default") == moved
    assert len(cuda.names) <= len(cpu.names) - 2 * moved


def test_unsubsampled_clouds_take_the_plain_path():
    """A cloud within max_points is read whole: no `SampledRows`, q and k reach the fused kernel as they are."""
    torch.manual_seed(0)
    kernel = build_attention({"name": "align-ot", "max_points": LENGTH}, num_heads=HEADS, head_dim=DIM, site=SITE).double()
    q, k, v, groups = inputs(False)
    cpu = call(kernel, q, k, v, groups)
    with behave_as_cuda():
        cuda = call(kernel, q, k, v, groups)
    for key in cpu[2]:
        torch.testing.assert_close(cuda[2][key], cpu[2][key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_a_projection_s_layout_is_sampled_without_a_copy(name):
    """q and k as a projection leaves them ([B, L, H, d] storage, viewed [B, H, L, d]) do not flatten to clouds as views:
    the CPU path copies them whole to sample their rows, the CUDA path samples their rows directly, with the same
    results."""
    torch.manual_seed(0)
    kernel = build_attention({"name": name, "max_points": POINTS}, num_heads=HEADS, head_dim=DIM, site=SITE).double()
    q, k, v, groups = inputs(False)
    q, k = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k))
    assert not q.is_contiguous()
    cpu_writes, cuda_writes = FullSizeOps(), FullSizeOps()
    for count, as_cuda in ((cpu_writes, False), (cuda_writes, True)):
        kernel.noise_generator = torch.Generator().manual_seed(5)
        with behave_as_cuda(as_cuda), count:
            kernel(q, k, v, groups, need_weights=False)
    assert cpu_writes.names.count("clone.default") == 2 and "clone.default" not in cuda_writes.names
    cpu = call(kernel, q, k, v, groups)
    with behave_as_cuda():
        cuda = call(kernel, q, k, v, groups)
    for key in cpu[2]:
        torch.testing.assert_close(cuda[2][key], cpu[2][key], rtol=0, atol=0, msg=key)
