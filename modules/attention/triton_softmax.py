"""A flash-style softmax attention kernel in Triton for logits that carry terms SDPA could take only as a bias:

    out_i = Σ_j softmax_j(s_ij) v_j,   s_ij = a_h·scale·<q_i, k_j> + c_h·‖k_j‖² + e_{b,h,j} + T[h, bucket(j - i)]

with every term but the first optional (a_h defaults to 1), and keys masked per key (key padding). The weights are
never formed; gradients reach q, k, v, a [H], c [H], e [B, H, Lk] and T [H, buckets].

Why our own kernel. gmm's logits α⟨q, ξ⟩ + (ρ-1)α/2 ‖ξ‖² + ⟨c, ξ⟩ and fenchel's α·scale⟨q, k⟩ + T5 position bias are a
softmax, but SDPA takes them only through extra tensor passes around it: gmm as q' = [αq, 1, 0…], k' = [ξ, t, 0…]
(width 72, every pad, αq, ‖ξ‖², dq, dk and dα a full-tensor pass), fenchel as an [H, L, L] float bias whose gradient
CUDA's memory-efficient kernel writes at [B, H, L, L] for autograd to sum. Here those terms are formed in the score
tile, in float32, and their gradients summed out of the tiles in the dk/dv pass: per key (Σ_i dS_ij: e's, and c's
against ‖k_j‖²), per head (a's as scale·Σ_j ⟨Σ_i dS_ij q_i, k_j⟩, T's per bucket), as per-program partial sums
reduced after (deterministic, no atomics).

The position term is T5's relative-position bucket of key - query position, queries aligned as the last Lq of the
Lk positions (as fenchel's `_buckets` and DenseGroups' causal mask align them). The bucket of each relative position
is read from a lookup of 2·Lk - 1 int32 built by the same function the eager path uses
(fenchel.t5_relative_position_bucket), so the buckets are the eager path's integers exactly: recomputed in-kernel,
the float32 logarithm at a bucket boundary (distance 16, 32, 64 for T5's defaults) could round the other way.

Passes (FlashAttention 2's, but for δ): the forward, one pass over K and V per query tile, writes the output and the
row logsumexp; the backward's dq pass (one pass over K and V per query tile) writes dq and δ_i = Σ_j p_ij <do_i, v_j>
(= <do_i, o_i>) for the dk/dv pass (one pass over Q and dO per key tile), which also sums a's and T's gradients. The dq
pass forms δ from the tiles instead of reading the output: dq_i = Σ_j p_ij (dp_ij - δ_i) k_j is summed about a
reference r_i (the first key tile's weighted mean of dp_ij) as Σ_j p_ij (dp_ij - r_i) k_j - (δ_i - r_i) Σ_j p_ij k_j,
one more tile product (p·k) for one fewer [B, H, L, d] read, and the output no longer saved. Against float64 the
16-bit dq is no worse for it: δ summed in float32 from the tiles' own p and dp, not from the 16-bit output, and the
reference keeps the rounded terms small where v has a large common part (the tests measure both). Saved for the
backward: q, k, v, the row logsumexp and the small terms.

Rows with no valid key give a zero output and zero gradients, as DenseGroups' softmax gives them zero weights.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .triton_common import BLOCK_M, BLOCK_N, NUM_STAGES, block_d as _block_d, tile_products as _products, tl, triton

HEAD_DIMS = (16, 128)
"""Head dimensions the kernel takes (padded to a power of two in the tiles)."""


if triton is not None:

    @triton.jit
    def _scores(q, k, rows, keys, bh, batch, head, sa, c, E, MASK, mask_stride, LOOKUP, TABLE, LQ, LK,
                NUM_BUCKETS: tl.constexpr, HAS_C: tl.constexpr, HAS_E: tl.constexpr, HAS_T: tl.constexpr,
                HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
        """The [BLOCK_M, BLOCK_N] float32 score tile of rows × keys, -inf where a key is masked or past LK, and
        whether each pair takes part."""
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sa
        key_in = keys < LK
        if HAS_C:
            kf = k.to(tl.float32)
            s += c * tl.sum(kf * kf, axis=1)[None, :]
        if HAS_E:
            e = tl.load(E + bh * LK + keys, mask=key_in, other=0.0)
            s += e.to(tl.float32)[None, :]
        if HAS_T:
            pair_in = (rows[:, None] < LQ) & key_in[None, :]
            # relative position key - query, queries the last LQ of the LK positions; the lookup starts at 1 - LK
            rel = keys[None, :] - rows[:, None] + (LQ - 1)
            bucket = tl.load(LOOKUP + rel, mask=pair_in, other=0)
            s += tl.load(TABLE + head * NUM_BUCKETS + bucket, mask=pair_in, other=0.0)
        if HAS_MASK:
            key_in = key_in & (tl.load(MASK + batch.to(tl.int64) * mask_stride + keys, mask=key_in, other=0) != 0)
        s = tl.where(key_in[None, :], s, float("-inf"))
        return s, key_in

    @triton.jit
    def _bucket_of(rows, keys, LOOKUP, LQ, LK):
        pair_in = (rows[:, None] < LQ) & (keys[None, :] < LK)
        return tl.load(LOOKUP + keys[None, :] - rows[:, None] + (LQ - 1), mask=pair_in, other=0)

    @triton.jit
    def _key_tile(q, rows, cols, dims, dim_in, start_n, K, V, bh, batch, head, sa, c, E, MASK, mask_stride, LOOKUP,
                  TABLE, LQ, LK, D, NUM_BUCKETS: tl.constexpr, HAS_C: tl.constexpr, HAS_E: tl.constexpr,
                  HAS_T: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
        """The key tile from `start_n` (its k and v rows, zero past LK) and the score tile of `rows` against it, with
        which keys take part."""
        keys = start_n + cols
        at = bh * LK * D + keys[:, None] * D + dims[None, :]
        kv_in = (keys[:, None] < LK) & dim_in
        k = tl.load(K + at, mask=kv_in, other=0.0)
        v = tl.load(V + at, mask=kv_in, other=0.0)
        s, key_in = _scores(q, k, rows, keys, bh, batch, head, sa, c, E, MASK, mask_stride, LOOKUP, TABLE, LQ, LK,
                            NUM_BUCKETS, HAS_C, HAS_E, HAS_T, HAS_MASK, PRECISION)
        return k, v, s, key_in

    @triton.jit
    def _forward_kernel(Q, K, V, A, C, E, MASK, mask_stride, LOOKUP, TABLE, OUT, LSE, scale, LQ, LK, D,
                        NUM_BUCKETS: tl.constexpr, HAS_C: tl.constexpr, HAS_E: tl.constexpr, HAS_T: tl.constexpr,
                        HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        bh = (batch * tl.num_programs(1) + head).to(tl.int64)
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        dim_in = dims[None, :] < D
        q = tl.load(Q + bh * LQ * D + rows[:, None] * D + dims[None, :], mask=(rows[:, None] < LQ) & dim_in, other=0.0)
        sa = tl.load(A + head).to(tl.float32) * scale
        c = 0.0
        if HAS_C:
            c = tl.load(C + head).to(tl.float32)
        top = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        for start_n in range(0, LK, BLOCK_N):
            k, v, s, key_in = _key_tile(q, rows, cols, dims, dim_in, start_n, K, V, bh, batch, head, sa, c, E, MASK,
                                        mask_stride, LOOKUP, TABLE, LQ, LK, D, NUM_BUCKETS, HAS_C, HAS_E, HAS_T,
                                        HAS_MASK, PRECISION)
            new_top = tl.maximum(top, tl.max(s, axis=1))
            # a row with no valid key yet keeps -inf: shift by 0 there so that no inf - inf is formed
            shift = tl.where(new_top == float("-inf"), 0.0, new_top)
            p = tl.exp(s - shift[:, None])
            rescale = tl.exp(top - shift)
            total = total * rescale + tl.sum(p, axis=1)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            top = new_top
        has_keys = total > 0
        out = acc / tl.where(has_keys, total, 1.0)[:, None]
        row_in = rows < LQ
        tl.store(OUT + bh * LQ * D + rows[:, None] * D + dims[None, :], out.to(OUT.dtype.element_ty),
                 mask=row_in[:, None] & dim_in)
        # +inf for a row without keys: exp(s - lse) is then 0 in the backward
        lse = tl.where(has_keys, tl.where(top == float("-inf"), 0.0, top) + tl.log(tl.where(has_keys, total, 1.0)),
                       float("inf"))
        tl.store(LSE + bh * LQ + rows, lse, mask=row_in)

    @triton.jit
    def _query_tile(q, do, lse, rows, row_in, cols, dims, dim_in, start_n, K, V, bh, batch, head, sa, c, E, MASK,
                    mask_stride, LOOKUP, TABLE, LQ, LK, D, NUM_BUCKETS: tl.constexpr, HAS_C: tl.constexpr,
                    HAS_E: tl.constexpr, HAS_T: tl.constexpr, HAS_MASK: tl.constexpr, PRECISION: tl.constexpr):
        """One key tile of the dq pass: its k rows, the scores, the weights p_ij (0 where a pair takes no part) and
        dp_ij = <do_i, v_j>."""
        k, v, s, key_in = _key_tile(q, rows, cols, dims, dim_in, start_n, K, V, bh, batch, head, sa, c, E, MASK,
                                    mask_stride, LOOKUP, TABLE, LQ, LK, D, NUM_BUCKETS, HAS_C, HAS_E, HAS_T, HAS_MASK,
                                    PRECISION)
        p = tl.where(key_in[None, :] & row_in[:, None], tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        return k, s, p, dp

    @triton.jit
    def _query_grad_kernel(Q, K, V, DO, A, C, E, MASK, mask_stride, LOOKUP, TABLE, LSE, DELTA, DQ, scale, LQ, LK, D,
                           NUM_BUCKETS: tl.constexpr, HAS_C: tl.constexpr, HAS_E: tl.constexpr, HAS_T: tl.constexpr,
                           HAS_MASK: tl.constexpr, PRECISION: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        bh = (batch * tl.num_programs(1) + head).to(tl.int64)
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_in = rows < LQ
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        dim_in = dims[None, :] < D
        row_at = bh * LQ * D + rows[:, None] * D + dims[None, :]
        row_mask = row_in[:, None] & dim_in
        q = tl.load(Q + row_at, mask=row_mask, other=0.0)
        do = tl.load(DO + row_at, mask=row_mask, other=0.0)
        lse = tl.load(LSE + bh * LQ + rows, mask=row_in, other=float("inf"))
        sa = tl.load(A + head).to(tl.float32) * scale
        c = 0.0
        if HAS_C:
            c = tl.load(C + head).to(tl.float32)
        # dq_i = Σ_j p_ij (dp_ij - δ_i) k_j with δ_i = Σ_j p_ij dp_ij, summed in one pass without δ known: about a
        # reference r_i, dq_i = Σ_j p_ij (dp_ij - r_i) k_j - (δ_i - r_i) Σ_j p_ij k_j. r_i is the first key tile's
        # softmax-weighted mean of dp_ij, so that the tiles' terms p (dp - r) stay as small as FlashAttention's
        # p (dp - δ) even where v has a large common part (the 16-bit tiles' rounding is relative to them).
        k, s, p, dp = _query_tile(q, do, lse, rows, row_in, cols, dims, dim_in, 0, K, V, bh, batch, head, sa, c, E,
                                  MASK, mask_stride, LOOKUP, TABLE, LQ, LK, D, NUM_BUCKETS, HAS_C, HAS_E, HAS_T,
                                  HAS_MASK, PRECISION)
        top = tl.max(s, axis=1)
        local = tl.where(s == float("-inf"), 0.0, tl.exp(s - tl.where(top == float("-inf"), 0.0, top)[:, None]))
        local_total = tl.sum(local, axis=1)
        ref = tl.where(local_total > 0, tl.sum(local * dp, axis=1) / tl.where(local_total > 0, local_total, 1.0), 0.0)
        ds = p * (dp - ref[:, None])
        dq = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        pk = tl.dot(p.to(k.dtype), k, input_precision=PRECISION)
        excess = tl.sum(ds, axis=1)  # Σ_j p_ij (dp_ij - r_i)
        mass = tl.sum(p, axis=1)  # Σ_j p_ij: 1 up to rounding, 0 on a row without keys
        for start_n in range(BLOCK_N, LK, BLOCK_N):
            k, s, p, dp = _query_tile(q, do, lse, rows, row_in, cols, dims, dim_in, start_n, K, V, bh, batch, head,
                                      sa, c, E, MASK, mask_stride, LOOKUP, TABLE, LQ, LK, D, NUM_BUCKETS, HAS_C,
                                      HAS_E, HAS_T, HAS_MASK, PRECISION)
            ds = p * (dp - ref[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
            pk += tl.dot(p.to(k.dtype), k, input_precision=PRECISION)
            excess += tl.sum(ds, axis=1)
            mass += tl.sum(p, axis=1)
        # δ_i - r_i = Σ_j p_ij (dp_ij - r_i) + r_i (Σ_j p_ij - 1)
        shift = excess + ref * (mass - 1.0)
        dq -= shift[:, None] * pk
        tl.store(DELTA + bh * LQ + rows, ref + shift, mask=row_in)
        tl.store(DQ + row_at, (dq * sa).to(DQ.dtype.element_ty), mask=row_mask)

    @triton.jit
    def _key_grad_kernel(Q, K, V, DO, A, C, E, MASK, mask_stride, LOOKUP, TABLE, LSE, DELTA, DK, DV, DE, DC_PART,
                         DA_PART, DT_PART, scale, LQ, LK, D,
                         NUM_BUCKETS: tl.constexpr, BUCKETS_PAD: tl.constexpr, HAS_C: tl.constexpr,
                         HAS_E: tl.constexpr, HAS_T: tl.constexpr, HAS_MASK: tl.constexpr, NEED_DE: tl.constexpr,
                         NEED_DC: tl.constexpr, NEED_DA: tl.constexpr, NEED_DT: tl.constexpr,
                         PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr):
        start_n, head, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        bh = (batch * tl.num_programs(1) + head).to(tl.int64)
        program = bh * tl.num_programs(0) + start_n
        keys = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_in = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        dim_in = dims[None, :] < D
        key_at = bh * LK * D + keys[:, None] * D + dims[None, :]
        key_mask = (keys[:, None] < LK) & dim_in
        k = tl.load(K + key_at, mask=key_mask, other=0.0)
        v = tl.load(V + key_at, mask=key_mask, other=0.0)
        sa = tl.load(A + head).to(tl.float32) * scale
        c = 0.0
        if HAS_C:
            c = tl.load(C + head).to(tl.float32)
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        de = tl.zeros((BLOCK_N,), dtype=tl.float32)
        buckets_of = tl.arange(0, BUCKETS_PAD)
        dt = tl.zeros((BUCKETS_PAD,), dtype=tl.float32)
        key_in = keys < LK
        for start_m in range(0, LQ, BLOCK_M):
            rows = start_m + rows_in
            row_in = rows < LQ
            row_at = bh * LQ * D + rows[:, None] * D + dims[None, :]
            row_mask = row_in[:, None] & dim_in
            q = tl.load(Q + row_at, mask=row_mask, other=0.0)
            do = tl.load(DO + row_at, mask=row_mask, other=0.0)
            lse = tl.load(LSE + bh * LQ + rows, mask=row_in, other=float("inf"))
            delta = tl.load(DELTA + bh * LQ + rows, mask=row_in, other=0.0)
            s, key_in = _scores(q, k, rows, keys, bh, batch, head, sa, c, E, MASK, mask_stride, LOOKUP, TABLE, LQ, LK,
                                NUM_BUCKETS, HAS_C, HAS_E, HAS_T, HAS_MASK, PRECISION)
            p = tl.exp(s - lse[:, None])
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = tl.where(key_in[None, :] & row_in[:, None], p * (dp - delta[:, None]), 0.0)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
            if HAS_C or NEED_DE:
                de += tl.sum(ds, axis=0)
            if NEED_DT:
                bucket = _bucket_of(rows, keys, LOOKUP, LQ, LK)
                low = tl.min(tl.where(key_in[None, :] & row_in[:, None], bucket, NUM_BUCKETS), axis=None)
                high = tl.max(tl.where(key_in[None, :] & row_in[:, None], bucket, -1), axis=None)
                # a tile spans few buckets (one, far from the diagonal): a sum per bucket present
                for b in range(low, high + 1):
                    part = tl.sum(tl.where(bucket == b, ds, 0.0), axis=None)
                    dt += tl.where(buckets_of == b, part, 0.0)
        if NEED_DA:
            # ∂/∂a of Σ_ij dS_ij a·scale·<q_i, k_j> = scale Σ_j <Σ_i dS_ij q_i, k_j>
            tl.store(DA_PART + program, tl.sum(dk * k.to(tl.float32), axis=None) * scale)
        if NEED_DT:
            tl.store(DT_PART + program * BUCKETS_PAD + buckets_of, dt)
        dk = dk * sa
        if HAS_C:
            # ∂(c ‖k_j‖²)/∂k_j = 2c k_j
            dk += (2.0 * c) * de[:, None] * k.to(tl.float32)
        tl.store(DK + key_at, dk.to(DK.dtype.element_ty), mask=key_mask)
        tl.store(DV + key_at, dv.to(DV.dtype.element_ty), mask=key_mask)
        if NEED_DE:
            tl.store(DE + bh * LK + keys, de, mask=keys < LK)
        if NEED_DC:
            kf = k.to(tl.float32)
            tl.store(DC_PART + program, tl.sum(tl.where(key_in, de * tl.sum(kf * kf, axis=1), 0.0), axis=None))




def _precision(dtype: torch.dtype | None) -> str:
    # float32 inputs: full float32 products (the eager path's), not TF32; bf16/fp16 tiles run as they are
    return "ieee"


def _terms(a: Tensor, c: Tensor | None, e: Tensor | None, table: Tensor | None, key_valid: Tensor | None,
           lookup: Tensor | None) -> tuple[list, dict]:
    """The optional terms as kernel arguments (a tensor the kernel never reads, a, in place of an absent one) and the
    flags that say which are there."""
    mask, mask_stride = a, 0
    if key_valid is not None:
        mask = key_valid.view(torch.uint8)
        mask_stride = key_valid.shape[-1] if key_valid.shape[0] > 1 else 0
    args = [a, a if c is None else c, a if e is None else e, mask, mask_stride, a if lookup is None else lookup,
            a if table is None else table]
    flags = dict(NUM_BUCKETS=table.shape[1] if table is not None else 1, HAS_C=c is not None, HAS_E=e is not None,
                 HAS_T=table is not None, HAS_MASK=key_valid is not None)
    return args, flags


# Each launch is a functional custom op (attnbench::*): what it reads are its arguments, what it writes its results. A
# dispatch mode (the GPU cost page, a profiler) sees one op per launch, and FakeTensorMode its fake form (shapes only).
@torch.library.custom_op("attnbench::biased_softmax_forward", mutates_args=())
def biased_softmax_forward(q: Tensor, k: Tensor, v: Tensor, a: Tensor, c: Tensor | None, e: Tensor | None,
                           table: Tensor | None, key_valid: Tensor | None, lookup: Tensor | None,
                           scale: float) -> tuple[Tensor, Tensor]:
    """(output, row logsumexp [B, H, Lq] float32: +inf on a row without keys), one pass over K and V per query tile."""
    batch, heads, lq, dim = q.shape
    lk = k.shape[2]
    out = v.new_empty((batch, heads, lq, dim))
    lse = torch.empty((batch, heads, lq), device=q.device, dtype=torch.float32)
    args, flags = _terms(a, c, e, table, key_valid, lookup)
    _forward_kernel[(triton.cdiv(lq, BLOCK_M), heads, batch)](
        q, k, v, *args, out, lse, scale, lq, lk, dim, **flags, PRECISION=_precision(q.dtype),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=_block_d(dim), num_stages=NUM_STAGES)
    return out, lse


@biased_softmax_forward.register_fake
def _(q, k, v, a, c, e, table, key_valid, lookup, scale):
    return v.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("attnbench::biased_softmax_query_grad", mutates_args=())
def biased_softmax_query_grad(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, a: Tensor, c: Tensor | None,
                              e: Tensor | None, table: Tensor | None, key_valid: Tensor | None, lookup: Tensor | None,
                              lse: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(dq, δ_i = Σ_j p_ij <do_i, v_j> = <do_i, o_i> per row, float32), one pass over K and V per query tile."""
    batch, heads, lq, dim = q.shape
    lk = k.shape[2]
    args, flags = _terms(a, c, e, table, key_valid, lookup)
    grad_q, delta = torch.empty_like(q), torch.empty_like(lse)
    _query_grad_kernel[(triton.cdiv(lq, BLOCK_M), heads, batch)](
        q, k, v, grad_out, *args, lse, delta, grad_q, scale, lq, lk, dim, **flags, PRECISION=_precision(q.dtype),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=_block_d(dim), num_stages=NUM_STAGES)
    return grad_q, delta


