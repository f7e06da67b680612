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
from typing import Optional

import torch
from torch.utils.flop_counter import register_flop_formula

from .triton_common import tile_products

HEAD_DIMS = (16, 32, 64, 128, 256)


def _kernels():
    # by module path: the package's own namespace binds `adasplash_no_block_mask` to a function of that name until the
    # submodule is first imported
    return importlib.import_module("adasplash.adasplash_no_block_mask")


# Each launch is a custom op (attnbench::*) writing into buffers made (zeroed, as the library makes them) outside it: a
# dispatch mode (the GPU cost page, a profiler) sees one op per launch with what it reads and writes, and
# FakeTensorMode runs nothing.
@torch.library.custom_op("attnbench::adasplash_tau", mutates_args=("taus",))
def adasplash_tau(q: torch.Tensor, k: torch.Tensor, taus: torch.Tensor, lengths: Optional[torch.Tensor], alpha: float,
                  scale: float, niter: int, masked: bool) -> None:
    batch, heads, length, dim = q.shape
    block_m, block_n = 64, 64
    _kernels()._get_tau[(-(-length // block_m), heads, batch)](
        q, k, taus, lengths, alpha, scale, niter, False, masked, block_m, block_n, heads, dim, length,
        q.stride(1), taus.stride(1), num_warps=4, num_stages=3)


@adasplash_tau.register_fake
def _(q, k, taus, lengths, alpha, scale, niter, masked):
    return None


@torch.library.custom_op("attnbench::adasplash_output", mutates_args=("out", "out2"))
def adasplash_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, out2: Optional[torch.Tensor],
                     taus: torch.Tensor, lengths: Optional[torch.Tensor], alpha: float, scale: float, masked: bool) -> None:
    batch, heads, length, dim = q.shape
    block_m, block_n = 64, 32
    _kernels()._get_output[(-(-length // block_m), heads, batch)](
        q, k, v, out, out2, taus, lengths, alpha, scale, out2 is not None, False, masked, block_m, block_n, heads,
        dim, length, q.stride(1), taus.stride(1), num_warps=2, num_stages=3)


@adasplash_output.register_fake
def _(q, k, v, out, out2, taus, lengths, alpha, scale, masked):
    return None


@torch.library.custom_op("attnbench::adasplash_backward_delta", mutates_args=("delta",))
def adasplash_backward_delta(out2: torch.Tensor, grad_out: torch.Tensor, delta: torch.Tensor,
                             lengths: Optional[torch.Tensor], masked: bool) -> None:
    batch, heads, length, dim = out2.shape
    pre_block = 128
    _kernels()._bwd_preprocess[(-(-length // pre_block), heads, batch)](
        out2, grad_out, delta, lengths, out2.stride(1), delta.stride(1), masked, heads, dim, length, pre_block,
        num_warps=16, num_stages=1)


@adasplash_backward_delta.register_fake
def _(out2, grad_out, delta, lengths, masked):
    return None


@torch.library.custom_op("attnbench::adasplash_key_grad", mutates_args=("grad_k", "grad_v"))
def adasplash_key_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, grad_k: torch.Tensor,
                       grad_v: torch.Tensor, taus: torch.Tensor, lengths: Optional[torch.Tensor], delta: torch.Tensor,
                       alpha: float, scale: float, masked: bool) -> None:
    batch, heads, length, dim = q.shape
    block_m, block_n = 32, 32
    _kernels()._bwd_kv_kernel[(-(-length // block_n), heads, batch)](
        q, k, v, grad_out, grad_k, grad_v, taus, lengths, delta, alpha, scale, False, masked,
        q.stride(1), taus.stride(1), delta.stride(1), dim, heads, length, block_m, block_n,
        num_warps=2, num_stages=2)


@adasplash_key_grad.register_fake
def _(q, k, v, grad_out, grad_k, grad_v, taus, lengths, delta, alpha, scale, masked):
    return None


@torch.library.custom_op("attnbench::adasplash_query_grad", mutates_args=("grad_q",))
def adasplash_query_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, grad_q: torch.Tensor,
                         taus: torch.Tensor, lengths: Optional[torch.Tensor], delta: torch.Tensor, alpha: float,
                         scale: float, masked: bool) -> None:
    batch, heads, length, dim = q.shape
    block_m, block_n = 32, 32
    _kernels()._bwd_q_kernel[(-(-length // block_m), heads, batch)](
        q, k, v, grad_out, grad_q, taus, lengths, delta, alpha, scale, False, masked,
        q.stride(1), taus.stride(1), delta.stride(1), dim, heads, length, block_m, block_n,
        num_warps=2, num_stages=2)


@adasplash_query_grad.register_fake
def _(q, k, v, grad_out, grad_q, taus, lengths, delta, alpha, scale, masked):
    return None


# What each launch computes, for FLOP counters (torch.utils.flop_counter; the GPU cost page): its tile products.
register_flop_formula(torch.ops.attnbench.adasplash_tau)(
    lambda q, k, taus, lengths, alpha, scale, niter, *_, **__: tile_products(q, q, 1 + niter))  # the maxima, each pass
register_flop_formula(torch.ops.attnbench.adasplash_output)(
    lambda q, *_, **__: tile_products(q, q, 3))  # scores, p·v, s·v
register_flop_formula(torch.ops.attnbench.adasplash_backward_delta)(lambda *_, **__: 0)  # a row-wise dot product
register_flop_formula(torch.ops.attnbench.adasplash_key_grad)(
    lambda q, *_, **__: tile_products(q, q, 4))  # scores, pᵀ·do, do·vᵀ, dSᵀ·q
register_flop_formula(torch.ops.attnbench.adasplash_query_grad)(
    lambda q, *_, **__: tile_products(q, q, 3))  # scores, do·vᵀ, dS·k


class FullLengthAdaSplash(torch.autograd.Function):
    """entmax_α(q kᵀ / √d) v by AdaSplash's no-block-mask kernels, every sequence of the full length L. `masked`:
    pass every sequence's length to the kernels (their masked tiles; needed below 128 or off a power of two)."""

    @staticmethod
    def forward(ctx, q, k, v, alpha: float, masked: bool, niter: int):
        batch, heads, length, dim = q.shape
        assert dim in HEAD_DIMS and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        if not masked:
            assert length >= 128 and length & (length - 1) == 0, "unmasked tiles need a power of two from 128 on"
        # the lengths, made on the device: the kernels read them there, nothing reads them on the host
        lengths = torch.full((batch,), length, dtype=torch.int32, device=q.device) if masked else None
        scale = 1 / sqrt(dim)
        need_backward = q.requires_grad or k.requires_grad or v.requires_grad
        taus = torch.zeros((batch, heads, length), device=q.device, dtype=torch.float32)
        adasplash_tau(q, k, taus, lengths, alpha, scale, niter, masked)
        out = torch.zeros_like(q)
        out2 = torch.zeros_like(q) if need_backward else None
        adasplash_output(q, k, v, out, out2, taus, lengths, alpha, scale, masked)
        ctx.save_for_backward(q, k, v, out2, taus, lengths)
        ctx.alpha, ctx.scale, ctx.masked = alpha, scale, masked
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out2, taus, lengths = ctx.saved_tensors
        batch, heads, length, dim = q.shape
        alpha, scale, masked = ctx.alpha, ctx.scale, ctx.masked
        grad_out = grad_out.contiguous()
        delta = torch.zeros((batch, heads, length), device=q.device, dtype=torch.float32)
        adasplash_backward_delta(out2, grad_out, delta, lengths, masked)
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        adasplash_key_grad(q, k, v, grad_out, grad_k, grad_v, taus, lengths, delta, alpha, scale, masked)
        grad_q = torch.zeros_like(q)
        adasplash_query_grad(q, k, v, grad_out, grad_q, taus, lengths, delta, alpha, scale, masked)
        return grad_q, grad_k, grad_v, None, None, None


def full_length_adasplash(q, k, v, alpha: float = 1.5, niter: int = 10):
    """AdaSplash without block mask and without a host read, for q, k, v [B, H, L, d] of one length L (any L: the
    lengths are passed to the kernels, on the device, where the unmasked tiles would read past the rows)."""
    length = q.shape[-2]
    masked = not (length >= 128 and length & (length - 1) == 0)
    return FullLengthAdaSplash.apply(q, k, v, alpha, masked, niter)
