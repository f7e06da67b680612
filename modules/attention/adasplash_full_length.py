"""AdaSplash's block-mask-free kernels (`adasplash.adasplash_no_block_mask`) called for sequences of one known length.

Why not the library's own entry points. `adasplash_v1` (the block-mask version) lists the key blocks each query block
needs with `nonzero` on a block mask it computes on the device, twice a call, and each `nonzero` makes the host wait
for the GPU to size its output. `adasplash_no_block_mask` computes every block instead and so needs no list, but
where it is given lengths (`varlen`: below 128 queries or a length not a power of two, where its unmasked tiles would
read past the rows) it reads their maximum on the host (`varlen.max().item()`) to size its buffers. Here every
sequence has the full length L, known from the shape: this autograd function launches the same five Triton kernels
with the same arguments as the library's `_sparse_attention`, with L as that maximum, and so never reads the device.

The trade against the block-mask version: no block skipping. Every (query block, key block) tile is scored in each
of the Halley-bisection passes, the output and the backward, also where the block holds no key of any query's
support; the block-mask version's saving grows with the weights' sparsity (sparse attention at long L), paid for with
a host wait per `nonzero`. Bytes moved are the same order (q, k, v, out, τ and the gradients), peak the same.
"""

from __future__ import annotations

import importlib
from math import sqrt

import torch

HEAD_DIMS = (16, 32, 64, 128, 256)


def _kernels():
    # by module path: the package's own namespace binds `adasplash_no_block_mask` to a function of that name until the
    # submodule is first imported
    return importlib.import_module("adasplash.adasplash_no_block_mask")


class FullLengthAdaSplash(torch.autograd.Function):
    """entmax_α(q kᵀ / √d) v by AdaSplash's no-block-mask kernels, every sequence of the full length L. `masked`:
    pass every sequence's length to the kernels (their masked tiles; needed below 128 or off a power of two)."""

    @staticmethod
    def forward(ctx, q, k, v, alpha: float, masked: bool, niter: int):
        library = _kernels()
        batch, heads, length, dim = q.shape
        assert dim in HEAD_DIMS and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        if not masked:
            assert length >= 128 and length & (length - 1) == 0, "unmasked tiles need a power of two from 128 on"
        # the lengths, made on the device: the kernels read them there, nothing reads them on the host
        lengths = torch.full((batch,), length, dtype=torch.int32, device=q.device) if masked else None
        scale = 1 / sqrt(dim)
        need_backward = q.requires_grad or k.requires_grad or v.requires_grad
        taus = torch.zeros((batch, heads, length), device=q.device, dtype=torch.float32)
        block_m, block_n = 64, 64
        library._get_tau[(-(-length // block_m), heads, batch)](
            q, k, taus, lengths, alpha, scale, niter, False, masked, block_m, block_n, heads, dim, length,
            q.stride(1), taus.stride(1), num_warps=4, num_stages=3)
        block_m, block_n = 64, 32
        out = torch.zeros_like(q)
        out2 = torch.zeros_like(q) if need_backward else None
        library._get_output[(-(-length // block_m), heads, batch)](
            q, k, v, out, out2, taus, lengths, alpha, scale, need_backward, False, masked, block_m, block_n, heads,
            dim, length, q.stride(1), taus.stride(1), num_warps=2, num_stages=3)
        ctx.save_for_backward(q, k, v, out2, taus, lengths)
        ctx.alpha, ctx.scale, ctx.masked = alpha, scale, masked
        return out

    @staticmethod
    def backward(ctx, grad_out):
        library = _kernels()
        q, k, v, out2, taus, lengths = ctx.saved_tensors
        batch, heads, length, dim = q.shape
        alpha, scale, masked = ctx.alpha, ctx.scale, ctx.masked
        grad_out = grad_out.contiguous()
        pre_block = 128
        delta = torch.zeros((batch, heads, length), device=q.device, dtype=torch.float32)
        library._bwd_preprocess[(-(-length // pre_block), heads, batch)](
            out2, grad_out, delta, lengths, out2.stride(1), delta.stride(1), masked, heads, dim, length, pre_block,
            num_warps=16, num_stages=1)
        block_m, block_n = 32, 32
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        library._bwd_kv_kernel[(-(-length // block_n), heads, batch)](
            q, k, v, grad_out, grad_k, grad_v, taus, lengths, delta, alpha, scale, False, masked,
            q.stride(1), taus.stride(1), delta.stride(1), dim, heads, length, block_m, block_n,
            num_warps=2, num_stages=2)
        grad_q = torch.zeros_like(q)
        library._bwd_q_kernel[(-(-length // block_m), heads, batch)](
            q, k, v, grad_out, grad_q, taus, lengths, delta, alpha, scale, False, masked,
            q.stride(1), taus.stride(1), delta.stride(1), dim, heads, length, block_m, block_n,
            num_warps=2, num_stages=2)
        return grad_q, grad_k, grad_v, None, None, None


def full_length_adasplash(q, k, v, alpha: float = 1.5, niter: int = 10):
    """AdaSplash without block mask and without a host read, for q, k, v [B, H, L, d] of one length L (any L: the
    lengths are passed to the kernels, on the device, where the unmasked tiles would read past the rows)."""
    length = q.shape[-2]
    masked = not (length >= 128 and length & (length - 1) == 0)
    return FullLengthAdaSplash.apply(q, k, v, alpha, masked, niter)
