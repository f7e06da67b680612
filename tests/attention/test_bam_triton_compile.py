"""BAM's noisy-softmax kernels (modules/attention/triton_noisy_softmax.py) compiled for a GPU without one: Triton's
compiler, with an sm_90 target, takes each kernel down to a cubin (Triton's own ptxas). What a CPU can check of the
GPU build: that every kernel compiles, with both samplers and every optional term on (key padding, the KL's sums and
their gradients, the gap for `sample_tv`), for the dtypes and head dimensions a call hands it, and that its shared
memory fits an sm_86 card's 99 KB (the largest tiles: d = 128, float32 inputs)."""

from __future__ import annotations

import pytest

from modules.attention.triton_common import NUM_STAGES
from tests.attention.triton_compile import compile_for_sm90

triton = pytest.importorskip("triton")

DATA = ("Q", "K", "V", "DO", "OUT", "DQ", "DK", "DV")
ROWS = ("KBAR", "LSE_NOISY", "LSE_CLEAN", "SQUARES", "GAP", "GRAD_LSE", "GRAD_SQUARES", "DELTA", "ROW_SUMS", "SPREAD",
        "NOISE")
SIZES = ("H", "LQ", "LK", "D", "keys_stride_b", "keys_stride_h")
FLAGS = ("HAS_KEYS", "WANT_SQUARES", "WANT_GAP", "HAS_GRAD_LSE", "HAS_GRAD_SQUARES")




def _signature(kernel, dtype: str, dim: int, sampler: int):
    from modules.attention import triton_noisy_softmax as t

    values = {"BLOCK_M": t.BLOCK_M, "BLOCK_N": t.BLOCK_N, "BLOCK_D": t._block_d(dim), "SAMPLER": sampler,
              "PRECISION": "ieee" if dtype == "fp32" else "tf32", **{flag: True for flag in FLAGS}}
    signature, constexprs = {}, {}
    for name in kernel.arg_names:
        if name in values:
            signature[name] = "constexpr"
            constexprs[name] = values[name]
        elif name in DATA:
            signature[name] = f"*{dtype}"
        elif name in ROWS:
            signature[name] = "*fp32"
        elif name == "KEYS":
            signature[name] = "*i8"
        elif name == "SEED":
            signature[name] = "*i64"
        elif name in SIZES:
            signature[name] = "i32"
        elif name in ("scale", "param"):
            signature[name] = "fp32"
        else:
            raise AssertionError(f"{kernel.__name__}: no type for argument {name}")
    return signature, constexprs


@pytest.mark.parametrize("dtype, dim, sampler", [("bf16", 64, 0), ("fp32", 128, 1), ("fp16", 16, 0)])
def test_every_kernel_compiles_for_sm90_within_an_sm86_cards_shared_memory(dtype, dim, sampler):
    from modules.attention import triton_noisy_softmax as t

    for kernel in (t._forward_kernel, t._query_grad_kernel, t._key_grad_kernel, t._spread_kernel, t._noise_kernel):
        signature, constexprs = _signature(kernel, dtype, dim, sampler)
        compiled = compile_for_sm90(kernel, signature, constexprs, NUM_STAGES)
        assert compiled.metadata.shared <= 99 * 1024, (kernel.__name__, compiled.metadata.shared)