@biased_softmax_query_grad.register_fake
def _(q, k, v, grad_out, a, c, e, table, key_valid, lookup, lse, scale):
    return torch.empty_like(q), torch.empty_like(lse)


@torch.library.custom_op("attnbench::biased_softmax_key_grad", mutates_args=())
def biased_softmax_key_grad(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, a: Tensor, c: Tensor | None,
                            e: Tensor | None, table: Tensor | None, key_valid: Tensor | None, lookup: Tensor | None,
                            lse: Tensor, delta: Tensor, scale: float, need_de: bool, need_dc: bool, need_da: bool,
                            need_dt: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dk, dv, e's gradient [B, H, Lk] float32, and per program [B, H, key tiles]: c's, a's, T's [.., buckets
    padded]; the last four empty where not asked for), one pass over Q and dO per key tile."""
    batch, heads, lq, dim = q.shape
    lk = k.shape[2]
    n_blocks = triton.cdiv(lk, BLOCK_N)
    args, flags = _terms(a, c, e, table, key_valid, lookup)
    buckets_pad = _buckets_pad(flags["NUM_BUCKETS"])
    grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)
    grad_e, dc_part, da_part, dt_part = _key_grad_parts(lse, batch, heads, lk, n_blocks, buckets_pad, need_de,
                                                        need_dc, need_da, need_dt)
    _key_grad_kernel[(n_blocks, heads, batch)](
        q, k, v, grad_out, *args, lse, delta, grad_k, grad_v, grad_e if need_de else a, dc_part if need_dc else a,
        da_part if need_da else a, dt_part if need_dt else a, scale, lq, lk, dim, **flags, BUCKETS_PAD=buckets_pad,
        NEED_DE=need_de, NEED_DC=need_dc, NEED_DA=need_da, NEED_DT=need_dt, PRECISION=_precision(q.dtype),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=_block_d(dim), num_stages=NUM_STAGES)
    return grad_k, grad_v, grad_e, dc_part, da_part, dt_part


def _key_grad_parts(lse, batch, heads, lk, n_blocks, buckets_pad, need_de, need_dc, need_da, need_dt):
    """The dk/dv pass's float32 outputs besides dk and dv (empty where not asked for)."""
    return (lse.new_empty((batch, heads, lk) if need_de else (0,)),
            lse.new_empty((batch, heads, n_blocks) if need_dc else (0,)),
            lse.new_empty((batch, heads, n_blocks) if need_da else (0,)),
            lse.new_empty((batch, heads, n_blocks, buckets_pad) if need_dt else (0,)))


