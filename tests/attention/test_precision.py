"""Mixed precision: every registered variant runs forward and backward under bf16 autocast with errors
comparable to softmax's (issue #18). Parametrised over the registry, so a plugin is covered untouched.

CPU autocast stands in for CUDA's. Where their rules differ (CUDA autocast keeps exp/log/cumsum in fp32 but
casts cholesky_solve's right-hand side and not its factor; CPU autocast leaves most ops in their input dtype),
the kernel must not depend on either: it pins its sensitive part to float32 itself (`full_precision`). The
second input mode, q/k/v already in bf16 (what a bf16 linear layer hands the kernel), is the case where
autocast rules alone would leave a kernel's internals in bf16.

Errors are measured against float64 on the inputs the kernel actually received: the original inputs for
float32 inputs under autocast, the bf16-rounded inputs for bf16 inputs. So the test measures the kernel's own
rounding, not how sensitive the function is to its inputs (sparse maps and EM are, and that is math, not a
precision bug). The logits are peaky (std ~3), where bf16 Newton tolerances, Hessians and samplers break."""

from __future__ import annotations

import copy

import pytest
import torch

from modules.attention import AttentionKernel, AttentionSite, build_attention, list_attentions

from .conftest import make_problem

HEADS, DIM, LENGTH = 2, 8, 12
PEAKINESS = 3.0  # q and k scaled so the logits have std ~3
EXTRA_CONFIGS = {  # iterative paths that the defaults do not take
    "gmm": [{"gamma": 0.5, "eta": 1.0, "adapt_steps": 2, "adapt_in_training": True}, {"beta": 0.5, "iterations": 2}],
}
CASES = [(name, {}) for name in list_attentions()] + [
    (name, config) for name, configs in EXTRA_CONFIGS.items() if name in list_attentions() for config in configs
]
IDS = [f"{n}{c or ''}" for n, c in CASES]
# Allowed relative error: a small multiple of softmax's on the same problem, plus a floor of a bf16 ulp or two
# (softmax's own error can be near 0 where nothing in its path rounds, e.g. segment scores from fp32 inputs).
RELATIVE_TO_SOFTMAX = 2.0
FLOOR = 8e-3
AUX_TOLERANCE = 2e-2


def problem(layout: str):
    p = make_problem(batch=2, heads=HEADS, length=LENGTH, dim=DIM)
    q, k, v = p.q * PEAKINESS, p.k * PEAKINESS, p.v
    if layout == "dense":
        return (q, k, v), p.dense, AttentionSite("text", "self", sequence=True)
    return (p.nodes(q), p.nodes(k), p.nodes(v)), p.segment, AttentionSite("graph")


def fixed_noise(kernel: AttentionKernel) -> None:
    """The same float64 noise for every precision, cast to the dtype the kernel asks it in: a kernel that
    samples in bf16 gets bf16 noise (8 bits), which is the failure this catches."""
    masters: dict[tuple, torch.Tensor] = {}

    def draw_noise(like: torch.Tensor, distribution: str = "uniform") -> torch.Tensor:
        key = (distribution, tuple(like.shape))
        if key not in masters:
            g = torch.Generator().manual_seed(5)
            draw = torch.rand if distribution == "uniform" else torch.randn
            masters[key] = draw(like.shape, generator=g, dtype=torch.float64)
        return masters[key].to(like.dtype)

    kernel.draw_noise = draw_noise


def forward_backward(kernel, inputs, groups, cotangent, autocast: bool):
    """Output, input gradients and aux losses (all float64) of sum(out * cotangent) + sum(aux)."""
    fixed_noise(kernel)
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, result = kernel(*inputs, groups)
        loss = (out.double() * cotangent).sum() + sum(a.double() for a in result.aux_losses.values())
    loss.backward()
    tensors = [out.detach().double()] + [x.grad.double() for x in inputs]
    return tensors, {key: a.detach().double() for key, a in result.aux_losses.items()}


