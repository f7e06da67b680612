"""What the project's Triton kernels share (triton_entmax, triton_softmax, triton_noisy_softmax): Triton where it is
installed, the tile sizes of every launch, a row loader, and the FLOPs of a launch's tile products, which each kernel
registers as its custom ops' flop formulas (torch.utils.flop_counter: the GPU cost page's FLOP column)."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # the kernels are built only where Triton is installed (the gpu extra)
    triton = tl = None

BLOCK_M = 32
BLOCK_N = 32
NUM_STAGES = 2
"""Tiles and software-pipelining stages of every launch. Compiled for sm_90 without a GPU (triton.compile with a
GPUTarget), the learned-α entmax kernel's backward tiles at d = 128 with float32 inputs took 115 KB of shared memory
at Triton's default of 3 stages, past an sm_86 card's 99 KB, and 82 KB at 2; each kernel's compile test holds its
launches within 99 KB at these sizes."""


def block_d(dim: int) -> int:
    """The head dimension a tile holds: the next power of two from 16 (the columns past `dim` masked)."""
    return max(16, 1 << (dim - 1).bit_length())


def tile_products(q_shape, k_shape, passes: int) -> int:
    """FLOPs of `passes` [Lq x d] by [d x Lk] products (or [Lq x Lk] by [Lk x d]) per (sample, head), from q's and
    k's shapes (the flop counter hands a formula its tensors' shapes)."""
    batch, heads, num_queries, dim = q_shape
    return passes * 2 * batch * heads * num_queries * k_shape[-2] * dim


if triton is not None:

    @triton.jit
    def load_rows(ptr, rows, cols, n_rows, n_cols):
        """The [rows, cols] tile of a row-major [n_rows, n_cols] block at `ptr`, zero outside it, in float32."""
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        return tl.load(ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
