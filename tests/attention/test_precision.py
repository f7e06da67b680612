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

from modules.attention import build_attention, list_attentions
from modules.attention import contract
from modules.attention.contract import BF16_DIM as DIM, BF16_HEADS as HEADS, FLOOR, bf16_cotangent, forward_backward
from modules.attention.contract import bf16_problem as problem

EXTRA_CONFIGS = {  # iterative paths that the defaults do not take
    "gmm": [{"gamma": 0.5, "eta": 1.0, "adapt_steps": 2, "adapt_in_training": True}, {"beta": 0.5, "iterations": 2}],
}
CASES = [(name, {}) for name in list_attentions()] + [
    (name, config) for name, configs in EXTRA_CONFIGS.items() if name in list_attentions() for config in configs
]
IDS = [f"{n}{c or ''}" for n, c in CASES]


@pytest.fixture(scope="module")
def softmax_errors():
    return contract.softmax_bf16_errors()


@pytest.mark.parametrize("layout", ["dense", "segment"])
@pytest.mark.parametrize("name, config", CASES, ids=IDS)
def test_bf16_autocast_errors_are_comparable_to_softmax(name, config, layout, softmax_errors):
    contract.check_bf16_autocast(name, config, layouts=(layout,), softmax_errors=softmax_errors)


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
    cotangent = bf16_cotangent(inputs)
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
