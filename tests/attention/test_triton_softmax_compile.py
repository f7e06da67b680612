"""The Triton softmax kernel (modules/attention/triton_softmax.py) compiled for a GPU without one: Triton's compiler,
with an sm_90 target, takes each kernel down to a cubin. What a CPU can check of the GPU build: that every kernel
compiles for the dtypes, head dimensions and terms gmm and fenchel hand it, and that its shared memory fits an sm_86
card's 99 KB (the largest tiles: d = 128, float32 inputs)."""

from __future__ import annotations

import pytest

from modules.attention.triton_common import NUM_STAGES
from tests.attention.triton_compile import compile_for_sm90

triton = pytest.importorskip("triton")




@pytest.mark.parametrize("dtype, dim", [("bf16", 64), ("fp32", 128), ("fp16", 16)])
@pytest.mark.parametrize("terms", ["gmm", "fenchel"])
def test_every_kernel_compiles_for_sm90_within_an_sm86_cards_shared_memory(dtype, dim, terms):
    from modules.attention import triton_softmax as ts

    data, rows = f"*{dtype}", "*fp32"
    gmm = terms == "gmm"
    flags = {"NUM_BUCKETS": 1 if gmm else 32, "HAS_C": gmm, "HAS_E": gmm, "HAS_T": not gmm, "HAS_MASK": True,
             "PRECISION": ts._precision(None), "BLOCK_M": ts.BLOCK_M, "BLOCK_N": ts.BLOCK_N,
             "BLOCK_D": ts._block_d(dim)}
    common = {"A": rows, "C": rows, "E": rows, "MASK": "*u8", "mask_stride": "i32", "LOOKUP": "*i32", "TABLE": rows}
    sizes = {"scale": "fp32", "LQ": "i32", "LK": "i32", "D": "i32"}
    kernels = [
        (ts._forward_kernel, {"Q": data, "K": data, "V": data, **common, "OUT": data, "LSE": rows, **sizes}, flags),
        (ts._query_grad_kernel, {"Q": data, "K": data, "V": data, "DO": data, **common, "LSE": rows,
                                 "DELTA": rows, "DQ": data, **sizes}, flags),
        (ts._key_grad_kernel, {"Q": data, "K": data, "V": data, "DO": data, **common, "LSE": rows, "DELTA": rows,
                               "DK": data, "DV": data, "DE": rows, "DC_PART": rows, "DA_PART": rows,
                               "DT_PART": rows, **sizes},
         {**flags, "BUCKETS_PAD": 32, "NEED_DE": gmm, "NEED_DC": gmm, "NEED_DA": True, "NEED_DT": not gmm}),
    ]
    for kernel, signature, constexprs in kernels:
        signature = {**signature, **{name: "constexpr" for name in constexprs}}
        assert sorted(signature) == sorted(kernel.arg_names), (kernel.__name__, set(signature) ^ set(kernel.arg_names))
        signature = {name: signature[name] for name in kernel.arg_names}
        compiled = compile_for_sm90(kernel, signature, constexprs, NUM_STAGES)
        assert compiled.metadata.shared <= 99 * 1024, (kernel.__name__, compiled.metadata.shared)
