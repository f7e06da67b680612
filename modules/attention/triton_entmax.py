"""α-entmax attention with a learned α per head, fused in Triton: the weights are never formed.

Why our own kernel. AdaSplash (PyPI `adasplash`, Gonçalves et al. 2025) fuses α-entmax attention but takes α as one
float for the call, and returns no gradient for it; the learned-α `entmax` needs α per head, read on the device (a
float would be a host read of the parameter every call), and dα. No other library fuses α-entmax. This follows
AdaSplash's non-causal design (its `adasplash_no_block_mask`: τ per query row by Halley-bisection over key tiles,
then the output, then dk, dv and dq, each a pass over tiles), with α loaded per head, the weights normalised to sum
to one as the `entmax` package's `entmax_bisect` does (the eager path), and dα (Correia, Niculae & Martins 2019,
"Adaptively Sparse Transformers", Prop. 1) accumulated per query row in the dq pass.

With z = scale·q·kᵀ, x = (α-1) z and τ the row's threshold, p_raw = [x - τ]_+^(1/(α-1)), the weights p = p_raw / Z
(Z = Σ p_raw, 1 up to the solver's tolerance) and s = p^(2-α):
  dz_ij = s_ij (g_ij - δ_i),  g_ij = do_i · v_j,  δ_i = Σ_j s̃_ij g_ij = do_i · o2_i,  o2_i = Σ_j s_ij v_j / Σ_j s_ij
  dα   = Σ_i [(Σ_j g_ij p_ij - δ_i) / (α-1)² - (Σ_j g_ij p_ij log p_ij - δ_i Σ_j p_ij log p_ij) / (α-1)]
as the package's EntmaxBisectFunction.backward computes them from the formed weights.

Saved for the backward: q, k, v, o2 (q's shape, float32), τ and Z per row, α: FlashAttention's set with o2 for out.
Kernels: τ (one pass for the row maxima, NITER passes of the solver), the output (one pass), and in the backward dk
with dv (one pass per key block over the query tiles) and dq with dα (one pass per query block over the key tiles).
Scores are formed in float32 (input_precision "ieee"), as the eager path's `full_precision` scores.
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import register_flop_formula

from .triton_common import BLOCK_M, BLOCK_N, NUM_STAGES, block_d as _block_d, tile_products, tl, triton

if triton is not None:
    from .triton_common import load_rows as _load_rows

NITER = 24
"""Halley-bisection passes for τ. The eager path bisects 25 times from a bracket of width <= 1, to fp32's
resolution; Halley's steps converge faster where they stay in the bracket, and fall back to halving it elsewhere."""


