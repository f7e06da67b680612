"""The one way a test compares floats it computes with floats stored in a file (a fixture made on another machine),
under the rule tests/comparison_rules.py enforces.

Why a tolerance at all: float32 matrix products go through the CPU's BLAS (MKL or oneDNN), which picks kernels
by CPU family (AVX-512 on an Intel Xeon, AVX2 on an AMD EPYC) and sums in another order on each. The same code
and weights then differ in the last bits: MiniLM's hidden states (|h| up to ~10) moved by up to 3.3e-6 between the
two families (issue 50), where the fixture was compared at atol=1e-6, rtol=0. `ATEN_CPU_CAPABILITY` does not
change MKL's choice, so no setting makes the bits portable.

The tolerance: float32 reassociation over a reduction of n terms moves a result by about n·eps·(the terms'
magnitude) in the worst case and √n·eps typically; eps = 1.2e-7. A relative 1e-5 covers ~100 eps of drift on
each element, and the absolute term, 1e-5 of the reference's largest magnitude, covers elements that cancel to
near zero (their error is set by the magnitudes summed, not by their own). Both are orders of magnitude below
any change a test means to catch (a wrong mask, a dropped term: ≥ 1e-3 relative)."""

from __future__ import annotations

import torch

FLOAT32_RTOL = 1e-5
"""Relative tolerance for float32 results recomputed on another CPU (about 100 float32 eps)."""
FLOAT32_ATOL_OF_SCALE = 1e-5
"""Absolute tolerance as a fraction of the reference's largest |value|."""


def assert_close_to_stored(actual: torch.Tensor, stored: torch.Tensor, *, what: str,
                           rtol: float = FLOAT32_RTOL, atol_of_scale: float = FLOAT32_ATOL_OF_SCALE) -> None:
    """`actual` equals the stored reference within float reassociation (the module docstring says why these
    tolerances). `what` names the fixture in the failure message."""
    actual, stored = torch.as_tensor(actual), torch.as_tensor(stored)
    if actual.shape != stored.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} against the stored {tuple(stored.shape)}")
    scale = float(stored.detach().abs().max()) if stored.numel() else 0.0
    torch.testing.assert_close(actual, stored.to(actual.dtype), rtol=rtol, atol=atol_of_scale * scale,
                               msg=lambda m: f"{what}: not within float reassociation of the stored reference "
                                             f"(rtol {rtol:g}, atol {atol_of_scale:g} x max|stored| = "
                                             f"{atol_of_scale * scale:.3g}): {m}")
