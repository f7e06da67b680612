"""The align-* regularisers' Triton kernels (modules/attention/triton_alignment.py) compiled for a GPU without one:
Triton's compiler, with an sm_90 target, takes each kernel down to a cubin. What a CPU can check of the GPU build: that
every kernel compiles, forward and backward, at the largest tiles the variants hand it (64 points of 64 features,
networks 16 wide, masks on), and that its shared memory fits an sm_86 card's 99 KB."""

from __future__ import annotations

import pytest

from tests.attention.triton_compile import compile_for_sm90

triton = pytest.importorskip("triton")




def _kernels(data: str):
    from modules.attention import triton_alignment as ta

    points, dim, hidden = ta.MAX_POINTS, ta.MAX_DIM, 16
    weights = ("WP", "BP", "W1", "B1", "W2", "B2")
    navigator = ("NW1", "NB1", "NW2", "NB2")
    masks = {"HAS_QV": True, "HAS_KV": True}
    ot_tiles = {**masks, "BLOCK_N": points, "BLOCK_M": points, "BLOCK_D": dim}
    ot = {"Q": data, "K": data, "QV": "*i1", "KV": "*i1", "U": "*fp64", "V": "*fp64"}
    yield ta._sinkhorn_forward_kernel, {
        **ot, "LOSS": "*fp32", "n": "i32", "m": "i32", "D": "i32", "inv_eps": "fp32", "iterations": "i32",
        "tol": "fp32", **{name: "constexpr" for name in ot_tiles}}, ot_tiles
    yield ta._sinkhorn_backward_kernel, {
        **ot, "GRAD": "*fp32", "DQ": data, "DK": data, "n": "i32", "m": "i32", "D": "i32", "inv_eps": "fp32",
        **{name: "constexpr" for name in ot_tiles}}, ot_tiles
    network = {"BLOCK_P": ta.BLOCK_POINTS, "BLOCK_D": dim, "BLOCK_H": hidden}
    for backward in (False, True):
        tiles = {**masks, "BACKWARD": backward, "STORE_DQ": True, **network}
        yield ta._discriminator_kernel, {
            "Q": data, "K": data, "QV": "*i1", "KV": "*i1", "COUNTS": "*fp32", **{n: "*fp32" for n in weights},
            "LOSS": "*fp32", "GRAD": "*fp32", "DQ": data, "DK": data, **{f"G{n}": "*fp32" for n in weights},
            "n_q": "i32", "n_k": "i32", "D": "i32", "HIDDEN": "i32", **{name: "constexpr" for name in tiles}}, tiles
        tiles = {"BACKWARD": backward, **network}
        yield ta._ct_networks_kernel, {
            "Q": data, "K": data, **{n: "*fp32" for n in weights + navigator}, "FEATURES": "*fp32",
            "GRAD_FEATURES": "*fp32", "DQ": data, "DK": data, **{f"G{n}": "*fp32" for n in weights + navigator},
            "n_q": "i32", "n_k": "i32", "D": "i32", "HIDDEN": "i32", **{name: "constexpr" for name in tiles}}, tiles
        tiles = {**masks, "BACKWARD": backward, "BLOCK_N": points, "BLOCK_M": points, "BLOCK_H": hidden}
        yield ta._ct_coupling_kernel, {
            "FEATURES": "*fp32", "QV": "*i1", "KV": "*i1", "LOSS": "*fp32", "GRAD": "*fp32", "GRAD_FEATURES": "*fp32",
            "clouds": "i32", "n": "i32", "m": "i32", "HIDDEN": "i32", "rho": "fp32",
            **{name: "constexpr" for name in tiles}}, tiles


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_every_kernel_compiles_for_sm90_within_an_sm86_cards_shared_memory(dtype):
    for kernel, signature, constexprs in _kernels(f"*{dtype}"):
        compiled = compile_for_sm90(kernel, signature, constexprs, 2)
        assert compiled.metadata.shared <= 99 * 1024, (kernel.__name__, constexprs, compiled.metadata.shared)
