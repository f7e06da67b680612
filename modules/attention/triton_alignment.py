"""The align-* regularisers fused in Triton: one pass over the sampled point clouds instead of dozens of small kernels.

Why. The regulariser of align-gan, align-ct and align-ot acts on at most max_points (64) sampled queries and keys per
(sample, head) cloud, [C, n, d] each. Eagerly, each of its steps (a network layer, its activation, their gradients,
a softmax, a concatenation, each of align-ot's 50 Sinkhorn iterations) is a kernel that reads and writes tensors the
size of the clouds from GPU memory: on the GPU cost page (B = 32, H = 12, L = 512) that was 1.4x (align-gan) to 5.7x
(align-ot) the bytes of the attention itself. Here each program keeps its clouds, the networks' weights and every
intermediate on chip: the forward reads the clouds once and writes the loss, the backward reads them again (the
forward's intermediates are recomputed, not stored) and writes their gradients.

- align-ot (`sinkhorn_loss`): a program per cloud builds the cosine cost from the two clouds, runs the exp-domain
  Sinkhorn iterations in float64 as `alignment.sinkhorn_plan` does (exp(−C/ε) reaches e^−200 at ε = 0.01, below
  float32's range), with its convergence test every 10 iterations, and writes <π, C> and the scalings u, v; the
  backward rebuilds π from them and writes dq, dk through the normalisation. One difference from the eager solve: the
  test stops each cloud on its own (the eager loop stops all clouds when the worst has converged, which needs every
  cloud's result, a pass a single launch cannot wait for), so a cloud that converges early takes fewer iterations; its
  marginals then match to `tol` (1e-4) instead of further, and <π, C> moves by about that much.
- align-gan (`discriminator_loss`) and align-ct (`transport_loss`): the networks' forward and backward per cloud
  (or block of points), the weight gradients summed per program (a fixed slot each, then one sum: deterministic, no
  atomics).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the kernels are built only where Triton is installed (the gpu extra)
    triton = None

MAX_POINTS = 128
"""Largest cloud a program holds on chip (the variants' max_points defaults to 64)."""
MAX_DIM = 128
"""Largest head dimension a program holds on chip."""


def _block(size: int) -> int:
    return max(16, 1 << (size - 1).bit_length())


def fits(n: int, m: int, dim: int) -> bool:
    """Whether clouds of n queries and m keys of `dim` features fit one program."""
    return max(n, m) <= MAX_POINTS and dim <= MAX_DIM


def _none_tensor(like: torch.Tensor) -> torch.Tensor:
    # A stand-in for an absent mask: no bytes (the kernel reads it only where the HAS_ flag says so).
    return torch.empty(0, dtype=torch.bool, device=like.device)


if triton is not None:

    @triton.jit
    def _load_cloud(ptr, cloud, rows, dims, n, D):
        mask = (rows[:, None] < n) & (dims[None, :] < D)
        return tl.load(ptr + cloud.to(tl.int64) * n * D + rows[:, None] * D + dims[None, :], mask=mask,
                       other=0.0).to(tl.float32)

    @triton.jit
    def _store_cloud(ptr, cloud, rows, dims, n, D, value):
        mask = (rows[:, None] < n) & (dims[None, :] < D)
        tl.store(ptr + cloud.to(tl.int64) * n * D + rows[:, None] * D + dims[None, :],
                 value.to(ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _valid(ptr, cloud, rows, n, HAS: tl.constexpr):
        inside = rows < n
        if HAS:
            inside = inside & (tl.load(ptr + cloud.to(tl.int64) * n + rows, mask=rows < n, other=0) != 0)
        return inside

    @triton.jit
    def _uniform_mass(valid, rows, n):
        # `alignment._uniform_mass`: 1/count on the valid points; an empty cloud uniform over its n points
        count = tl.sum(valid.to(tl.float32), axis=0)
        mass = tl.where(valid, 1.0 / tl.maximum(count, 1.0), 0.0)
        return tl.where(count > 0, mass, tl.where(rows < n, 1.0 / n, 0.0))

    @triton.jit
    def _normalized(x):
        # F.normalize: x / max(‖x‖, 1e-12)
        norm = tl.sqrt(tl.sum(x * x, axis=1))
        return x / tl.maximum(norm, 1e-12)[:, None], norm

    @triton.jit
    def _normalized_backward(x_hat, norm, grad_hat):
        # through x / max(‖x‖, 1e-12): (g − x̂ (x̂·g)) / ‖x‖, or g / 1e-12 where the floor holds
        radial = tl.sum(x_hat * grad_hat, axis=1)
        inside = norm > 1e-12
        return tl.where(inside[:, None], (grad_hat - x_hat * radial[:, None]) / tl.maximum(norm, 1e-12)[:, None],
                        grad_hat / 1e-12)

    @triton.jit
    def _ot_cost(Q, K, QV, KV, cloud, n, m, D, HAS_QV: tl.constexpr, HAS_KV: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        q_hat, q_norm = _normalized(_load_cloud(Q, cloud, rows, dims, n, D))
        k_hat, k_norm = _normalized(_load_cloud(K, cloud, cols, dims, m, D))
        q_valid = _valid(QV, cloud, rows, n, HAS_QV)
        k_valid = _valid(KV, cloud, cols, m, HAS_KV)
        pair = q_valid[:, None] & k_valid[None, :]
        cost = tl.where(pair, 1.0 - tl.dot(q_hat, tl.trans(k_hat), input_precision="ieee"), 0.0)
        a = _uniform_mass(q_valid, rows, n)
        b = _uniform_mass(k_valid, cols, m)
        # the kernel exp(−C/ε) on the n × m block only (0 outside it, so the products ignore the padding)
        inside = (rows[:, None] < n) & (cols[None, :] < m)
        return q_hat, q_norm, k_hat, k_norm, pair, cost, inside, a, b

    @triton.jit
    def _sinkhorn_forward_kernel(Q, K, QV, KV, U, V, LOSS, n, m, D, inv_eps, iterations, tol,
                                 HAS_QV: tl.constexpr, HAS_KV: tl.constexpr,
                                 BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        cloud = tl.program_id(0)
        rows = tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_M)
        q_hat, q_norm, k_hat, k_norm, pair, cost, inside, a32, b32 = _ot_cost(
            Q, K, QV, KV, cloud, n, m, D, HAS_QV, HAS_KV, BLOCK_N, BLOCK_M, BLOCK_D)
        a = a32.to(tl.float64)
        b = b32.to(tl.float64)
        kernel = tl.where(inside, tl.exp(-cost.to(tl.float64) * inv_eps), 0.0)
        # `sinkhorn_plan`'s iterations: v starts at 1 on b's support; every 10th iteration tests the rows' marginals
        v = tl.where(b > 0, 1.0, 0.0).to(tl.float64)
        u = tl.zeros((BLOCK_N,), dtype=tl.float64)
        stopped = tl.sum(tl.zeros((BLOCK_N,), dtype=tl.int32), axis=0)
        for step in range(iterations):
            keep = stopped != 0
            new_u = tl.where(rows < n, a / tl.sum(kernel * v[None, :], axis=1), 0.0)
            u = tl.where(keep, u, new_u)
            new_v = tl.where(cols < m, b / tl.sum(kernel * u[:, None], axis=0), 0.0)
            v = tl.where(keep, v, new_v)
            if step % 10 == 9:
                error = tl.sum(tl.abs(u * tl.sum(kernel * v[None, :], axis=1) - a), axis=0)
                stopped = tl.where(error < tol, 1, stopped)
        plan = (u[:, None] * kernel * v[None, :]).to(tl.float32)
        tl.store(LOSS + cloud, tl.sum(tl.sum(plan * cost, axis=1), axis=0))
        tl.store(U + cloud.to(tl.int64) * n + rows, u, mask=rows < n)
        tl.store(V + cloud.to(tl.int64) * m + cols, v, mask=cols < m)

    @triton.jit
    def _sinkhorn_backward_kernel(Q, K, QV, KV, U, V, GRAD, DQ, DK, n, m, D, inv_eps,
                                  HAS_QV: tl.constexpr, HAS_KV: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        cloud = tl.program_id(0)
        rows = tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        q_hat, q_norm, k_hat, k_norm, pair, cost, inside, a32, b32 = _ot_cost(
            Q, K, QV, KV, cloud, n, m, D, HAS_QV, HAS_KV, BLOCK_N, BLOCK_M, BLOCK_D)
        u = tl.load(U + cloud.to(tl.int64) * n + rows, mask=rows < n, other=0.0)
        v = tl.load(V + cloud.to(tl.int64) * m + cols, mask=cols < m, other=0.0)
        kernel = tl.where(inside, tl.exp(-cost.to(tl.float64) * inv_eps), 0.0)
        plan = (u[:, None] * kernel * v[None, :]).to(tl.float32)
        # d<π, C>/dC = π with π held fixed, zero where the cost was masked; C = 1 − q̂ k̂ᵀ
        grad_cos = tl.where(pair, -plan, 0.0) * tl.load(GRAD + cloud)
        grad_q = _normalized_backward(q_hat, q_norm, tl.dot(grad_cos, k_hat, input_precision="ieee"))
        grad_k = _normalized_backward(k_hat, k_norm, tl.dot(tl.trans(grad_cos), q_hat, input_precision="ieee"))
        _store_cloud(DQ, cloud, rows, dims, n, D, grad_q)
        _store_cloud(DK, cloud, cols, dims, m, D, grad_k)


class SinkhornLoss(torch.autograd.Function):
    """<π_ε, C> per cloud for the cosine cost C = 1 − cos(q, k) (masked to 0 off the valid pairs), π_ε held fixed."""

    @staticmethod
    def forward(ctx, q, k, q_valid, k_valid, eps: float, iterations: int, tol: float):
        q, k = q.contiguous(), k.contiguous()
        clouds, n, dim = q.shape
        m = k.shape[1]
        qv = _none_tensor(q) if q_valid is None else q_valid.contiguous()
        kv = _none_tensor(q) if k_valid is None else k_valid.contiguous()
        u = torch.empty((clouds, n), dtype=torch.float64, device=q.device)
        v = torch.empty((clouds, m), dtype=torch.float64, device=q.device)
        loss = torch.empty(clouds, dtype=torch.float32, device=q.device)
        blocks = (_block(n), _block(m), _block(dim))
        _sinkhorn_forward_kernel[(clouds,)](q, k, qv, kv, u, v, loss, n, m, dim, 1.0 / eps, iterations, tol,
                                            q_valid is not None, k_valid is not None, *blocks)
        ctx.save_for_backward(q, k, qv, kv, u, v)
        ctx.flags = (q_valid is not None, k_valid is not None, eps, blocks)
        return loss

    @staticmethod
    def backward(ctx, grad):
        q, k, qv, kv, u, v = ctx.saved_tensors
        has_qv, has_kv, eps, blocks = ctx.flags
        clouds, n, dim = q.shape
        m = k.shape[1]
        grad_q, grad_k = torch.empty_like(q), torch.empty_like(k)
        _sinkhorn_backward_kernel[(clouds,)](q, k, qv, kv, u, v, grad.float().contiguous(), grad_q, grad_k, n, m, dim,
                                             1.0 / eps, has_qv, has_kv, *blocks)
        return grad_q, grad_k, None, None, None, None, None


def sinkhorn_loss(q, k, q_valid, k_valid, eps: float, iterations: int, tol: float) -> torch.Tensor:
    """align-ot's loss per cloud, [C]: q [C, n, d], k [C, m, d], validity [C, n] / [C, m] or None."""
    return SinkhornLoss.apply(q, k, q_valid, k_valid, eps, iterations, tol)
