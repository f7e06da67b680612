"""The learned-α kernel (modules/attention/triton_entmax.py) compiled for a GPU without one: Triton's compiler, with
an sm_90 target, takes each kernel down to a cubin (Triton's own ptxas). What a CPU can check of the GPU build: that
every kernel compiles for the dtypes and head dimensions the variant hands it, and that its shared memory fits an
sm_86 card's 99 KB (the largest tiles: d = 128, float32 inputs)."""

from __future__ import annotations

import pytest

from modules.attention.triton_common import NUM_STAGES
from tests.attention.triton_compile import compile_for_sm90

triton = pytest.importorskip("triton")




@pytest.mark.parametrize("dtype, dim", [("bf16", 64), ("fp32", 128), ("fp16", 16)])
def test_every_kernel_compiles_for_sm90_within_an_sm86_cards_shared_memory(dtype, dim):
    from modules.attention import triton_entmax as te

    tile = {"BLOCK_M": te.BLOCK_M, "BLOCK_N": te.BLOCK_N, "BLOCK_D": te._block_d(dim)}
    data, rows = f"*{dtype}", "*fp32"
    sizes = {"scale": "fp32", "H": "i32", "L": "i32", "D": "i32"}
    constexpr = {name: "constexpr" for name in tile}
    kernels = [
        (te._tau_kernel, {"Q": data, "K": data, "ALPHA": rows, "TAU": rows, "scale": "fp32", "log2_length": "fp32",
                          "H": "i32", "L": "i32", "D": "i32", "NITER": "constexpr", **constexpr}, {"NITER": te.NITER, **tile}),
        (te._output_kernel, {"Q": data, "K": data, "V": data, "ALPHA": rows, "TAU": rows, "NORM": rows, "OUT": data,
                             "OUT2": rows, **sizes, **constexpr}, tile),
        (te._key_grad_kernel, {"Q": data, "K": data, "V": data, "DO": data, "ALPHA": rows, "TAU": rows, "NORM": rows,
                               "DELTA": rows, "DK": data, "DV": data, **sizes, **constexpr}, tile),
        (te._query_grad_kernel, {"Q": data, "K": data, "V": data, "DO": data, "ALPHA": rows, "TAU": rows, "NORM": rows,
                                 "DELTA": rows, "DQ": data, "DALPHA": rows, **sizes, **constexpr}, tile),
    ]
    for kernel, signature, constexprs in kernels:
        assert list(signature) == list(kernel.arg_names), kernel.__name__
        compiled = compile_for_sm90(kernel, signature, constexprs, NUM_STAGES)
        assert compiled.metadata.shared <= 99 * 1024, (kernel.__name__, compiled.metadata.shared)