if triton is not None:

    @triton.jit
    def _tau_kernel(Q, K, ALPHA, TAU, scale, log2_length, H, L, D, NITER: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        base = (batch * H + head).to(tl.int64) * L * D
        alpha = tl.load(ALPHA + head).to(tl.float32)
        coeff_0 = 1.0 / (alpha - 1.0)
        coeff_1 = coeff_0 - 1.0
        coeff_2 = coeff_0 - 2.0
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        q = _load_rows(Q + base, rows, dims, L, D) * (scale * (alpha - 1.0))
        top = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        for start_n in range(0, L, BLOCK_N):
            k = _load_rows(K + base, start_n + cols, dims, L, D)
            x = tl.dot(q, tl.trans(k), input_precision="ieee")
            x = tl.where((start_n + cols)[None, :] < L, x, float("-inf"))
            top = tl.maximum(top, tl.max(x, axis=1))
        # the bracket of the eager path: max - 1 <= τ <= max - L^(1-α)
        t_lo = top - 1.0
        t_hi = top - tl.exp2((1.0 - alpha) * log2_length)
        t = 0.5 * (t_lo + t_hi)
        for _ in range(NITER):
            f = tl.zeros((BLOCK_M,), dtype=tl.float32)
            df = tl.zeros((BLOCK_M,), dtype=tl.float32)
            ddf = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for start_n in range(0, L, BLOCK_N):
                k = _load_rows(K + base, start_n + cols, dims, L, D)
                x = tl.dot(q, tl.trans(k), input_precision="ieee")
                inside = (x > t[:, None]) & ((start_n + cols)[None, :] < L)
                gap = tl.log2(tl.where(inside, x - t[:, None], 1.0))
                f += tl.sum(tl.where(inside, tl.exp2(gap * coeff_0), 0.0), axis=1)
                df += tl.sum(tl.where(inside, tl.exp2(gap * coeff_1), 0.0), axis=1)
                ddf += tl.sum(tl.where(inside, tl.exp2(gap * coeff_2), 0.0), axis=1)
            f = f - 1.0
            df = -coeff_0 * df
            ddf = coeff_0 * coeff_1 * ddf
            t_lo = tl.where(f > 0, t, t_lo)
            t_hi = tl.where(f < 0, t, t_hi)
            # Halley's step where it stays inside the bracket, else the bracket's middle
            step = t - (2 * f * df) / (2 * df * df - f * ddf)
            good = (step > t_lo) & (step < t_hi)
            t = tl.where(good, step, 0.5 * (t_lo + t_hi))
        tl.store(TAU + (batch * H + head).to(tl.int64) * L + rows, t, mask=rows < L)

    @triton.jit
    def _output_kernel(Q, K, V, ALPHA, TAU, NORM, OUT, OUT2, scale, H, L, D,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        base = (batch * H + head).to(tl.int64) * L * D
        row_base = (batch * H + head).to(tl.int64) * L
        alpha = tl.load(ALPHA + head).to(tl.float32)
        coeff_0 = 1.0 / (alpha - 1.0)
        coeff_s = (2.0 - alpha) / (alpha - 1.0)
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        q = _load_rows(Q + base, rows, dims, L, D) * (scale * (alpha - 1.0))
        t = tl.load(TAU + row_base + rows, mask=rows < L, other=0.0)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        total = tl.zeros((BLOCK_M,), dtype=tl.float32)
        total_s = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for start_n in range(0, L, BLOCK_N):
            k = _load_rows(K + base, start_n + cols, dims, L, D)
            v = _load_rows(V + base, start_n + cols, dims, L, D)
            x = tl.dot(q, tl.trans(k), input_precision="ieee")
            inside = (x > t[:, None]) & ((start_n + cols)[None, :] < L)
            gap = tl.log2(tl.where(inside, x - t[:, None], 1.0))
            p = tl.where(inside, tl.exp2(gap * coeff_0), 0.0)
            s = tl.where(inside, tl.exp2(gap * coeff_s), 0.0)
            acc += tl.dot(p, v, input_precision="ieee")
            acc2 += tl.dot(s, v, input_precision="ieee")
            total += tl.sum(p, axis=1)
            total_s += tl.sum(s, axis=1)
        keep = rows < L
        out_at = base + rows[:, None] * D + dims[None, :]
        out_mask = keep[:, None] & (dims[None, :] < D)
        tl.store(OUT + out_at, (acc / total[:, None]).to(OUT.dtype.element_ty), mask=out_mask)
        tl.store(OUT2 + out_at, acc2 / total_s[:, None], mask=out_mask)
        tl.store(NORM + row_base + rows, total, mask=keep)

    @triton.jit
    def _key_grad_kernel(Q, K, V, DO, ALPHA, TAU, NORM, DELTA, DK, DV, scale, H, L, D,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_n, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        base = (batch * H + head).to(tl.int64) * L * D
        row_base = (batch * H + head).to(tl.int64) * L
        alpha = tl.load(ALPHA + head).to(tl.float32)
        coeff_0 = 1.0 / (alpha - 1.0)
        coeff_s = (2.0 - alpha) / (alpha - 1.0)
        keys = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_in = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        k = _load_rows(K + base, keys, dims, L, D)
        v = _load_rows(V + base, keys, dims, L, D)
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        for start_m in range(0, L, BLOCK_M):
            rows = start_m + rows_in
            keep = rows < L
            q = _load_rows(Q + base, rows, dims, L, D)
            do = _load_rows(DO + base, rows, dims, L, D)
            t = tl.load(TAU + row_base + rows, mask=keep, other=0.0)
            norm = tl.load(NORM + row_base + rows, mask=keep, other=1.0)
            delta = tl.load(DELTA + row_base + rows, mask=keep, other=0.0)
            x = tl.dot(q * (scale * (alpha - 1.0)), tl.trans(k), input_precision="ieee")
            inside = (x > t[:, None]) & keep[:, None] & (keys[None, :] < L)
            gap = tl.log2(tl.where(inside, x - t[:, None], 1.0))
            p = tl.where(inside, tl.exp2(gap * coeff_0), 0.0) / norm[:, None]
            # s = p^(2-α) of the normalised weights
            s = tl.where(inside, tl.exp2(gap * coeff_s), 0.0) * tl.exp2(-(2.0 - alpha) * tl.log2(norm))[:, None]
            dv += tl.dot(tl.trans(p), do, input_precision="ieee")
            g = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = s * (g - delta[:, None])
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
        out_at = base + keys[:, None] * D + dims[None, :]
        out_mask = (keys[:, None] < L) & (dims[None, :] < D)
        tl.store(DK + out_at, (dk * scale).to(DK.dtype.element_ty), mask=out_mask)
        tl.store(DV + out_at, dv.to(DV.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _query_grad_kernel(Q, K, V, DO, ALPHA, TAU, NORM, DELTA, DQ, DALPHA, scale, H, L, D,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        base = (batch * H + head).to(tl.int64) * L * D
        row_base = (batch * H + head).to(tl.int64) * L
        alpha = tl.load(ALPHA + head).to(tl.float32)
        am1 = alpha - 1.0
        coeff_0 = 1.0 / am1
        coeff_s = (2.0 - alpha) / am1
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        keep = rows < L
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        q = _load_rows(Q + base, rows, dims, L, D)
        q_scaled = q * (scale * am1)
        do = _load_rows(DO + base, rows, dims, L, D)
        t = tl.load(TAU + row_base + rows, mask=keep, other=0.0)
        norm = tl.load(NORM + row_base + rows, mask=keep, other=1.0)
        delta = tl.load(DELTA + row_base + rows, mask=keep, other=0.0)
        log_norm = tl.log(norm)
        s_scale = tl.exp(-(2.0 - alpha) * log_norm)
        dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        gp = tl.zeros((BLOCK_M,), dtype=tl.float32)      # Σ g p
        gplogp = tl.zeros((BLOCK_M,), dtype=tl.float32)  # Σ g p log p
        plogp = tl.zeros((BLOCK_M,), dtype=tl.float32)   # Σ p log p
        gs = tl.zeros((BLOCK_M,), dtype=tl.float32)      # Σ g s
        total_s = tl.zeros((BLOCK_M,), dtype=tl.float32)  # Σ s
        for start_n in range(0, L, BLOCK_N):
            keys = start_n + cols
            k = _load_rows(K + base, keys, dims, L, D)
            v = _load_rows(V + base, keys, dims, L, D)
            x = tl.dot(q_scaled, tl.trans(k), input_precision="ieee")
            inside = (x > t[:, None]) & keep[:, None] & (keys[None, :] < L)
            gap = tl.log2(tl.where(inside, x - t[:, None], 1.0))
            p = tl.where(inside, tl.exp2(gap * coeff_0), 0.0) / norm[:, None]
            s = tl.where(inside, tl.exp2(gap * coeff_s), 0.0) * s_scale[:, None]
            # log p = log(x - τ) / (α - 1) - log Z on the support
            log_p = tl.where(inside, gap * (0.6931471805599453 * coeff_0) - log_norm[:, None], 0.0)
            g = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = s * (g - delta[:, None])
            dq += tl.dot(ds, k, input_precision="ieee")
            gp += tl.sum(g * p, axis=1)
            gplogp += tl.sum(g * p * log_p, axis=1)
            plogp += tl.sum(p * log_p, axis=1)
            gs += tl.sum(g * s, axis=1)
            total_s += tl.sum(s, axis=1)
        # Σ g s̃ for dα from this pass's own sums, as eager forms it: δ (from o2, summed in another order) differs by
        # fp32 rounding, which dα's 1/(α-1)² would amplify
        skewed = gs / total_s
        dalpha = (gp - skewed) / (am1 * am1) - (gplogp - skewed * plogp) / am1
        tl.store(DALPHA + row_base + rows, tl.where(keep, dalpha, 0.0), mask=keep)
        out_at = base + rows[:, None] * D + dims[None, :]
        tl.store(DQ + out_at, (dq * scale).to(DQ.dtype.element_ty), mask=keep[:, None] & (dims[None, :] < D))


# Each launch is a functional custom op (attnbench::*): what it reads are its arguments, what it writes its results. A
# dispatch mode (the GPU cost page, a profiler) sees one op per launch, and FakeTensorMode its fake form (shapes only).
@torch.library.custom_op("attnbench::entmax_tau", mutates_args=())
def entmax_tau(q: torch.Tensor, k: torch.Tensor, alpha: torch.Tensor, scale: float, niter: int) -> torch.Tensor:
    """τ per query row [B, H, L] (float32) by Halley-bisection over key tiles."""
    batch, heads, length, dim = q.shape
    tau = torch.empty((batch, heads, length), device=q.device, dtype=torch.float32)
    _tau_kernel[(triton.cdiv(length, BLOCK_M), heads, batch)](
        q, k, alpha, tau, scale, math.log2(length), heads, length, dim, niter, BLOCK_M, BLOCK_N, _block_d(dim),
        num_stages=NUM_STAGES)
    return tau


@entmax_tau.register_fake
def _(q, k, alpha, scale, niter):
    return q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("attnbench::entmax_output", mutates_args=())
def entmax_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor, tau: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, Z per row, o2 = Σ_j s_ij v_j / Σ_j s_ij in float32) from τ."""
    batch, heads, length, dim = q.shape
    norm = torch.empty_like(tau)
    out = torch.empty_like(v)
    out2 = torch.empty(v.shape, device=v.device, dtype=torch.float32)
    _output_kernel[(triton.cdiv(length, BLOCK_M), heads, batch)](
        q, k, v, alpha, tau, norm, out, out2, scale, heads, length, dim, BLOCK_M, BLOCK_N, _block_d(dim),
        num_stages=NUM_STAGES)
    return out, norm, out2


@entmax_output.register_fake
def _(q, k, v, alpha, tau, scale):
    return torch.empty_like(v), torch.empty_like(tau), v.new_empty(v.shape, dtype=torch.float32)


@torch.library.custom_op("attnbench::entmax_key_grad", mutates_args=())
def entmax_key_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, alpha: torch.Tensor,
                    tau: torch.Tensor, norm: torch.Tensor, delta: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv), one pass per key block over the query tiles."""
    batch, heads, length, dim = q.shape
    grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)
    _key_grad_kernel[(triton.cdiv(length, BLOCK_N), heads, batch)](
        q, k, v, grad_out, alpha, tau, norm, delta, grad_k, grad_v, scale, heads, length, dim,
        BLOCK_M, BLOCK_N, _block_d(dim), num_stages=NUM_STAGES)
    return grad_k, grad_v


@entmax_key_grad.register_fake
def _(q, k, v, grad_out, alpha, tau, norm, delta, scale):
    return torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("attnbench::entmax_query_grad", mutates_args=())
def entmax_query_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, alpha: torch.Tensor,
                      tau: torch.Tensor, norm: torch.Tensor, delta: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, dα per query row), one pass per query block over the key tiles."""
    batch, heads, length, dim = q.shape
    grad_q, grad_alpha_rows = torch.empty_like(q), torch.empty_like(tau)
    _query_grad_kernel[(triton.cdiv(length, BLOCK_M), heads, batch)](
        q, k, v, grad_out, alpha, tau, norm, delta, grad_q, grad_alpha_rows, scale, heads, length, dim,
        BLOCK_M, BLOCK_N, _block_d(dim), num_stages=NUM_STAGES)
    return grad_q, grad_alpha_rows


@entmax_query_grad.register_fake
def _(q, k, v, grad_out, alpha, tau, norm, delta, scale):
    return torch.empty_like(q), torch.empty_like(tau)


# What each launch computes, for FLOP counters (torch.utils.flop_counter; the GPU cost page): its tile products.
register_flop_formula(torch.ops.attnbench.entmax_tau)(
    lambda q, k, alpha, scale, niter, *_, **__: tile_products(q, q, 1 + niter))  # the row maxima, then each solver pass
register_flop_formula(torch.ops.attnbench.entmax_output)(
    lambda q, *_, **__: tile_products(q, q, 3))  # scores, p·v, s·v
register_flop_formula(torch.ops.attnbench.entmax_key_grad)(
    lambda q, *_, **__: tile_products(q, q, 4))  # scores, pᵀ·do, do·vᵀ, dSᵀ·q
register_flop_formula(torch.ops.attnbench.entmax_query_grad)(
    lambda q, *_, **__: tile_products(q, q, 3))  # scores, do·vᵀ, dS·k


class LearnedAlphaEntmaxAttention(torch.autograd.Function):
    """entmax_α(scale·q kᵀ) v with α [H] per head, q, k, v [B, H, L, d] of one length; gradients for q, k, v and α."""

    @staticmethod
    def forward(ctx, q, k, v, alpha, scale: float, niter: int):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        alpha = alpha.detach().float().contiguous()
        tau = entmax_tau(q, k, alpha, scale, niter)
        out, norm, out2 = entmax_output(q, k, v, alpha, tau, scale)
        ctx.save_for_backward(q, k, v, alpha, tau, norm, out2)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, alpha, tau, norm, out2 = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        delta = (grad_out.float() * out2).sum(-1)
        grad_k, grad_v = entmax_key_grad(q, k, v, grad_out, alpha, tau, norm, delta, ctx.scale)
        grad_q, grad_alpha_rows = entmax_query_grad(q, k, v, grad_out, alpha, tau, norm, delta, ctx.scale)
        grad_alpha = grad_alpha_rows.sum((0, 2)) if ctx.needs_input_grad[3] else None
        return grad_q, grad_k, grad_v, grad_alpha, None, None


def learned_alpha_entmax_attention(q, k, v, alpha, scale: float, niter: int = NITER):
    """The fused call: q, k, v [B, H, L, d], alpha [H] (a tensor, read on the device)."""
    return LearnedAlphaEntmaxAttention.apply(q, k, v, alpha, scale, niter)
