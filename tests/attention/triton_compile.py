"""Compiling a Triton kernel for a GPU without one (sm_90's target): what the kernels' compile tests share."""

from __future__ import annotations

import pytest


def compile_for_sm90(kernel, signature: dict, constexprs: dict, num_stages: int):
    """`kernel` compiled for sm_90 with these argument types and constexpr values (the test is skipped where this
    Triton build has no CUDA backend tools)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    assert set(signature) == set(kernel.arg_names), kernel.__name__
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(name),): value for name, value in constexprs.items()})
    try:
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_stages": num_stages})
    except (RuntimeError, FileNotFoundError) as exc:  # no CUDA backend tools in this Triton build
        if "ptxas" in str(exc) or "backend" in str(exc).lower():
            pytest.skip(f"Triton cannot compile for CUDA here: {exc}")
        raise
