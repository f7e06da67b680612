"""align-ot's Sinkhorn solve reuses the convergence test's product v Kᵀ as the next u-update's: the plans are the
earlier loop's bit for bit (that loop is written out here), with fewer matrix-vector products (counted)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modules.attention.variants.alignment import sinkhorn_plan
from modules.device_policy import behave_as_cuda, host_reads_are_cheap


def earlier_plan(cost, a, b, eps, iterations, tol):
    """The exp-domain loop as it was, forming v Kᵀ twice after each convergence test."""
    kernel = torch.exp(-cost.double() / eps)
    kernel_t = kernel.transpose(-1, -2).contiguous()
    a, b = a.double(), b.double()
    v = (b > 0).to(b.dtype)
    reads = host_reads_are_cheap(cost)
    stopped = None
    for step in range(iterations):
        new_u = a / (v.unsqueeze(-2) @ kernel_t).squeeze(-2)
        u = new_u if stopped is None else torch.where(stopped, u, new_u)
        new_v = b / (u.unsqueeze(-2) @ kernel).squeeze(-2)
        v = new_v if stopped is None else torch.where(stopped, v, new_v)
        if step % 10 == 9:
            rows = u * (v.unsqueeze(-2) @ kernel_t).squeeze(-2)
            converged = (rows - a).abs().sum(-1).max() < tol
            stopped = converged if stopped is None else stopped | converged
        if reads and stopped is not None and step % 30 == 29 and step < iterations - 1 and bool(stopped):
            break
    return (u.unsqueeze(-1) * kernel * v.unsqueeze(-2)).to(cost.dtype)


class Bmms(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.__name__.startswith(("bmm", "matmul"))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("as_cuda", [False, True])
@pytest.mark.parametrize("iterations, tol", [(50, 1e-4), (50, 1e-12), (7, 1e-4), (35, 1e-12)])
def test_plans_are_the_earlier_loops_bit_for_bit(as_cuda, iterations, tol):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, 12, 5, generator=g), torch.randn(6, 9, 5, generator=g)
    cost = 1 - torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(k, dim=-1).transpose(-1, -2)
    a = torch.full((6, 12), 1 / 12)
    b = torch.rand(6, 9, generator=g)
    b[2, -3:] = 0  # a padded key
    b = b / b.sum(-1, keepdim=True)
    with behave_as_cuda(as_cuda):
        got = sinkhorn_plan(cost, a, b, 0.05, iterations, tol, cost_bound=2.0)
        expected = earlier_plan(cost, a, b, 0.05, iterations, tol)
    assert torch.equal(got, expected)


def test_a_full_solve_forms_one_product_fewer_per_convergence_test_followed_by_an_iteration():
    g = torch.Generator().manual_seed(1)
    cost = torch.rand(4, 8, 8, generator=g) * 2
    a = b = torch.full((4, 8), 1 / 8)
    with behave_as_cuda(), Bmms() as counted:  # every iteration runs on the CUDA path
        sinkhorn_plan(cost, a, b, 0.01, 50, 1e-30, cost_bound=2.0)
    # 2 per iteration and 1 per test (at 10, 20, ..., 50), of which the first four serve the next iteration too
    assert counted.count == 2 * 50 + 5 - 4
