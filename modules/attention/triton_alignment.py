"""The align-* regularisers fused in Triton: one pass over the sampled point clouds instead of dozens of small kernels.

Why. The regulariser of align-gan, align-ct and align-ot acts on at most max_points (64) sampled queries and keys per
(sample, head) cloud, [C, n, d] each. Eagerly, each of its steps (a network layer, its activation, their gradients,
a softmax, a concatenation, each of align-ot's 50 Sinkhorn iterations) is a kernel that reads and writes tensors the
size of the clouds from GPU memory: on the GPU cost page (B = 32, H = 12, L = 512) the regulariser added 1.3x
(align-gan) to 5.7x (align-ot) the bytes of SDPA softmax's whole forward and backward. Here each program keeps its clouds, the networks' weights and every
intermediate on chip: the forward reads the clouds once and writes the loss, the backward reads them again (the
forward's intermediates are recomputed, not stored) and writes their gradients.

- align-ot (`sinkhorn_loss`): a program per cloud builds the cosine cost from the two clouds, runs the exp-domain
  Sinkhorn iterations in float64 as `alignment.sinkhorn_plan` does (exp(−C/ε) reaches e^−200 at ε = 0.01, below
  float32's range), with its convergence test every 10 iterations, and writes <π, C> and the scalings u, v; the
  backward rebuilds π from them and writes dq, dk through the normalisation. One difference from the eager solve: the
  test stops each cloud on its own (the eager loop stops all clouds when the worst has converged, which needs every
  cloud's result, a pass a single launch cannot wait for), so a cloud that converges early takes fewer iterations; its
  marginals then match to `tol` (1e-4, in L1) instead of further, and <π, C> (costs at most 2) moves by at most about
twice that.
- align-gan (`discriminator_loss`): the discriminator's forward and backward per block of points (its points are
  independent), the weight gradients summed per program (a fixed slot each, then one sum: deterministic, no atomics).
- align-ct (`transport_loss`): the critic and the navigator per block of points as for align-gan, writing their
  outputs (16 features per point each, a quarter of the points' size), and the coupling per cloud (the cost, the
  affinity, both conditional plans and the loss), which the backward runs first to give the networks' kernel the
  gradients of those outputs. One kernel for all of it held the networks' and the coupling's tiles at once: 174 KB of
  shared memory (sm_90 compile) and ten minutes to compile.
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import register_flop_formula

try:
    import triton
    import triton.language as tl
except ImportError:  # the kernels are built only where Triton is installed (the gpu extra)
    triton = None

MAX_POINTS = 64
"""Largest cloud a program holds on chip (the variants' max_points, 64 by default); larger ones run eagerly."""
MAX_DIM = 64
"""Largest head dimension (and network width) a program holds on chip: the tiles' shared memory was measured to fit an
sm_86 card's 99 KB at 64 (compiled for sm_90: tests/attention/test_alignment_triton_compile.py)."""


def _block(size: int) -> int:
    return max(16, 1 << (size - 1).bit_length())


def fits(n: int, m: int, dim: int) -> bool:
    """Whether clouds of n queries and m keys of `dim` features fit one program."""
    return max(n, m) <= MAX_POINTS and dim <= MAX_DIM


def _mask(valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    # An absent mask's stand-in: no bytes (the kernel reads a mask only where its HAS_ flag says it is there).
    return torch.empty(0, dtype=torch.bool, device=like.device) if valid is None else valid


def _contiguous(valid: torch.Tensor | None) -> torch.Tensor | None:
    return None if valid is None else valid.contiguous()


if triton is not None:

    @triton.jit
    def _load_cloud(ptr, cloud, rows, dims, n, D):
        mask = (rows[:, None] < n) & (dims[None, :] < D)
        return tl.load(ptr + tl.cast(cloud, tl.int64) * n * D + rows[:, None] * D + dims[None, :], mask=mask,
                       other=0.0).to(tl.float32)

    @triton.jit
    def _store_cloud(ptr, cloud, rows, dims, n, D, value):
        mask = (rows[:, None] < n) & (dims[None, :] < D)
        tl.store(ptr + tl.cast(cloud, tl.int64) * n * D + rows[:, None] * D + dims[None, :],
                 value.to(ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _valid(ptr, offset, rows, n, HAS: tl.constexpr):
        inside = rows < n
        if HAS:
            inside = inside & (tl.load(ptr + offset + rows, mask=rows < n, other=0) != 0)
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
        q_valid = _valid(QV, tl.cast(cloud, tl.int64) * n, rows, n, HAS_QV)
        k_valid = _valid(KV, tl.cast(cloud, tl.int64) * m, cols, m, HAS_KV)
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
        tl.store(U + tl.cast(cloud, tl.int64) * n + rows, u, mask=rows < n)
        tl.store(V + tl.cast(cloud, tl.int64) * m + cols, v, mask=cols < m)

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
        u = tl.load(U + tl.cast(cloud, tl.int64) * n + rows, mask=rows < n, other=0.0)
        v = tl.load(V + tl.cast(cloud, tl.int64) * m + cols, mask=cols < m, other=0.0)
        kernel = tl.where(inside, tl.exp(-cost.to(tl.float64) * inv_eps), 0.0)
        plan = (u[:, None] * kernel * v[None, :]).to(tl.float32)
        # d<π, C>/dC = π with π held fixed, zero where the cost was masked; C = 1 − q̂ k̂ᵀ
        grad_cos = tl.where(pair, -plan, 0.0) * tl.load(GRAD + cloud)
        grad_q = _normalized_backward(q_hat, q_norm, tl.dot(grad_cos, k_hat, input_precision="ieee"))
        grad_k = _normalized_backward(k_hat, k_norm, tl.dot(tl.trans(grad_cos), q_hat, input_precision="ieee"))
        _store_cloud(DQ, cloud, rows, dims, n, D, grad_q)
        _store_cloud(DK, cloud, cols, dims, m, D, grad_k)


# Each launch is a functional custom op (attnbench::*): what it reads are its arguments, what it writes its results. A
# dispatch mode (the GPU cost page, a profiler) sees one op per launch, and FakeTensorMode its fake form (shapes only).
@torch.library.custom_op("attnbench::align_sinkhorn", mutates_args=())
def align_sinkhorn(q: torch.Tensor, k: torch.Tensor, q_valid: torch.Tensor | None, k_valid: torch.Tensor | None,
                   eps: float, iterations: int, tol: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(<π, C> per cloud [C] float32, the scalings u [C, n] and v [C, m] float64) for clouds q [C, n, d], k [C, m, d]."""
    clouds, n, dim = q.shape
    m = k.shape[1]
    u = torch.empty((clouds, n), dtype=torch.float64, device=q.device)
    v = torch.empty((clouds, m), dtype=torch.float64, device=q.device)
    loss = torch.empty(clouds, dtype=torch.float32, device=q.device)
    _sinkhorn_forward_kernel[(clouds,)](q, k, _mask(q_valid, q), _mask(k_valid, q), u, v, loss, n, m, dim, 1.0 / eps,
                                        iterations, tol, q_valid is not None, k_valid is not None,
                                        _block(n), _block(m), _block(dim))
    return loss, u, v


@align_sinkhorn.register_fake
def _(q, k, q_valid, k_valid, eps, iterations, tol):
    clouds, n, m = q.shape[0], q.shape[1], k.shape[1]
    return (q.new_empty(clouds, dtype=torch.float32), q.new_empty((clouds, n), dtype=torch.float64),
            q.new_empty((clouds, m), dtype=torch.float64))


@torch.library.custom_op("attnbench::align_sinkhorn_backward", mutates_args=())
def align_sinkhorn_backward(q: torch.Tensor, k: torch.Tensor, q_valid: torch.Tensor | None,
                            k_valid: torch.Tensor | None, u: torch.Tensor, v: torch.Tensor, grad: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dk) for the gradient [C] of <π, C> per cloud, π rebuilt from u, v and held fixed."""
    clouds, n, dim = q.shape
    m = k.shape[1]
    grad_q, grad_k = torch.empty_like(q), torch.empty_like(k)
    _sinkhorn_backward_kernel[(clouds,)](q, k, _mask(q_valid, q), _mask(k_valid, q), u, v, grad, grad_q, grad_k, n, m,
                                         dim, 1.0 / eps, q_valid is not None, k_valid is not None,
                                         _block(n), _block(m), _block(dim))
    return grad_q, grad_k


@align_sinkhorn_backward.register_fake
def _(q, k, q_valid, k_valid, u, v, grad, eps):
    return torch.empty_like(q), torch.empty_like(k)


class SinkhornLoss(torch.autograd.Function):
    """<π_ε, C> per cloud for the cosine cost C = 1 − cos(q, k) (masked to 0 off the valid pairs), π_ε held fixed."""

    @staticmethod
    def forward(ctx, q, k, q_valid, k_valid, eps: float, iterations: int, tol: float):
        q, k = q.contiguous(), k.contiguous()
        q_valid, k_valid = _contiguous(q_valid), _contiguous(k_valid)
        loss, u, v = align_sinkhorn(q, k, q_valid, k_valid, eps, iterations, tol)
        ctx.save_for_backward(q, k, q_valid, k_valid, u, v)
        ctx.eps = eps
        return loss

    @staticmethod
    def backward(ctx, grad):
        q, k, q_valid, k_valid, u, v = ctx.saved_tensors
        grad_q, grad_k = align_sinkhorn_backward(q, k, q_valid, k_valid, u, v, grad.float().contiguous(), ctx.eps)
        return grad_q, grad_k, None, None, None, None, None


def sinkhorn_loss(q, k, q_valid, k_valid, eps: float, iterations: int, tol: float) -> torch.Tensor:
    """align-ot's loss per cloud, [C]: q [C, n, d], k [C, m, d], validity [C, n] / [C, m] or None."""
    return SinkhornLoss.apply(q, k, q_valid, k_valid, eps, iterations, tol)


# ---- the highway networks (align-gan's discriminator, align-ct's critic) -------------------------------------------

BLOCK_POINTS = 32
"""Points per block of a network kernel: at 64 the discriminator's backward took 102 KB of shared memory (compiled
for sm_90 at d = 64, bf16), past an sm_86 card's 99 KB; 70 KB at 32."""
PROGRAMS = 64
"""Most programs of a network kernel: each sums its points' weight gradients in registers and writes them once to a
slot of its own, summed after the launch (deterministic, unlike atomics); 64 slots of the weights' size stay small."""

if triton is not None:

    @triton.jit
    def _load_matrix(ptr, rows, cols, n_rows, n_cols):
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        return tl.load(ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def _load_vector(ptr, index, size):
        return tl.load(ptr + index, mask=index < size, other=0.0).to(tl.float32)

    @triton.jit
    def _highway_forward(x, WP, BP, W1, B1, D, HIDDEN, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
        """`alignment.highway_mlp` up to its last layer: Highway (gate σ(Φ_τ x), transform ReLU(Φ_h x), one [2D, D]
        matrix), Linear(D, HIDDEN), LeakyReLU(0.2). Points are rows of x [P, BLOCK_D] (zero past D)."""
        dims = tl.arange(0, BLOCK_D)
        hid = tl.arange(0, BLOCK_H)
        gate_pre = tl.dot(x, tl.trans(_load_matrix(WP, dims, dims, D, D)), input_precision="ieee") \
            + _load_vector(BP, dims, D)[None, :]
        transform_pre = tl.dot(x, tl.trans(_load_matrix(WP + D * D, dims, dims, D, D)), input_precision="ieee") \
            + _load_vector(BP + D, dims, D)[None, :]
        gate = tl.sigmoid(gate_pre)
        mixed = gate * tl.maximum(transform_pre, 0.0) + (1 - gate) * x
        hidden_pre = tl.dot(mixed, tl.trans(_load_matrix(W1, hid, dims, HIDDEN, D)), input_precision="ieee") \
            + _load_vector(B1, hid, HIDDEN)[None, :]
        hidden = tl.where(hidden_pre > 0, hidden_pre, 0.2 * hidden_pre)
        return gate, transform_pre, mixed, hidden_pre, hidden

    @triton.jit
    def _highway_backward(x, gate, transform_pre, mixed, hidden_pre, grad_hidden, W1, WP, D, HIDDEN,
                          BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
        """The gradients of `_highway_forward` for the gradient of its `hidden`: x's, and the weights' summed over the
        points (rows where grad_hidden is 0 add nothing)."""
        dims = tl.arange(0, BLOCK_D)
        hid = tl.arange(0, BLOCK_H)
        grad_hidden_pre = tl.where(hidden_pre > 0, grad_hidden, 0.2 * grad_hidden)
        grad_w1 = tl.dot(tl.trans(grad_hidden_pre), mixed, input_precision="ieee")
        grad_b1 = tl.sum(grad_hidden_pre, axis=0)
        grad_mixed = tl.dot(grad_hidden_pre, _load_matrix(W1, hid, dims, HIDDEN, D), input_precision="ieee")
        grad_gate_pre = grad_mixed * (tl.maximum(transform_pre, 0.0) - x) * gate * (1 - gate)
        grad_transform_pre = tl.where(transform_pre > 0, grad_mixed * gate, 0.0)
        grad_x = grad_mixed * (1 - gate) \
            + tl.dot(grad_gate_pre, _load_matrix(WP, dims, dims, D, D), input_precision="ieee") \
            + tl.dot(grad_transform_pre, _load_matrix(WP + D * D, dims, dims, D, D), input_precision="ieee")
        grad_wg = tl.dot(tl.trans(grad_gate_pre), x, input_precision="ieee")
        grad_wt = tl.dot(tl.trans(grad_transform_pre), x, input_precision="ieee")
        return (grad_x, grad_wg, tl.sum(grad_gate_pre, axis=0), grad_wt, tl.sum(grad_transform_pre, axis=0),
                grad_w1, grad_b1)

    @triton.jit
    def _store_matrix(ptr, rows, cols, n_rows, n_cols, value):
        tl.store(ptr + rows[:, None] * n_cols + cols[None, :], value,
                 mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))

    @triton.jit
    def _discriminator_block(X, VALID, COUNTS, start, total, label, side, WP, BP, W1, B1, W2, B2, D, HIDDEN,
                             HAS_VALID: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_H: tl.constexpr):
        """One block of points through the discriminator: the points, their loss weights (½ valid / count, zero past
        the cloud), the intermediates and the logits' BCE."""
        points = start + tl.arange(0, BLOCK_P)
        dims = tl.arange(0, BLOCK_D)
        hid = tl.arange(0, BLOCK_H)
        x = tl.load(X + points.to(tl.int64)[:, None] * D + dims[None, :],
                    mask=(points[:, None] < total) & (dims[None, :] < D), other=0.0).to(tl.float32)
        valid = _valid(VALID, 0, points, total, HAS_VALID)
        weight = tl.where(valid, 0.5 / tl.maximum(tl.load(COUNTS + side), 1.0), 0.0)
        gate, transform_pre, mixed, hidden_pre, hidden = _highway_forward(x, WP, BP, W1, B1, D, HIDDEN, BLOCK_D,
                                                                          BLOCK_H)
        logit = tl.sum(hidden * _load_vector(W2, hid, HIDDEN)[None, :], axis=1) + tl.load(B2).to(tl.float32)
        # binary_cross_entropy_with_logits: max(l, 0) − l·y + log(1 + e^−|l|)
        bce = tl.maximum(logit, 0.0) - logit * label + tl.log(1 + tl.exp(-tl.abs(logit)))
        return x, weight, gate, transform_pre, mixed, hidden_pre, hidden, logit, tl.sum(weight * bce, axis=0)

    @triton.jit
    def _discriminator_kernel(Q, K, QV, KV, COUNTS, WP, BP, W1, B1, W2, B2, LOSS, GRAD, DQ, DK,
                              GWP, GBP, GW1, GB1, GW2, GB2, n_q, n_k, D, HIDDEN,
                              HAS_QV: tl.constexpr, HAS_KV: tl.constexpr, BACKWARD: tl.constexpr,
                              STORE_DQ: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
                              BLOCK_H: tl.constexpr):
        """align-gan's loss: keys labelled 1, queries 0, each side's BCE averaged over its valid points, the two
        averaged; program `pid` takes the point blocks pid, pid + programs, ... of the queries, then of the keys.
        BACKWARD: recompute, and write the points' gradients (reversed: the discriminator's input goes through the
        gradient reversal) and this program's sums of the weights' gradients."""
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        dims = tl.arange(0, BLOCK_D)
        hid = tl.arange(0, BLOCK_H)
        loss = 0.0
        grad_wg = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
        grad_wt = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
        grad_bg = tl.zeros((BLOCK_D,), dtype=tl.float32)
        grad_bt = tl.zeros((BLOCK_D,), dtype=tl.float32)
        grad_w1 = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
        grad_b1 = tl.zeros((BLOCK_H,), dtype=tl.float32)
        grad_w2 = tl.zeros((BLOCK_H,), dtype=tl.float32)
        grad_b2 = 0.0
        upstream = 0.0
        if BACKWARD:
            upstream = tl.load(GRAD).to(tl.float32)
        for side in tl.static_range(2):
            if side == 0:
                total = n_q
            else:
                total = n_k
            for start in range(pid * BLOCK_P, total, programs * BLOCK_P):
                if side == 0:
                    x, weight, gate, transform_pre, mixed, hidden_pre, hidden, logit, part = _discriminator_block(
                        Q, QV, COUNTS, start, n_q, 0.0, 0, WP, BP, W1, B1, W2, B2, D, HIDDEN, HAS_QV, BLOCK_P,
                        BLOCK_D, BLOCK_H)
                else:
                    x, weight, gate, transform_pre, mixed, hidden_pre, hidden, logit, part = _discriminator_block(
                        K, KV, COUNTS, start, n_k, 1.0, 1, WP, BP, W1, B1, W2, B2, D, HIDDEN, HAS_KV, BLOCK_P,
                        BLOCK_D, BLOCK_H)
                loss += part
                if BACKWARD:
                    grad_logit = weight * (tl.sigmoid(logit) - side) * upstream
                    grad_w2 += tl.sum(grad_logit[:, None] * hidden, axis=0)
                    grad_b2 += tl.sum(grad_logit, axis=0)
                    grad_hidden = grad_logit[:, None] * _load_vector(W2, hid, HIDDEN)[None, :]
                    grad_x, g_wg, g_bg, g_wt, g_bt, g_w1, g_b1 = _highway_backward(
                        x, gate, transform_pre, mixed, hidden_pre, grad_hidden, W1, WP, D, HIDDEN, BLOCK_D, BLOCK_H)
                    grad_wg += g_wg
                    grad_bg += g_bg
                    grad_wt += g_wt
                    grad_bt += g_bt
                    grad_w1 += g_w1
                    grad_b1 += g_b1
                    points = start + tl.arange(0, BLOCK_P)
                    at = points.to(tl.int64)[:, None] * D + dims[None, :]
                    if side == 0:
                        if STORE_DQ:
                            tl.store(DQ + at, (-grad_x).to(DQ.dtype.element_ty),
                                     mask=(points[:, None] < n_q) & (dims[None, :] < D))
                    else:
                        tl.store(DK + at, (-grad_x).to(DK.dtype.element_ty),
                                 mask=(points[:, None] < n_k) & (dims[None, :] < D))
        if BACKWARD:
            _store_matrix(GWP + pid * 2 * D * D, dims, dims, D, D, grad_wg)
            _store_matrix(GWP + pid * 2 * D * D + D * D, dims, dims, D, D, grad_wt)
            tl.store(GBP + pid * 2 * D + dims, grad_bg, mask=dims < D)
            tl.store(GBP + pid * 2 * D + D + dims, grad_bt, mask=dims < D)
            _store_matrix(GW1 + pid * HIDDEN * D, hid, dims, HIDDEN, D, grad_w1)
            tl.store(GB1 + pid * HIDDEN + hid, grad_b1, mask=hid < HIDDEN)
            tl.store(GW2 + pid * HIDDEN + hid, grad_w2, mask=hid < HIDDEN)
            tl.store(GB2 + pid, grad_b2)
        else:
            tl.store(LOSS + pid, loss)


def _programs(points: int) -> int:
    return max(1, min(PROGRAMS, -(-points // BLOCK_POINTS)))


@torch.library.custom_op("attnbench::align_discriminator", mutates_args=())
def align_discriminator(q: torch.Tensor, k: torch.Tensor, q_valid: torch.Tensor | None, k_valid: torch.Tensor | None,
                        counts: torch.Tensor, wp: torch.Tensor, bp: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor,
                        w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """align-gan's loss, one partial sum per program (their sum is the loss): q [C, n, d], k [C, m, d], `counts` the
    valid queries and keys over all clouds, the discriminator's weights."""
    dim, hidden = q.shape[-1], w1.shape[0]
    n_q, n_k = q.numel() // dim, k.numel() // dim
    programs = _programs(max(n_q, n_k))
    losses = torch.empty(programs, dtype=torch.float32, device=q.device)
    empty = torch.empty(0, dtype=torch.float32, device=q.device)
    _discriminator_kernel[(programs,)](q, k, _mask(q_valid, q), _mask(k_valid, q), counts, wp, bp, w1, b1, w2, b2,
                                       losses, *([empty] * 9), n_q, n_k, dim, hidden,
                                       q_valid is not None, k_valid is not None, False, False,
                                       BLOCK_POINTS, _block(dim), _block(hidden))
    return losses


@align_discriminator.register_fake
def _(q, k, q_valid, k_valid, counts, wp, bp, w1, b1, w2, b2):
    dim = q.shape[-1]
    return q.new_empty(_programs(max(q.numel() // dim, k.numel() // dim)), dtype=torch.float32)


@torch.library.custom_op("attnbench::align_discriminator_backward", mutates_args=())
def align_discriminator_backward(q: torch.Tensor, k: torch.Tensor, q_valid: torch.Tensor | None,
                                 k_valid: torch.Tensor | None, counts: torch.Tensor, wp: torch.Tensor,
                                 bp: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                                 b2: torch.Tensor, grad: torch.Tensor, with_queries: bool) -> list[torch.Tensor]:
    """[dq (empty unless with_queries), dk, then each weight's gradient summed per program, [programs, *shape]]; the
    points' gradients reversed (the gradient reversal at the discriminator's input)."""
    dim, hidden = q.shape[-1], w1.shape[0]
    n_q, n_k = q.numel() // dim, k.numel() // dim
    programs = _programs(max(n_q, n_k))
    grad_q = torch.empty_like(q) if with_queries else q.new_empty(0)
    grad_k = torch.empty_like(k)
    partial = [torch.empty((programs, *p.shape), dtype=torch.float32, device=q.device) for p in (wp, bp, w1, b1, w2, b2)]
    empty = torch.empty(0, dtype=torch.float32, device=q.device)
    _discriminator_kernel[(programs,)](q, k, _mask(q_valid, q), _mask(k_valid, q), counts, wp, bp, w1, b1, w2, b2,
                                       empty, grad, grad_q, grad_k, *partial, n_q, n_k, dim, hidden,
                                       q_valid is not None, k_valid is not None, True, with_queries,
                                       BLOCK_POINTS, _block(dim), _block(hidden))
    return [grad_q, grad_k, *partial]


@align_discriminator_backward.register_fake
def _(q, k, q_valid, k_valid, counts, wp, bp, w1, b1, w2, b2, grad, with_queries):
    dim = q.shape[-1]
    programs = _programs(max(q.numel() // dim, k.numel() // dim))
    return [torch.empty_like(q) if with_queries else q.new_empty(0), torch.empty_like(k),
            *[q.new_empty((programs, *p.shape), dtype=torch.float32) for p in (wp, bp, w1, b1, w2, b2)]]


class DiscriminatorLoss(torch.autograd.Function):
    """align-gan's BCE of a highway discriminator on the query (label 0) and key (label 1) clouds, the clouds' input
    gradient reversed."""

    @staticmethod
    def forward(ctx, q, k, q_valid, k_valid, *params):
        q, k = q.contiguous(), k.contiguous()
        q_valid, k_valid = _contiguous(q_valid), _contiguous(k_valid)
        # each side's valid points over every cloud, on the device (a fill where all are, not a copy from the host)
        counts = torch.stack([
            q_valid.sum().float() if q_valid is not None else torch.full((), float(q.numel() // q.shape[-1]),
                                                                         device=q.device),
            k_valid.sum().float() if k_valid is not None else torch.full((), float(k.numel() // k.shape[-1]),
                                                                         device=q.device)])
        params = [p.contiguous() for p in params]
        losses = align_discriminator(q, k, q_valid, k_valid, counts, *params)
        ctx.save_for_backward(q, k, q_valid, k_valid, counts, *params)
        return losses.sum()

    @staticmethod
    def backward(ctx, grad):
        q, k, q_valid, k_valid, counts, *params = ctx.saved_tensors
        with_queries = ctx.needs_input_grad[0]
        grad_q, grad_k, *partial = align_discriminator_backward(q, k, q_valid, k_valid, counts, *params,
                                                                grad.float().reshape(1), with_queries)
        grads = [s.sum(0).to(p.dtype) for s, p in zip(partial, params)]
        return (grad_q if with_queries else None), grad_k, None, None, *grads


def discriminator_loss(q, k, q_valid, k_valid, discriminator: torch.nn.Sequential) -> torch.Tensor:
    """align-gan's loss (½ (mean BCE of the keys as 1 + mean BCE of the queries as 0)) with the gradient reversal at
    the discriminator's input: q [C, n, d], k [C, m, d], validity [C, n] / [C, m] or None; `discriminator` is
    `alignment.highway_mlp(d, hidden, 1)`."""
    highway, first, _, last = discriminator
    return DiscriminatorLoss.apply(q, k, q_valid, k_valid, highway.proj.weight, highway.proj.bias, first.weight,
                                   first.bias, last.weight, last.bias)


# ---- align-ct: the critic (a highway network), the navigator and the conditional transport -------------------------

if triton is not None:

    @triton.jit
    def _critic_features(x, WP, BP, W1, B1, W2, B2, D, HIDDEN, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
        hid = tl.arange(0, BLOCK_H)
        _, _, _, _, hidden = _highway_forward(x, WP, BP, W1, B1, D, HIDDEN, BLOCK_D, BLOCK_H)
        out = tl.dot(hidden, tl.trans(_load_matrix(W2, hid, hid, HIDDEN, HIDDEN)), input_precision="ieee") \
            + _load_vector(B2, hid, HIDDEN)[None, :]
        return out, hidden

    @triton.jit
    def _navigator_features(x, NW1, NB1, NW2, NB2, D, HIDDEN, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
        dims = tl.arange(0, BLOCK_D)
        hid = tl.arange(0, BLOCK_H)
        pre = tl.dot(x, tl.trans(_load_matrix(NW1, hid, dims, HIDDEN, D)), input_precision="ieee") \
            + _load_vector(NB1, hid, HIDDEN)[None, :]
        hidden = tl.maximum(pre, 0.0)
        out = tl.dot(hidden, tl.trans(_load_matrix(NW2, hid, hid, HIDDEN, HIDDEN)), input_precision="ieee") \
            + _load_vector(NB2, hid, HIDDEN)[None, :]
        norm = tl.sqrt(tl.sum(out * out, axis=1))
        # the authors' navigator_for: x / (‖x‖ + 1e-6)
        return out / (norm + 1e-6)[:, None], out, norm, pre, hidden

    @triton.jit
    def _navigator_backward(x, grad_unit, NW1, NB1, NW2, NB2, D, HIDDEN, BLOCK_D: tl.constexpr,
                            BLOCK_H: tl.constexpr):
        dims = tl.arange(0, BLOCK_D)
        hid = tl.arange(0, BLOCK_H)
        _, out, norm, pre, hidden = _navigator_features(x, NW1, NB1, NW2, NB2, D, HIDDEN, BLOCK_D, BLOCK_H)
        shifted = norm + 1e-6
        # through out / (‖out‖ + 1e-6); the norm's own gradient is 0 where the norm is (as torch's)
        radial = tl.sum(out * grad_unit, axis=1)
        grad_out = grad_unit / shifted[:, None] \
            - tl.where(norm > 0, radial / (tl.maximum(norm, 1e-30) * shifted * shifted), 0.0)[:, None] * out
        grad_w2 = tl.dot(tl.trans(grad_out), hidden, input_precision="ieee")
        grad_b2 = tl.sum(grad_out, axis=0)
        grad_pre = tl.where(pre > 0, tl.dot(grad_out, _load_matrix(NW2, hid, hid, HIDDEN, HIDDEN),
                                            input_precision="ieee"), 0.0)
        grad_w1 = tl.dot(tl.trans(grad_pre), x, input_precision="ieee")
        grad_b1 = tl.sum(grad_pre, axis=0)
        grad_x = tl.dot(grad_pre, _load_matrix(NW1, hid, dims, HIDDEN, D), input_precision="ieee")
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2

    @triton.jit
    def _critic_backward(x, grad_features, WP, BP, W1, B1, W2, B2, D, HIDDEN, BLOCK_D: tl.constexpr,
                         BLOCK_H: tl.constexpr):
        """x's gradient and the critic's weights' (as the loss's: the caller reverses them)."""
        hid = tl.arange(0, BLOCK_H)
        gate, transform_pre, mixed, hidden_pre, hidden = _highway_forward(x, WP, BP, W1, B1, D, HIDDEN, BLOCK_D,
                                                                          BLOCK_H)
        grad_w2 = tl.dot(tl.trans(grad_features), hidden, input_precision="ieee")
        grad_b2 = tl.sum(grad_features, axis=0)
        grad_hidden = tl.dot(grad_features, _load_matrix(W2, hid, hid, HIDDEN, HIDDEN), input_precision="ieee")
        grad_x, grad_wg, grad_bg, grad_wt, grad_bt, grad_w1, grad_b1 = _highway_backward(
            x, gate, transform_pre, mixed, hidden_pre, grad_hidden, W1, WP, D, HIDDEN, BLOCK_D, BLOCK_H)
        return grad_x, grad_wg, grad_bg, grad_wt, grad_bt, grad_w1, grad_b1, grad_w2, grad_b2

    @triton.jit
    def _ct_networks_kernel(Q, K, WP, BP, W1, B1, W2, B2, NW1, NB1, NW2, NB2, FEATURES, GRAD_FEATURES, DQ, DK,
                            GWP, GBP, GW1, GB1, GW2, GB2, GNW1, GNB1, GNW2, GNB2, n_q, n_k, D, HIDDEN,
                            BACKWARD: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_H: tl.constexpr):
        """align-ct's two networks on every point (program `pid` takes the point blocks pid, pid + programs, ... of
        the queries, then of the keys). FEATURES [4, n_q + n_k, HIDDEN] holds per point the critic's output, then the
        navigator's unit output (rows: queries then keys). Forward: writes them. BACKWARD: reads their gradients from
        GRAD_FEATURES, recomputes the networks, writes dq, dk and this program's sums of the weights' gradients (the
        critic's reversed: it maximises the loss, through its two gradient reversals)."""
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        dims = tl.arange(0, BLOCK_D)
        hid = tl.arange(0, BLOCK_H)
        total = n_q + n_k
        c_wg = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
        c_wt = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
        c_bg = tl.zeros((BLOCK_D,), dtype=tl.float32)
        c_bt = tl.zeros((BLOCK_D,), dtype=tl.float32)
        c_w1 = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
        c_b1 = tl.zeros((BLOCK_H,), dtype=tl.float32)
        c_w2 = tl.zeros((BLOCK_H, BLOCK_H), dtype=tl.float32)
        c_b2 = tl.zeros((BLOCK_H,), dtype=tl.float32)
        n_w1 = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
        n_b1 = tl.zeros((BLOCK_H,), dtype=tl.float32)
        n_w2 = tl.zeros((BLOCK_H, BLOCK_H), dtype=tl.float32)
        n_b2 = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for side in tl.static_range(2):
            if side == 0:
                size = n_q
            else:
                size = n_k
            for start in range(pid * BLOCK_P, size, programs * BLOCK_P):
                points = start + tl.arange(0, BLOCK_P)
                inside = points < size
                at = points.to(tl.int64)[:, None] * D + dims[None, :]
                mask = inside[:, None] & (dims[None, :] < D)
                if side == 0:
                    x = tl.load(Q + at, mask=mask, other=0.0).to(tl.float32)
                else:
                    x = tl.load(K + at, mask=mask, other=0.0).to(tl.float32)
                # this block's rows of FEATURES: the keys' after the queries'
                feature_at = (points + side * n_q).to(tl.int64)[:, None] * HIDDEN + hid[None, :]
                feature_mask = inside[:, None] & (hid[None, :] < HIDDEN)
                if BACKWARD:
                    grad_critic = tl.load(GRAD_FEATURES + feature_at, mask=feature_mask, other=0.0)
                    grad_unit = tl.load(GRAD_FEATURES + total * HIDDEN + feature_at, mask=feature_mask, other=0.0)
                    grad_x, g_wg, g_bg, g_wt, g_bt, g_w1, g_b1, g_w2, g_b2 = _critic_backward(
                        x, grad_critic, WP, BP, W1, B1, W2, B2, D, HIDDEN, BLOCK_D, BLOCK_H)
                    c_wg += g_wg
                    c_bg += g_bg
                    c_wt += g_wt
                    c_bt += g_bt
                    c_w1 += g_w1
                    c_b1 += g_b1
                    c_w2 += g_w2
                    c_b2 += g_b2
                    nav_x, g_w1, g_b1, g_w2, g_b2 = _navigator_backward(x, grad_unit, NW1, NB1, NW2, NB2, D, HIDDEN,
                                                                        BLOCK_D, BLOCK_H)
                    n_w1 += g_w1
                    n_b1 += g_b1
                    n_w2 += g_w2
                    n_b2 += g_b2
                    if side == 0:
                        tl.store(DQ + at, (grad_x + nav_x).to(DQ.dtype.element_ty), mask=mask)
                    else:
                        tl.store(DK + at, (grad_x + nav_x).to(DK.dtype.element_ty), mask=mask)
                else:
                    critic, _ = _critic_features(x, WP, BP, W1, B1, W2, B2, D, HIDDEN, BLOCK_D, BLOCK_H)
                    unit, _, _, _, _ = _navigator_features(x, NW1, NB1, NW2, NB2, D, HIDDEN, BLOCK_D, BLOCK_H)
                    tl.store(FEATURES + feature_at, critic, mask=feature_mask)
                    tl.store(FEATURES + total * HIDDEN + feature_at, unit, mask=feature_mask)
        if BACKWARD:
            _store_matrix(GWP + pid * 2 * D * D, dims, dims, D, D, -c_wg)
            _store_matrix(GWP + pid * 2 * D * D + D * D, dims, dims, D, D, -c_wt)
            tl.store(GBP + pid * 2 * D + dims, -c_bg, mask=dims < D)
            tl.store(GBP + pid * 2 * D + D + dims, -c_bt, mask=dims < D)
            _store_matrix(GW1 + pid * HIDDEN * D, hid, dims, HIDDEN, D, -c_w1)
            tl.store(GB1 + pid * HIDDEN + hid, -c_b1, mask=hid < HIDDEN)
            _store_matrix(GW2 + pid * HIDDEN * HIDDEN, hid, hid, HIDDEN, HIDDEN, -c_w2)
            tl.store(GB2 + pid * HIDDEN + hid, -c_b2, mask=hid < HIDDEN)
            _store_matrix(GNW1 + pid * HIDDEN * D, hid, dims, HIDDEN, D, n_w1)
            tl.store(GNB1 + pid * HIDDEN + hid, n_b1, mask=hid < HIDDEN)
            _store_matrix(GNW2 + pid * HIDDEN * HIDDEN, hid, hid, HIDDEN, HIDDEN, n_w2)
            tl.store(GNB2 + pid * HIDDEN + hid, n_b2, mask=hid < HIDDEN)

    @triton.jit
    def _ct_coupling_kernel(FEATURES, QV, KV, LOSS, GRAD, GRAD_FEATURES, clouds, n, m, HIDDEN, rho,
                            HAS_QV: tl.constexpr, HAS_KV: tl.constexpr, BACKWARD: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
        """align-ct's loss for one cloud from its points' features (`_ct_networks_kernel`): the critic's cost
        c = 1 − cos(τ_η(q), τ_η(k)) (0 off the valid pairs), the navigator's affinity, the plans π(k|q) (softmax over
        the valid keys) and π(q|k) (over the valid queries), and ρ Σ_i a_i Σ_j π(k_j|q_i) c_ij + (1 − ρ) Σ_j b_j Σ_i
        π(q_i|k_j) c_ij, divided by the clouds (the mean). BACKWARD: the features' gradients."""
        cloud = tl.program_id(0)
        rows = tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_M)
        hid = tl.arange(0, BLOCK_H)
        total = clouds * (n + m)
        q_rows = tl.cast(cloud, tl.int64) * n + rows
        k_rows = tl.cast(clouds, tl.int64) * n + tl.cast(cloud, tl.int64) * m + cols
        q_at = q_rows[:, None] * HIDDEN + hid[None, :]
        k_at = k_rows[:, None] * HIDDEN + hid[None, :]
        q_mask = (rows[:, None] < n) & (hid[None, :] < HIDDEN)
        k_mask = (cols[:, None] < m) & (hid[None, :] < HIDDEN)
        q_unit, q_norm = _normalized(tl.load(FEATURES + q_at, mask=q_mask, other=0.0))
        k_unit, k_norm = _normalized(tl.load(FEATURES + k_at, mask=k_mask, other=0.0))
        q_nav = tl.load(FEATURES + total * HIDDEN + q_at, mask=q_mask, other=0.0)
        k_nav = tl.load(FEATURES + total * HIDDEN + k_at, mask=k_mask, other=0.0)
        q_valid = _valid(QV, tl.cast(cloud, tl.int64) * n, rows, n, HAS_QV)
        k_valid = _valid(KV, tl.cast(cloud, tl.int64) * m, cols, m, HAS_KV)
        pair = q_valid[:, None] & k_valid[None, :]
        a = _uniform_mass(q_valid, rows, n)
        b = _uniform_mass(k_valid, cols, m)
        cost = tl.where(pair, 1.0 - tl.dot(q_unit, tl.trans(k_unit), input_precision="ieee"), 0.0)
        affinity = tl.dot(q_nav, tl.trans(k_nav), input_precision="ieee")
        # invalid points at float32's lowest, as the eager masked_fill; the tile's padding at −inf, outside the softmax
        lowest = -3.4028234663852886e38
        forward_logits = tl.where((cols < m)[None, :], tl.where(k_valid[None, :], affinity, lowest), float("-inf"))
        forward_plan = tl.exp(forward_logits - tl.max(forward_logits, axis=1)[:, None])
        forward_plan = forward_plan / tl.sum(forward_plan, axis=1)[:, None]
        backward_logits = tl.where((rows < n)[:, None], tl.where(q_valid[:, None], affinity, lowest), float("-inf"))
        backward_plan = tl.exp(backward_logits - tl.max(backward_logits, axis=0)[None, :])
        backward_plan = backward_plan / tl.sum(backward_plan, axis=0)[None, :]
        if BACKWARD:
            upstream = tl.load(GRAD).to(tl.float32) / clouds
            inside = (rows[:, None] < n) & (cols[None, :] < m)
            grad_forward = upstream * rho * a[:, None] * cost
            grad_backward = upstream * (1 - rho) * b[None, :] * cost
            # the softmaxes' backward, per row (per column for π(q|k)); masked_fill passes nothing to what it filled
            grad_affinity = tl.where(k_valid[None, :], forward_plan * (
                grad_forward - tl.sum(forward_plan * grad_forward, axis=1)[:, None]), 0.0) \
                + tl.where(q_valid[:, None], backward_plan * (
                    grad_backward - tl.sum(backward_plan * grad_backward, axis=0)[None, :]), 0.0)
            grad_affinity = tl.where(inside, grad_affinity, 0.0)
            grad_cos = -tl.where(pair, upstream * (rho * a[:, None] * forward_plan
                                                   + (1 - rho) * b[None, :] * backward_plan), 0.0)
            grad_q_critic = _normalized_backward(q_unit, q_norm, tl.dot(grad_cos, k_unit, input_precision="ieee"))
            grad_k_critic = _normalized_backward(k_unit, k_norm,
                                                 tl.dot(tl.trans(grad_cos), q_unit, input_precision="ieee"))
            tl.store(GRAD_FEATURES + q_at, grad_q_critic, mask=q_mask)
            tl.store(GRAD_FEATURES + k_at, grad_k_critic, mask=k_mask)
            tl.store(GRAD_FEATURES + total * HIDDEN + q_at, tl.dot(grad_affinity, k_nav, input_precision="ieee"),
                     mask=q_mask)
            tl.store(GRAD_FEATURES + total * HIDDEN + k_at,
                     tl.dot(tl.trans(grad_affinity), q_nav, input_precision="ieee"), mask=k_mask)
        else:
            forward_ct = tl.sum(a * tl.sum(forward_plan * cost, axis=1), axis=0)
            backward_ct = tl.sum(b * tl.sum(backward_plan * cost, axis=0), axis=0)
            tl.store(LOSS + cloud, (rho * forward_ct + (1 - rho) * backward_ct) / clouds)


@torch.library.custom_op("attnbench::align_ct_networks", mutates_args=())
def align_ct_networks(q: torch.Tensor, k: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """[2, C (n + m), hidden]: per point (queries, then keys) the critic's output, then the navigator's unit output;
    `params` the critic's six weights, then the navigator's four."""
    dim, hidden = q.shape[-1], params[2].shape[0]
    n_q, n_k = q.numel() // dim, k.numel() // dim
    features = torch.empty((2, n_q + n_k, hidden), dtype=torch.float32, device=q.device)
    empty = torch.empty(0, dtype=torch.float32, device=q.device)
    _ct_networks_kernel[(_programs(max(n_q, n_k)),)](q, k, *params, features, *([empty] * 13), n_q, n_k, dim, hidden,
                                                     False, BLOCK_POINTS, _block(dim), _block(hidden))
    return features


@align_ct_networks.register_fake
def _(q, k, params):
    dim = q.shape[-1]
    return q.new_empty((2, (q.numel() + k.numel()) // dim, params[2].shape[0]), dtype=torch.float32)


@torch.library.custom_op("attnbench::align_ct_networks_backward", mutates_args=())
def align_ct_networks_backward(q: torch.Tensor, k: torch.Tensor, params: list[torch.Tensor],
                               grad_features: torch.Tensor) -> list[torch.Tensor]:
    """[dq, dk, then each weight's gradient summed per program, [programs, *shape]] for the gradient of the
    features; the critic's reversed (it maximises the loss)."""
    dim, hidden = q.shape[-1], params[2].shape[0]
    n_q, n_k = q.numel() // dim, k.numel() // dim
    programs = _programs(max(n_q, n_k))
    grad_q, grad_k = torch.empty_like(q), torch.empty_like(k)
    partial = [torch.empty((programs, *p.shape), dtype=torch.float32, device=q.device) for p in params]
    empty = torch.empty(0, dtype=torch.float32, device=q.device)
    _ct_networks_kernel[(programs,)](q, k, *params, empty, grad_features, grad_q, grad_k, *partial, n_q, n_k, dim,
                                     hidden, True, BLOCK_POINTS, _block(dim), _block(hidden))
    return [grad_q, grad_k, *partial]


@align_ct_networks_backward.register_fake
def _(q, k, params, grad_features):
    programs = _programs(max(q.numel(), k.numel()) // q.shape[-1])
    return [torch.empty_like(q), torch.empty_like(k),
            *[q.new_empty((programs, *p.shape), dtype=torch.float32) for p in params]]


@torch.library.custom_op("attnbench::align_ct_coupling", mutates_args=())
def align_ct_coupling(features: torch.Tensor, q_valid: torch.Tensor | None, k_valid: torch.Tensor | None,
                      clouds: int, n: int, m: int, rho: float) -> torch.Tensor:
    """align-ct's loss per cloud [C] (divided by C: their sum is the mean) from the networks' features."""
    hidden = features.shape[-1]
    losses = torch.empty(clouds, dtype=torch.float32, device=features.device)
    empty = torch.empty(0, dtype=torch.float32, device=features.device)
    _ct_coupling_kernel[(clouds,)](features, _mask(q_valid, features), _mask(k_valid, features), losses, empty, empty,
                                   clouds, n, m, hidden, rho, q_valid is not None, k_valid is not None, False,
                                   _block(n), _block(m), _block(hidden))
    return losses


@align_ct_coupling.register_fake
def _(features, q_valid, k_valid, clouds, n, m, rho):
    return features.new_empty(clouds)


@torch.library.custom_op("attnbench::align_ct_coupling_backward", mutates_args=())
def align_ct_coupling_backward(features: torch.Tensor, q_valid: torch.Tensor | None, k_valid: torch.Tensor | None,
                               grad: torch.Tensor, clouds: int, n: int, m: int, rho: float) -> torch.Tensor:
    """The features' gradient for the loss's gradient `grad` [1]."""
    hidden = features.shape[-1]
    grad_features = torch.empty_like(features)
    empty = torch.empty(0, dtype=torch.float32, device=features.device)
    _ct_coupling_kernel[(clouds,)](features, _mask(q_valid, features), _mask(k_valid, features), empty, grad,
                                   grad_features, clouds, n, m, hidden, rho, q_valid is not None, k_valid is not None,
                                   True, _block(n), _block(m), _block(hidden))
    return grad_features


@align_ct_coupling_backward.register_fake
def _(features, q_valid, k_valid, grad, clouds, n, m, rho):
    return torch.empty_like(features)


class TransportLoss(torch.autograd.Function):
    """align-ct's bidirectional conditional transport loss, the critic's gradients reversed. Two kernels each way: the
    networks per block of points, and the coupling per cloud, which the networks' outputs (critic features and
    navigator units, [C, n + m, hidden] each: a quarter of the clouds' size at hidden 16) link."""

    @staticmethod
    def forward(ctx, q, k, q_valid, k_valid, rho: float, *params):
        q, k = q.contiguous(), k.contiguous()
        q_valid, k_valid = _contiguous(q_valid), _contiguous(k_valid)
        params = [p.contiguous() for p in params]
        features = align_ct_networks(q, k, params)
        losses = align_ct_coupling(features, q_valid, k_valid, q.shape[0], q.shape[1], k.shape[1], rho)
        ctx.save_for_backward(q, k, q_valid, k_valid, features, *params)
        ctx.rho = rho
        return losses.sum()

    @staticmethod
    def backward(ctx, grad):
        q, k, q_valid, k_valid, features, *params = ctx.saved_tensors
        grad_features = align_ct_coupling_backward(features, q_valid, k_valid, grad.float().reshape(1), q.shape[0],
                                                   q.shape[1], k.shape[1], ctx.rho)
        grad_q, grad_k, *partial = align_ct_networks_backward(q, k, params, grad_features)
        return grad_q, grad_k, None, None, None, *[s.sum(0).to(p.dtype) for s, p in zip(partial, params)]


def transport_loss(q, k, q_valid, k_valid, rho: float, critic: torch.nn.Sequential,
                   navigator: torch.nn.Sequential) -> torch.Tensor:
    """align-ct's loss: q [C, n, d], k [C, m, d], validity [C, n] / [C, m] or None; `critic` is
    `alignment.highway_mlp(d, hidden, hidden)`, `navigator` Linear(d, hidden), ReLU, Linear(hidden, hidden)."""
    highway, first, _, last = critic
    nav_first, _, nav_last = navigator
    return TransportLoss.apply(q, k, q_valid, k_valid, rho, highway.proj.weight, highway.proj.bias, first.weight,
                               first.bias, last.weight, last.bias, nav_first.weight, nav_first.bias, nav_last.weight,
                               nav_last.bias)


# What each launch computes, for FLOP counters (torch.utils.flop_counter; the GPU cost page): its products.
def _sinkhorn_flops(q, k, iterations: int) -> int:
    clouds, n, dim = q
    # the cost's product, two matrix-vector products per iteration and one per convergence test
    return 2 * clouds * n * k[1] * (dim + 2 * iterations + iterations // 10)


def _network_flops(q, k, dim_products: int) -> int:
    points = (math.prod(q) + math.prod(k)) // q[-1]
    return 2 * points * dim_products


def _discriminator_products(q, w1) -> int:
    dim, hidden = q[-1], w1[0]
    return 2 * dim * dim + dim * hidden + hidden  # highway (gate and transform), then hidden, then the logit


def _ct_products(q, params) -> int:
    dim, hidden = q[-1], params[2][0]
    return 2 * dim * dim + dim * hidden + hidden * hidden + dim * hidden + hidden * hidden  # critic, navigator


register_flop_formula(torch.ops.attnbench.align_sinkhorn)(
    lambda q, k, q_valid, k_valid, eps, iterations, *_, **__: _sinkhorn_flops(q, k, iterations))
register_flop_formula(torch.ops.attnbench.align_sinkhorn_backward)(
    lambda q, k, *_, **__: 3 * 2 * q[0] * q[1] * k[1] * q[2])  # the cost again, then dq and dk
# a backward recomputes the forward and forms two products per layer (the input's and the weights' gradients)
register_flop_formula(torch.ops.attnbench.align_discriminator)(
    lambda q, k, q_valid, k_valid, counts, wp, bp, w1, *_, **__: _network_flops(q, k, _discriminator_products(q, w1)))
register_flop_formula(torch.ops.attnbench.align_discriminator_backward)(
    lambda q, k, q_valid, k_valid, counts, wp, bp, w1, *_, **__: 3 * _network_flops(
        q, k, _discriminator_products(q, w1)))
register_flop_formula(torch.ops.attnbench.align_ct_networks)(
    lambda q, k, params, *_, **__: _network_flops(q, k, _ct_products(q, params)))
register_flop_formula(torch.ops.attnbench.align_ct_networks_backward)(
    lambda q, k, params, *_, **__: 3 * _network_flops(q, k, _ct_products(q, params)))
register_flop_formula(torch.ops.attnbench.align_ct_coupling)(
    lambda features, q_valid, k_valid, clouds, n, m, *_, **__: 2 * 2 * clouds * n * m * features[-1])
register_flop_formula(torch.ops.attnbench.align_ct_coupling_backward)(
    lambda features, q_valid, k_valid, grad, clouds, n, m, *_, **__: 6 * 2 * clouds * n * m * features[-1])