@biased_softmax_key_grad.register_fake
def _(q, k, v, grad_out, a, c, e, table, key_valid, lookup, lse, delta, scale, need_de, need_dc, need_da, need_dt):
    batch, heads, lk, _ = k.shape
    buckets_pad = _buckets_pad(table.shape[1] if table is not None else 1)
    return (torch.empty_like(k), torch.empty_like(v),
            *_key_grad_parts(lse, batch, heads, lk, -(-lk // BLOCK_N), buckets_pad, need_de, need_dc, need_da,
                             need_dt))


def _buckets_pad(num_buckets: int) -> int:
    return max(16, 1 << (num_buckets - 1).bit_length())




# What each launch computes, for FLOP counters (torch.utils.flop_counter, which hands a formula the shapes; the GPU cost
# page): its tile products.
register_flop_formula(torch.ops.attnbench.biased_softmax_forward)(
    lambda q, k, *_, **__: _products(q, k, 2))  # scores, p·v
register_flop_formula(torch.ops.attnbench.biased_softmax_query_grad)(
    lambda q, k, *_, **__: _products(q, k, 4))  # scores, do·vᵀ, dS·k, p·k
register_flop_formula(torch.ops.attnbench.biased_softmax_key_grad)(
    lambda q, k, *_, **__: _products(q, k, 4))  # scores, pᵀ·do, do·vᵀ, dSᵀ·q


class BiasedSoftmaxAttention(torch.autograd.Function):
    """softmax_j(a_h·scale·<q_i, k_j> + c_h‖k_j‖² + e_bhj + T[h, bucket(j - i)]) v_j; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, a, c, e, table, key_valid, lookup, scale: float):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        a32 = a.detach().float().contiguous()
        c32 = c.detach().float().contiguous() if c is not None else None
        e32 = e.detach().float().contiguous() if e is not None else None
        t32 = table.detach().float().contiguous() if table is not None else None
        lookup = lookup.contiguous() if lookup is not None else None
        key_valid = key_valid.contiguous() if key_valid is not None else None
        out, lse = biased_softmax_forward(q, k, v, a32, c32, e32, t32, key_valid, lookup, scale)
        ctx.save_for_backward(q, k, v, lse, a32, c32, e32, t32, key_valid, lookup)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, lse, a32, c32, e32, t32, key_valid, lookup = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_out = grad_out.contiguous()
        if grad_out.dtype != q.dtype:
            grad_out = grad_out.to(q.dtype)
        need_da, need_dt = bool(needs[3]), bool(t32 is not None and needs[6])
        need_dc, need_de = bool(c32 is not None and needs[4]), bool(e32 is not None and needs[5])
        # the dq pass forms δ, which the dk/dv pass reads
        grad_q, delta = biased_softmax_query_grad(
            q, k, v, grad_out, a32, c32, e32, t32, key_valid, lookup, lse, ctx.scale)
        grad_k, grad_v, grad_e, dc_part, da_part, dt_part = biased_softmax_key_grad(
            q, k, v, grad_out, a32, c32, e32, t32, key_valid, lookup, lse, delta, ctx.scale, need_de, need_dc,
            need_da, need_dt)
        grad_a = da_part.sum((0, 2)) if need_da else None
        grad_c = dc_part.sum((0, 2)) if need_dc else None
        grad_t = dt_part.sum((0, 2))[:, :t32.shape[1]] if need_dt else None
        return (grad_q, grad_k, grad_v, grad_a, grad_c, grad_e if need_de else None, grad_t, None, None, None)


def biased_softmax_attention(q, k, v, *, scale: float, a=None, c=None, e=None, table=None, lookup=None,
                             key_valid=None):
    """The fused call. q [B, H, Lq, d], k [B, H, Lk, d], v [B, H, Lk, d] of one dtype; a, c [H] (a = None: 1); e
    [B, H, Lk]; table [H, buckets] with `lookup` the int32 bucket of each relative position key - query from 1 - Lk to
    Lk - 1 (fenchel.relative_buckets); key_valid [B or 1, Lk] bool (True = a key to attend)."""
    if a is None:
        a = torch.ones(q.shape[1], device=q.device, dtype=torch.float32)
    return BiasedSoftmaxAttention.apply(q, k, v, a, c, e, table, key_valid, lookup, scale)