def relative_errors(name: str, config: dict, layout: str, train: bool):
    """Per input mode: the largest relative error over output and input gradients, and the aux losses'."""
    inputs, groups, site = problem(layout)
    torch.manual_seed(0)
    kernel = build_attention({"name": name, **config}, num_heads=HEADS, head_dim=DIM, site=site).train(train)
    reference_kernel = copy.deepcopy(kernel).double()
    cotangent = torch.randn(inputs[0].shape[:-1] + (inputs[2].shape[-1],), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    errors = {}
    for mode in ("fp32-inputs", "bf16-inputs"):
        given = [x.float() if mode == "fp32-inputs" else x.bfloat16() for x in inputs]
        expected, expected_aux = forward_backward(copy.deepcopy(reference_kernel), [x.double() for x in given], groups, cotangent, False)
        got, got_aux = forward_backward(kernel, given, groups, cotangent, True)
        assert all(torch.isfinite(t).all() for t in got), f"{name} {mode}: non-finite output or gradient"
        worst = max(float((g - e).norm() / e.norm().clamp_min(1e-12)) for g, e in zip(got, expected, strict=True))
        aux = {key: float((got_aux[key] - e).abs() / e.abs().clamp_min(1e-6)) for key, e in expected_aux.items()}
        errors[mode] = (worst, aux)
    return errors


@pytest.fixture(scope="module")
def softmax_errors():
    return {(layout, train): relative_errors("softmax", {}, layout, train) for layout in ("dense", "segment") for train in (False, True)}


@pytest.mark.parametrize("layout", ["dense", "segment"])
@pytest.mark.parametrize("name, config", CASES, ids=IDS)
def test_bf16_autocast_errors_are_comparable_to_softmax(name, config, layout, softmax_errors):
    modes = (False, True) if build_attention({"name": name, **config}, num_heads=HEADS, head_dim=DIM).stochastic else (False,)
    for train in modes:
        errors = relative_errors(name, config, layout, train)
        for mode, (worst, aux) in errors.items():
            baseline = softmax_errors[(layout, train)][mode][0]
            assert worst <= RELATIVE_TO_SOFTMAX * baseline + FLOOR, (
                f"{name}{config or ''} {layout} {'train' if train else 'eval'} {mode}: relative error {worst:.3g} "
                f"vs softmax's {baseline:.3g}"
            )
            for key, error in aux.items():
                assert error <= AUX_TOLERANCE, f"{name} {layout} {mode}: aux loss {key} relative error {error:.3g}"


def test_the_check_catches_a_sampler_left_in_bf16():
    """Without its float32 region (sampling from the bf16 softmax), bam-weibull's error in training mode on
    bf16 inputs is several times softmax's: the test above can fail."""
    from modules.attention.variants import bam

    inputs, groups, site = problem("segment")

    class Bf16Weibull(bam.WeibullAttention):
        def normalize(self, logits, groups, *, q, k):  # the pre-#18 normalize: no float32 region
            return self._normalize(logits, groups, k)

    torch.manual_seed(0)
    reference = build_attention({"name": "bam-weibull"}, num_heads=HEADS, head_dim=DIM, site=site)
    kernel = Bf16Weibull(reference.config, reference.shape)
    kernel.load_state_dict(reference.state_dict())
    kernel.train()
    cotangent = torch.randn(inputs[0].shape[:-1] + (inputs[2].shape[-1],), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    given = [x.bfloat16() for x in inputs]
    expected, _ = forward_backward(copy.deepcopy(kernel).double(), [x.double() for x in given], groups, cotangent, False)
    got, _ = forward_backward(kernel, given, groups, cotangent, True)
    worst = max(float((g - e).norm() / e.norm()) for g, e in zip(got, expected, strict=True))
    assert worst > 3 * FLOOR


def test_fp32_path_is_untouched_by_the_precision_regions():
    """full_precision is a no-op in float32: same tensors, and autocast stays off."""
    from modules.attention import full_precision

    x = torch.randn(3, dtype=torch.float32)
    with full_precision(x, None) as (y, none):
        assert y is x and none is None
        assert not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with full_precision(x.bfloat16()) as (z,):
            assert z.dtype == torch.float32
            assert (z @ z).dtype == torch.float32
