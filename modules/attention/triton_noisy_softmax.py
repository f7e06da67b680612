"""BAM's sampled attention softmax_j(scale·<q_i, k_j> + n_ij) v fused in Triton, its noise drawn inside the kernel.

Why our own kernel. BAM's sampled weights are a softmax of the logits plus log-noise (`BayesianAttention.log_noise`):
handed to SDPA as a bias, that noise is an L×L tensor written in the forward, written again where the backward
redraws it, and read by SDPA's forward, its recomputation and its backward. Drawn here from a counter-based generator
(Philox, `tl.rand` / `tl.randn`) keyed by a seed and by the element's (b, h, i, j), the noise never exists in memory:
the backward regenerates the same n_ij from the saved seed, as SDPA's own dropout regenerates its mask.

The noise, per element, for the two samplers of modules/attention/variants/bam.py:
- Weibull: n = log(E) / k with E = -log U, U uniform kept inside [tiny, 1) as `log_noise` keeps it (WEIBULL);
- Lognormal: n = σ·ε with ε standard normal (LOGNORMAL).
Philox's key is the call's seed (one int64 drawn on the device from the run's noise stream, so nothing is read on the
host) plus (b·H + h)·2^32, its counter i·Lk + j: every (sample, head) plane has a stream of its own and a counter
that fits 32 bits up to Lq·Lk < 2^31.

The scores are taken against the keys less their mean over the (sample, head)'s valid keys, kbar (given, float32):
s_ij = scale·<q_i, k_j - kbar>, which changes no weight (a shift per row) and is what BAM's closed-form KL sums
(bam.py `_PairSums`: log w_ij = s_ij - a_i, with Σ_j s_ij = 0, so no sum cancels large terms). The same forward pass
gives the CLEAN rows' a_i = logsumexp_j s_ij over the valid keys (0 for a row without any) and, where asked, Σ_j s_ij²,
and the backward takes their gradients: d a_i / d s_ij = P_ij (the clean weights), d Σ_j s_ij² / d s_ij = 2 s_ij, more
terms in dS. With W the sampled weights (W_ij = exp(s_ij + n_ij - lseN_i)), g and g2 the gradients of a and of the
squares, δ_i = do_i · o_i:
  dS_ij = W_ij (do_i · v_j - δ_i) + g_i P_ij + 2 g2_i s_ij,  dq = scale·dS (k - kbar),  dv = Wᵀ do,
  dk_j = scale·(dSᵀ q)_j - [j valid] scale/n Σ_i r_i q_i,  r_i = Σ_j (g_i P_ij + 2 g2_i s_ij)
(the last term the gradient through kbar; W's part of dS sums to 0 over a row, as a softmax's does).
Saved for the backward: q, k, v, kbar, the output and both logsumexps per row: FlashAttention's set and a row vector
and kbar more. Kernels (each a custom op, `attnbench::noisy_softmax_*`): the forward (one pass over K and V per query
tile); in the backward dq first (a pass over key tiles per query block; it also writes δ from do and the output, and
r), then dk with dv (a pass over query tiles per key block). A separate launch measures Σ_j |W_ij - P_ij| per row
(BAM's `sample_tv`) from q, k, the clean logsumexp and the gap lseN_i - a_i, which the forward forms as
log1p(Σ_j P_ij expm1(n_ij)) where asked: at the small noise of BAM's GLUE recipe (σ = 1e-4) the two logsumexps differ
in their rounding, and W - P as a difference keeps little else; here |W_ij - P_ij| = P_ij |expm1(n_ij - gap_i)|.
Key padding: a per-key mask (per sample, optionally per head). Scores are formed in float32 ("ieee" products for
float32 inputs; "tf32" for 16-bit ones, exact on their values).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.flop_counter import register_flop_formula

from .triton_common import BLOCK_M, BLOCK_N, NUM_STAGES, block_d as _block_d, tile_products as _products, tl, triton

if triton is not None:
    from .triton_common import load_rows as _load_rows

WEIBULL = 0
LOGNORMAL = 1
SAMPLERS = {"weibull": WEIBULL, "lognormal": LOGNORMAL}


if triton is not None:

    @triton.jit
    def _noise(seed, plane, rows, keys, LK, SAMPLER: tl.constexpr, param):
        """n_ij of the (sample, head) `plane` for the tile's rows and keys."""
        key = seed + plane.to(tl.int64) * 4294967296
        counter = rows[:, None] * LK + keys[None, :]
        if SAMPLER == 0:
            # U on [tiny, 1): 0 would make E infinite; Philox's float can round up to 1, which would make E 0
            uniform = tl.minimum(tl.maximum(tl.rand(key, counter), 1.1754943508222875e-38), 0.99999994)
            return tl.log(-tl.log(uniform)) * param
        else:
            return tl.randn(key, counter) * param

    @triton.jit
    def _expm1(x):
        """exp(x) - 1 without the cancellation near 0 (Kahan's form)."""
        u = tl.exp(x)
        return tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0, (u - 1.0) * x / tl.log(u)))

    @triton.jit
    def _log1p(y):
        """log(1 + y) without the cancellation near 0 (Goldberg's form)."""
        u = 1.0 + y
        return tl.where(u == 1.0, y, tl.log(u) * y / (u - 1.0))

    @triton.jit
    def _valid_keys(KEYS, key_base, keys, LK, HAS_KEYS: tl.constexpr):
        inside = keys < LK
        if HAS_KEYS:
            inside = inside & (tl.load(KEYS + key_base + keys, mask=keys < LK, other=0) != 0)
        return inside

    @triton.jit
    def _centred_keys(K, KBAR, k_base, kbar_base, keys, dims, LK, D):
        """The tile's keys less the mean key kbar (of the (sample, head)'s valid keys)."""
        kbar = tl.load(KBAR + kbar_base + dims, mask=dims < D, other=0.0)
        return _load_rows(K + k_base, keys, dims, LK, D) - kbar[None, :]

    @triton.jit
    def _forward_kernel(Q, K, V, KBAR, KEYS, SEED, OUT, LSE_NOISY, LSE_CLEAN, SQUARES, GAP, scale, param, H, LQ, LK,
                        D, keys_stride_b, keys_stride_h, HAS_KEYS: tl.constexpr, WANT_SQUARES: tl.constexpr,
                        WANT_GAP: tl.constexpr, SAMPLER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        plane = batch * H + head
        q_base = plane.to(tl.int64) * LQ * D
        k_base = plane.to(tl.int64) * LK * D
        key_base = batch.to(tl.int64) * keys_stride_b + head * keys_stride_h
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        seed = tl.load(SEED)
        q = _load_rows(Q + q_base, rows, dims, LQ, D)
        top_n = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        total_n = tl.zeros((BLOCK_M,), dtype=tl.float32)
        top_c = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        total_c = tl.zeros((BLOCK_M,), dtype=tl.float32)
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        lifted = tl.zeros((BLOCK_M,), dtype=tl.float32)  # sum_j exp(s_ij - top_c) (exp(n_ij) - 1)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        for start_n in range(0, LK, BLOCK_N):
            keys = start_n + cols
            inside = _valid_keys(KEYS, key_base, keys, LK, HAS_KEYS)
            k = _centred_keys(K, KBAR, k_base, plane.to(tl.int64) * D, keys, dims, LK, D)
            v = _load_rows(V + k_base, keys, dims, LK, D)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            if WANT_SQUARES:
                squares += tl.sum(tl.where(inside[None, :], s * s, 0.0), axis=1)
            s = tl.where(inside[None, :], s, float("-inf"))
            # clean: the running max and sum only
            new_c = tl.maximum(top_c, tl.max(s, axis=1))
            safe_c = tl.where(new_c == float("-inf"), 0.0, new_c)
            shrink_c = tl.exp(top_c - safe_c)
            clean = tl.exp(s - safe_c[:, None])
            total_c = total_c * shrink_c + tl.sum(clean, axis=1)
            top_c = new_c
            noise = _noise(seed, plane, rows, keys, LK, SAMPLER, param)
            if WANT_GAP:
                lifted = lifted * shrink_c + tl.sum(clean * _expm1(noise), axis=1)
            # noisy: the online softmax of the output
            x = s + noise
            new_n = tl.maximum(top_n, tl.max(x, axis=1))
            safe_n = tl.where(new_n == float("-inf"), 0.0, new_n)
            shrink = tl.exp(top_n - safe_n)
            w = tl.exp(x - safe_n[:, None])
            total_n = total_n * shrink + tl.sum(w, axis=1)
            acc = acc * shrink[:, None] + tl.dot(w, v, input_precision=PRECISION)
            top_n = new_n
        has_keys = total_n > 0
        keep = rows < LQ
        out = tl.where(has_keys[:, None], acc / tl.where(has_keys, total_n, 1.0)[:, None], 0.0)
        out_at = q_base + rows[:, None] * D + dims[None, :]
        tl.store(OUT + out_at, out.to(OUT.dtype.element_ty), mask=keep[:, None] & (dims[None, :] < D))
        row_at = plane.to(tl.int64) * LQ + rows
        tl.store(LSE_NOISY + row_at, tl.where(has_keys, top_n + tl.log(tl.where(has_keys, total_n, 1.0)), 0.0),
                 mask=keep)
        tl.store(LSE_CLEAN + row_at, tl.where(total_c > 0, top_c + tl.log(tl.where(total_c > 0, total_c, 1.0)), 0.0),
                 mask=keep)
        if WANT_SQUARES:
            tl.store(SQUARES + row_at, squares, mask=keep)
        if WANT_GAP:
            # lseN_i - lse_i = log sum_j P_ij exp(n_ij) = log1p(sum_j P_ij expm1(n_ij)): exact where the noise is small,
            # where the difference of the two logsumexps would keep only their rounding
            gap = _log1p(lifted / tl.where(total_c > 0, total_c, 1.0))
            tl.store(GAP + row_at, tl.where(total_c > 0, gap, 0.0), mask=keep)

    @triton.jit
    def _query_grad_kernel(Q, K, V, KBAR, KEYS, SEED, DO, OUT, LSE_NOISY, LSE_CLEAN, GRAD_LSE, GRAD_SQUARES, DELTA,
                           ROW_SUMS, DQ, scale, param, H, LQ, LK, D, keys_stride_b, keys_stride_h,
                           HAS_KEYS: tl.constexpr, HAS_GRAD_LSE: tl.constexpr, HAS_GRAD_SQUARES: tl.constexpr,
                           SAMPLER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        plane = batch * H + head
        q_base = plane.to(tl.int64) * LQ * D
        k_base = plane.to(tl.int64) * LK * D
        key_base = batch.to(tl.int64) * keys_stride_b + head * keys_stride_h
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        keep = rows < LQ
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        seed = tl.load(SEED)
        row_at = plane.to(tl.int64) * LQ + rows
        q = _load_rows(Q + q_base, rows, dims, LQ, D)
        do = _load_rows(DO + q_base, rows, dims, LQ, D)
        out = _load_rows(OUT + q_base, rows, dims, LQ, D)
        delta = tl.sum(do * out, axis=1)
        tl.store(DELTA + row_at, delta, mask=keep)
        lse_n = tl.load(LSE_NOISY + row_at, mask=keep, other=0.0)
        if HAS_GRAD_LSE:
            lse_c = tl.load(LSE_CLEAN + row_at, mask=keep, other=0.0)
            g = tl.load(GRAD_LSE + row_at, mask=keep, other=0.0)
        if HAS_GRAD_SQUARES:
            g2 = 2.0 * tl.load(GRAD_SQUARES + row_at, mask=keep, other=0.0)
        row_sums = tl.zeros((BLOCK_M,), dtype=tl.float32)
        dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        for start_n in range(0, LK, BLOCK_N):
            keys = start_n + cols
            inside = _valid_keys(KEYS, key_base, keys, LK, HAS_KEYS)
            k = _centred_keys(K, KBAR, k_base, plane.to(tl.int64) * D, keys, dims, LK, D)
            v = _load_rows(V + k_base, keys, dims, LK, D)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            s = tl.where(inside[None, :], s, float("-inf"))
            w = tl.exp(s + _noise(seed, plane, rows, keys, LK, SAMPLER, param) - lse_n[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = w * (dp - delta[:, None])
            if HAS_GRAD_LSE or HAS_GRAD_SQUARES:
                kl = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                if HAS_GRAD_LSE:
                    kl += g[:, None] * tl.exp(s - lse_c[:, None])
                if HAS_GRAD_SQUARES:
                    kl += tl.where(inside[None, :], g2[:, None] * s, 0.0)
                row_sums += tl.sum(kl, axis=1)
                ds += kl
            dq += tl.dot(ds, k, input_precision=PRECISION)
        if HAS_GRAD_LSE or HAS_GRAD_SQUARES:
            tl.store(ROW_SUMS + row_at, row_sums, mask=keep)
        tl.store(DQ + q_base + rows[:, None] * D + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=keep[:, None] & (dims[None, :] < D))

    @triton.jit
    def _key_grad_kernel(Q, K, V, KBAR, KEYS, SEED, DO, LSE_NOISY, LSE_CLEAN, GRAD_LSE, GRAD_SQUARES, DELTA,
                         ROW_SUMS, DK, DV, scale, param, H, LQ, LK, D, keys_stride_b, keys_stride_h,
                         HAS_KEYS: tl.constexpr, HAS_GRAD_LSE: tl.constexpr, HAS_GRAD_SQUARES: tl.constexpr,
                         SAMPLER: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_n, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        plane = batch * H + head
        q_base = plane.to(tl.int64) * LQ * D
        k_base = plane.to(tl.int64) * LK * D
        key_base = batch.to(tl.int64) * keys_stride_b + head * keys_stride_h
        keys = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_in = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        seed = tl.load(SEED)
        inside = _valid_keys(KEYS, key_base, keys, LK, HAS_KEYS)
        k = _centred_keys(K, KBAR, k_base, plane.to(tl.int64) * D, keys, dims, LK, D)
        v = _load_rows(V + k_base, keys, dims, LK, D)
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        # sum_i r_i q_i, r_i = sum_j dS_ij of the KL's terms: the gradient that reaches every valid key through kbar
        through_mean = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for start_m in range(0, LQ, BLOCK_M):
            rows = start_m + rows_in
            keep = rows < LQ
            row_at = plane.to(tl.int64) * LQ + rows
            q = _load_rows(Q + q_base, rows, dims, LQ, D)
            do = _load_rows(DO + q_base, rows, dims, LQ, D)
            lse_n = tl.load(LSE_NOISY + row_at, mask=keep, other=0.0)
            delta = tl.load(DELTA + row_at, mask=keep, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            pair = inside[None, :] & keep[:, None]
            s = tl.where(pair, s, float("-inf"))
            w = tl.exp(s + _noise(seed, plane, rows, keys, LK, SAMPLER, param) - lse_n[:, None])
            dv += tl.dot(tl.trans(w), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = w * (dp - delta[:, None])
            if HAS_GRAD_LSE:
                lse_c = tl.load(LSE_CLEAN + row_at, mask=keep, other=0.0)
                g = tl.load(GRAD_LSE + row_at, mask=keep, other=0.0)
                ds += g[:, None] * tl.exp(s - lse_c[:, None])
            if HAS_GRAD_SQUARES:
                g2 = 2.0 * tl.load(GRAD_SQUARES + row_at, mask=keep, other=0.0)
                ds += tl.where(pair, g2[:, None] * s, 0.0)
            if HAS_GRAD_LSE or HAS_GRAD_SQUARES:
                row_sums = tl.load(ROW_SUMS + row_at, mask=keep, other=0.0)
                through_mean += tl.sum(row_sums[:, None] * q, axis=0)
            dk += tl.dot(tl.trans(ds), q, input_precision=PRECISION)
        if HAS_GRAD_LSE or HAS_GRAD_SQUARES:
            # kbar = sum of the valid keys / n: each valid key gets -(1/n) sum_i r_i q_i
            if HAS_KEYS:
                valid = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for start in range(0, LK, BLOCK_N):
                    valid += _valid_keys(KEYS, key_base, start + tl.arange(0, BLOCK_N), LK, HAS_KEYS).to(tl.float32)
                n = tl.maximum(tl.sum(valid, axis=0), 1.0)
            else:
                n = LK * 1.0
            dk -= tl.where(inside[:, None], through_mean[None, :] / n, 0.0)
        out_at = k_base + keys[:, None] * D + dims[None, :]
        out_mask = (keys[:, None] < LK) & (dims[None, :] < D)
        tl.store(DK + out_at, (dk * scale).to(DK.dtype.element_ty), mask=out_mask)
        tl.store(DV + out_at, dv.to(DV.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _spread_kernel(Q, K, KBAR, KEYS, SEED, LSE_CLEAN, GAP, SPREAD, scale, param, H, LQ, LK, D,
                       keys_stride_b, keys_stride_h, HAS_KEYS: tl.constexpr, SAMPLER: tl.constexpr,
                       PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        plane = batch * H + head
        q_base = plane.to(tl.int64) * LQ * D
        k_base = plane.to(tl.int64) * LK * D
        key_base = batch.to(tl.int64) * keys_stride_b + head * keys_stride_h
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        keep = rows < LQ
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        seed = tl.load(SEED)
        row_at = plane.to(tl.int64) * LQ + rows
        q = _load_rows(Q + q_base, rows, dims, LQ, D)
        lse_c = tl.load(LSE_CLEAN + row_at, mask=keep, other=0.0)
        gap = tl.load(GAP + row_at, mask=keep, other=0.0)
        spread = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for start_n in range(0, LK, BLOCK_N):
            keys = start_n + cols
            inside = _valid_keys(KEYS, key_base, keys, LK, HAS_KEYS)
            k = _centred_keys(K, KBAR, k_base, plane.to(tl.int64) * D, keys, dims, LK, D)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            s = tl.where(inside[None, :], s, float("-inf"))
            # |W_ij - P_ij| = P_ij |exp(n_ij - gap_i) - 1|: no difference of two nearly equal weights
            noise = _noise(seed, plane, rows, keys, LK, SAMPLER, param)
            spread += tl.sum(tl.exp(s - lse_c[:, None]) * tl.abs(_expm1(noise - gap[:, None])), axis=1)
        tl.store(SPREAD + row_at, spread, mask=keep)

    @triton.jit
    def _noise_kernel(SEED, NOISE, param, H, LQ, LK, SAMPLER: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
        """The noise the kernels draw, written out [B, H, LQ, LK] (tests: a reference with it as an explicit bias)."""
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        plane = batch * H + head
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        seed = tl.load(SEED)
        for start_n in range(0, LK, BLOCK_N):
            keys = start_n + cols
            n = _noise(seed, plane, rows, keys, LK, SAMPLER, param)
            tl.store(NOISE + plane.to(tl.int64) * LQ * LK + rows[:, None] * LK + keys[None, :], n,
                     mask=(rows[:, None] < LQ) & (keys[None, :] < LK))




def _precision(x: torch.Tensor) -> str:
    # 16-bit values are exact in tf32, whose products the tensor cores take; float32 inputs keep full products
    return "tf32" if x.dtype in (torch.float16, torch.bfloat16) else "ieee"


def _key_layout(key_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """The per-key mask ([B|1, 1|H, 1, Lk] bool, or None) as int8 [B|1, H|1, Lk]."""
    if key_mask is None:
        return None
    if key_mask.shape[-1] != length:
        raise ValueError(f"the key mask covers {key_mask.shape[-1]} keys, the call has {length}")
    return key_mask.reshape(key_mask.shape[0], key_mask.shape[1], length).to(torch.int8).contiguous()


def _keys_strides(keys: Optional[torch.Tensor]) -> tuple[int, int]:
    """The batch and head strides of the int8 key mask [B|1, H|1, Lk] (0 where it broadcasts)."""
    if keys is None:
        return 0, 0
    return (keys.stride(0) if keys.shape[0] > 1 else 0), (keys.stride(1) if keys.shape[1] > 1 else 0)


# Each launch is a functional custom op (attnbench::*): what it reads are its arguments, what it writes its results. A
# dispatch mode (the GPU cost page, a profiler) sees one op per launch, and FakeTensorMode its fake form (shapes only).
@torch.library.custom_op("attnbench::noisy_softmax_forward", mutates_args=())
def noisy_softmax_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kbar: torch.Tensor,
                          keys: Optional[torch.Tensor], seed: torch.Tensor, scale: float, sampler: int, param: float,
                          want_squares: bool, want_gap: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, sampled rows' logsumexp, clean rows' logsumexp, their squared scores' sums, the gap), the last two
    empty where not wanted; one pass over K and V per query tile."""
    batch, heads, num_queries, dim = q.shape
    num_keys = k.shape[-2]
    stride_b, stride_h = _keys_strides(keys)
    lse_noisy = torch.empty((batch, heads, num_queries), device=q.device, dtype=torch.float32)
    lse_clean = torch.empty_like(lse_noisy)
    squares = torch.empty_like(lse_noisy) if want_squares else lse_noisy.new_empty(0)
    gap = torch.empty_like(lse_noisy) if want_gap else lse_noisy.new_empty(0)
    out = torch.empty_like(q)
    _forward_kernel[(triton.cdiv(num_queries, BLOCK_M), heads, batch)](
        q, k, v, kbar, keys if keys is not None else seed, seed, out, lse_noisy, lse_clean,
        squares if want_squares else lse_noisy, gap if want_gap else lse_noisy, scale, param, heads, num_queries,
        num_keys, dim, stride_b, stride_h, keys is not None, want_squares, want_gap, sampler, _precision(q),
        BLOCK_M, BLOCK_N, _block_d(dim), num_stages=NUM_STAGES)
    return out, lse_noisy, lse_clean, squares, gap


@noisy_softmax_forward.register_fake
def _(q, k, v, kbar, keys, seed, scale, sampler, param, want_squares, want_gap):
    rows = q.new_empty(q.shape[:-1], dtype=torch.float32)
    return (torch.empty_like(q), rows, torch.empty_like(rows), torch.empty_like(rows) if want_squares else rows.new_empty(0),
            torch.empty_like(rows) if want_gap else rows.new_empty(0))


@torch.library.custom_op("attnbench::noisy_softmax_query_grad", mutates_args=())
def noisy_softmax_query_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kbar: torch.Tensor,
                             keys: Optional[torch.Tensor], seed: torch.Tensor, grad_out: torch.Tensor,
                             out: torch.Tensor, lse_noisy: torch.Tensor, lse_clean: torch.Tensor,
                             grad_lse: Optional[torch.Tensor], grad_squares: Optional[torch.Tensor], scale: float,
                             sampler: int, param: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, δ per row, r per row: the row sums of the KL's terms of dS, empty where the KL passes no gradient); one pass
    over the key tiles per query block."""
    batch, heads, num_queries, dim = q.shape
    num_keys = k.shape[-2]
    stride_b, stride_h = _keys_strides(keys)
    has_kl = grad_lse is not None or grad_squares is not None
    delta = torch.empty_like(lse_noisy)
    row_sums = torch.empty_like(lse_noisy) if has_kl else lse_noisy.new_empty(0)
    grad_q = torch.empty_like(q)
    # where a gradient is absent, a row vector stands in for it: the kernel does not read it
    _query_grad_kernel[(triton.cdiv(num_queries, BLOCK_M), heads, batch)](
        q, k, v, kbar, keys if keys is not None else seed, seed, grad_out, out, lse_noisy, lse_clean,
        grad_lse if grad_lse is not None else lse_noisy, grad_squares if grad_squares is not None else lse_noisy,
        delta, row_sums if has_kl else delta, grad_q, scale, param, heads, num_queries, num_keys, dim, stride_b,
        stride_h, keys is not None, grad_lse is not None, grad_squares is not None, sampler, _precision(q), BLOCK_M,
        BLOCK_N, _block_d(dim), num_stages=NUM_STAGES)
    return grad_q, delta, row_sums


@noisy_softmax_query_grad.register_fake
def _(q, k, v, kbar, keys, seed, grad_out, out, lse_noisy, lse_clean, grad_lse, grad_squares, scale, sampler, param):
    has_kl = grad_lse is not None or grad_squares is not None
    return (torch.empty_like(q), torch.empty_like(lse_noisy),
            torch.empty_like(lse_noisy) if has_kl else lse_noisy.new_empty(0))


@torch.library.custom_op("attnbench::noisy_softmax_key_grad", mutates_args=())
def noisy_softmax_key_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kbar: torch.Tensor,
                           keys: Optional[torch.Tensor], seed: torch.Tensor, grad_out: torch.Tensor,
                           lse_noisy: torch.Tensor, lse_clean: torch.Tensor, grad_lse: Optional[torch.Tensor],
                           grad_squares: Optional[torch.Tensor], delta: torch.Tensor, row_sums: torch.Tensor,
                           scale: float, sampler: int, param: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv); one pass over the query tiles per key block."""
    batch, heads, num_queries, dim = q.shape
    num_keys = k.shape[-2]
    stride_b, stride_h = _keys_strides(keys)
    grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)
    _key_grad_kernel[(triton.cdiv(num_keys, BLOCK_N), heads, batch)](
        q, k, v, kbar, keys if keys is not None else seed, seed, grad_out, lse_noisy, lse_clean,
        grad_lse if grad_lse is not None else lse_noisy, grad_squares if grad_squares is not None else lse_noisy,
        delta, row_sums if row_sums.numel() else delta, grad_k, grad_v, scale, param, heads, num_queries, num_keys,
        dim, stride_b, stride_h, keys is not None, grad_lse is not None, grad_squares is not None, sampler,
        _precision(q), BLOCK_M, BLOCK_N, _block_d(dim), num_stages=NUM_STAGES)
    return grad_k, grad_v


@noisy_softmax_key_grad.register_fake
def _(q, k, v, kbar, keys, seed, grad_out, lse_noisy, lse_clean, grad_lse, grad_squares, delta, row_sums, scale,
      sampler, param):
    return torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("attnbench::noisy_softmax_spread", mutates_args=())
def noisy_softmax_spread(q: torch.Tensor, k: torch.Tensor, kbar: torch.Tensor, keys: Optional[torch.Tensor],
                         seed: torch.Tensor, lse_clean: torch.Tensor, gap: torch.Tensor, scale: float, sampler: int,
                         param: float) -> torch.Tensor:
    """Σ_j |W_ij - P_ij| per row; one pass over the key tiles per query block."""
    batch, heads, num_queries, dim = q.shape
    num_keys = k.shape[-2]
    stride_b, stride_h = _keys_strides(keys)
    spread = torch.empty_like(lse_clean)
    _spread_kernel[(triton.cdiv(num_queries, BLOCK_M), heads, batch)](
        q, k, kbar, keys if keys is not None else seed, seed, lse_clean, gap, spread, scale, param, heads,
        num_queries, num_keys, dim, stride_b, stride_h, keys is not None, sampler, _precision(q), BLOCK_M, BLOCK_N,
        _block_d(dim), num_stages=NUM_STAGES)
    return spread


@noisy_softmax_spread.register_fake
def _(q, k, kbar, keys, seed, lse_clean, gap, scale, sampler, param):
    return torch.empty_like(lse_clean)




# What each launch computes, for FLOP counters (torch.utils.flop_counter; the GPU cost page): its tile products.
register_flop_formula(torch.ops.attnbench.noisy_softmax_forward)(
    lambda q, k, *_, **__: _products(q, k, 2))  # scores, w·v
register_flop_formula(torch.ops.attnbench.noisy_softmax_query_grad)(
    lambda q, k, *_, **__: _products(q, k, 3))  # scores, do·vᵀ, dS·k
register_flop_formula(torch.ops.attnbench.noisy_softmax_key_grad)(
    lambda q, k, *_, **__: _products(q, k, 4))  # scores, wᵀ·do, do·vᵀ, dSᵀ·q
register_flop_formula(torch.ops.attnbench.noisy_softmax_spread)(
    lambda q, k, *_, **__: _products(q, k, 1))  # scores


class NoisySoftmaxAttention(torch.autograd.Function):
    """softmax_j(s_ij + n_ij) v with s_ij = scale·<q_i, k_j - kbar>, q [B, H, Lq, d], k and v [B, H, Lk, d], kbar
    [B, H, d] float32 the mean of each (sample, head)'s valid keys (given without gradient: the kernels add the
    gradient that reaches k through it); the noise from `seed` (int64 [1], on the device). Returns (output, the clean
    rows' logsumexp a_i = logsumexp_j s_ij [B, H, Lq] float32, Σ_j s_ij² over the valid keys where `want_squares`
    (else an empty tensor), the sampled rows' logsumexp (no gradient), and the gap between the two logsumexps where
    `want_gap` (else empty; no gradient)). The scores' shift by <q_i, kbar> changes no weight; it keeps the KL's sums
    of log w_ij = s_ij - a_i free of cancellation (bam.py `_PairSums`)."""

    @staticmethod
    def forward(ctx, q, k, v, kbar, key_mask, seed, scale: float, sampler: int, param: float, want_squares: bool,
                want_gap: bool):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        kbar = kbar.detach().float().contiguous()
        keys = _key_layout(key_mask, k.shape[-2])
        out, lse_noisy, lse_clean, squares, gap = noisy_softmax_forward(q, k, v, kbar, keys, seed, scale, sampler,
                                                                        param, want_squares, want_gap)
        ctx.save_for_backward(q, k, v, kbar, out, lse_noisy, lse_clean, seed, keys)
        ctx.layout = (scale, sampler, param)
        ctx.mark_non_differentiable(lse_noisy, gap)
        if not want_squares:
            ctx.mark_non_differentiable(squares)
        return out, lse_clean, squares, lse_noisy, gap

    @staticmethod
    def backward(ctx, grad_out, grad_lse, grad_squares, _grad_noisy, _grad_gap):
        q, k, v, kbar, out, lse_noisy, lse_clean, seed, keys = ctx.saved_tensors
        scale, sampler, param = ctx.layout
        grad_out = grad_out.contiguous()
        grad_lse = grad_lse.contiguous() if grad_lse is not None else None
        grad_squares = grad_squares.contiguous() if grad_squares is not None and grad_squares.numel() else None
        grad_q, delta, row_sums = noisy_softmax_query_grad(q, k, v, kbar, keys, seed, grad_out, out, lse_noisy,
                                                           lse_clean, grad_lse, grad_squares, scale, sampler, param)
        grad_k, grad_v = noisy_softmax_key_grad(q, k, v, kbar, keys, seed, grad_out, lse_noisy, lse_clean, grad_lse,
                                                grad_squares, delta, row_sums, scale, sampler, param)
        return grad_q, grad_k, grad_v, None, None, None, None, None, None, None, None


def noisy_softmax_attention(q, k, v, kbar, key_mask, seed, scale: float, sampler: str, param: float,
                            want_squares: bool = False, want_gap: bool = False):
    """The fused call (`NoisySoftmaxAttention`): (output, clean rows' logsumexp, their sums of squared scores, sampled
    rows' logsumexp, sampled less clean logsumexp formed without cancellation where `want_gap` (for `row_spread`),
    else an empty tensor). `sampler` 'weibull' (param = 1/k) or 'lognormal' (param = σ); `key_mask` [B|1, 1|H, 1, Lk]
    bool or None; `kbar` [B, H, d] (`mean_key`); `seed` int64 [1] on q's device."""
    return NoisySoftmaxAttention.apply(q, k, v, kbar, key_mask, seed, scale, SAMPLERS[sampler], float(param),
                                       want_squares, want_gap)


def mean_key(k: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """kbar [B, H, d] float32, no gradient: the mean of each (sample, head)'s valid keys (0 where it has none)."""
    with torch.no_grad():
        if key_mask is None:
            return k.mean(-2, dtype=torch.float32)
        k = k.float()
        keys = key_mask.to(k.dtype).expand(k.shape[0], k.shape[1], 1, k.shape[-2])
        return (torch.matmul(keys, k) / keys.sum(-1, keepdim=True).clamp_min(1)).squeeze(-2)


def row_spread(q, k, kbar, key_mask, seed, lse_clean, gap, scale: float, sampler: str, param: float):
    """Σ_j |W_ij - P_ij| per row [B, H, Lq] float32 (no gradient): the sampled weights' distance from the clean ones,
    for the draw `seed` gave the call whose clean logsumexp, gap (`noisy_softmax_attention`) and kbar these are."""
    return noisy_softmax_spread(q.detach().contiguous(), k.detach().contiguous(), kbar.detach().float().contiguous(),
                                _key_layout(key_mask, k.shape[-2]), seed, lse_clean.detach(), gap.detach(), scale,
                                SAMPLERS[sampler], float(param))


def drawn_noise(seed, shape, sampler: str, param: float) -> torch.Tensor:
    """The noise n [B, H, Lq, Lk] the kernels draw for `seed` (tests: the same draw as an explicit bias)."""
    batch, heads, num_queries, num_keys = shape
    noise = torch.empty(shape, device=seed.device, dtype=torch.float32)
    _noise_kernel[(triton.cdiv(num_queries, BLOCK_M), heads, batch)](
        seed, noise, float(param), heads, num_queries, num_keys, SAMPLERS[sampler], BLOCK_M, BLOCK_N)
    return noise
