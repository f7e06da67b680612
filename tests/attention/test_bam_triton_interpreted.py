"""BAM's Triton kernel (modules/attention/triton_noisy_softmax.py, path `triton-noisy-softmax`) run on CPU by the Triton
interpreter (TRITON_INTERPRET=1), in float32:
- the kernel against a reference that rebuilds its noise as an explicit bias (the kernel's own draw written out) and
  forms the weights: the output, both rows' logsumexps, the squared centred scores and the gradients of q, k and v
  under all three outputs, so the backward regenerates the forward's noise; with key padding, lengths off the tiles
  and Lq != Lk;
- the variant with its noise switched off (k, 1/sigma huge) against the eager path: output, KL and every gradient
  (the prior MLP's too), on a padded batch;
- the variant with noise: the KL as the current fused (SDPA) path computes it, `sample_tv` as the kernel's draw gives
  it, and close to what the SDPA path's draw gives;
- the noise's statistics (Weibull log-noise and lognormal moments) and the independence of the planes' streams;
- under bf16 autocast, the kernel in bf16 as SDPA would run.
Where the path is (not) taken needs no interpreter and runs here.

The interpreter reads TRITON_INTERPRET when a kernel is defined, so each interpreted check runs in a fresh process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]

KERNEL_CHECK = r"""
import json, sys
import torch
from modules.attention import triton_noisy_softmax as T

found = {}
for case, (batch, heads, num_queries, num_keys, dim, per_head) in enumerate(
        [(2, 2, 40, 40, 16, False), (2, 3, 24, 37, 8, True)]):
    g = torch.Generator().manual_seed(case)
    q = torch.randn(batch, heads, num_queries, dim, generator=g).requires_grad_()
    k, v = (torch.randn(batch, heads, num_keys, dim, generator=g).requires_grad_() for _ in range(2))
    mask = torch.ones(batch, heads if per_head else 1, 1, num_keys, dtype=torch.bool)
    mask[1, ..., num_keys - 9:] = False
    if per_head:
        mask[0, 1, ..., :5] = False
    seed = torch.tensor([987654321 + case])
    scale = 0.35
    for sampler, param in (("weibull", 1 / 3.0), ("lognormal", 0.7)):
        for squares_too in (False, True):
            kbar = T.mean_key(k, mask)
            out, lse, squares, lse_noisy, gap = T.noisy_softmax_attention(q, k, v, kbar, mask, seed, scale, sampler,
                                                                          param, squares_too, True)
            spread = T.row_spread(q, k, kbar, mask, seed, lse, gap, scale, sampler, param)
            again = T.noisy_softmax_attention(q, k, v, kbar, mask, seed, scale, sampler, param, squares_too)[0]
            other = T.noisy_softmax_attention(q, k, v, kbar, mask, seed + 1, scale, sampler, param, squares_too)[0]
            upstream, g_lse, g_squares = (torch.randn(t.shape, generator=g) for t in (out, lse, lse))
            loss = (out * upstream).sum() + (lse * g_lse).sum() + ((squares * g_squares).sum() if squares_too else 0)
            grads = torch.autograd.grad(loss, (q, k, v))
            # the reference: the kernel's noise written out, the weights formed, kbar with its gradient
            noise = T.drawn_noise(seed, (batch, heads, num_queries, num_keys), sampler, param)
            valid = mask.to(k.dtype)
            key_mean = (valid.transpose(-1, -2) * k).sum(-2, keepdim=True) / valid.sum(-1, keepdim=True)
            scores = (q @ (k - key_mean).transpose(-1, -2)) * scale
            ref_squares = scores.masked_fill(~mask, 0.0).square().sum(-1)
            scores = scores.masked_fill(~mask, float("-inf"))
            ref = torch.softmax(scores + noise, -1) @ v
            ref_lse = torch.logsumexp(scores, -1)
            ref_loss = ((ref * upstream).sum() + (ref_lse * g_lse).sum()
                        + ((ref_squares * g_squares).sum() if squares_too else 0))
            ref_grads = torch.autograd.grad(ref_loss, (q, k, v))
            relative = lambda a, b: float((a - b).abs().max() / b.abs().max())
            ref_lse_noisy = torch.logsumexp(scores + noise, -1)
            ref_spread = (torch.softmax(scores + noise, -1) - torch.softmax(scores, -1)).abs().sum(-1)
            found[f"{case}-{sampler}-{squares_too}"] = {
                "out": relative(out, ref), "lse": relative(lse, ref_lse), "lse_noisy": relative(lse_noisy, ref_lse_noisy),
                "gap": relative(gap, ref_lse_noisy - ref_lse), "spread": relative(spread, ref_spread),
                "squares": relative(squares, ref_squares) if squares_too else 0.0,
                "grads": [relative(a, b) for a, b in zip(grads, ref_grads)],
                "same_seed": float((again - out).abs().max()), "other_seed": float((other - out).abs().max()),
                "noise": float(noise.abs().max())}
print(json.dumps(found))
"""

VARIANT_CHECK = r"""
import json, sys
import torch
from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention import triton_noisy_softmax as T
from modules.attention.kernel import mechanism_diagnostics
from modules.attention.variants.bam import fused_on_cpu
from modules.device_policy import triton_kernels_anywhere

SITE = AttentionSite("text", "self", sequence=True)
HEADS, DIM, LENGTH = 3, 16, 40
# the GAT recipe's priors: with the GLUE ones (alpha = beta = 1e-4, sigma0 = 100) the KL hardly reads the weights
PRIORS = {"bam-weibull": {"alpha": 1.0, "beta": 1.0}, "bam-lognormal": {"prior_sigma": 1.0}}
QUIET = {"bam-weibull": {"k": 1e8, **PRIORS["bam-weibull"]}, "bam-lognormal": {"sigma": 1e-8, **PRIORS["bam-lognormal"]}}
NOISY = {"bam-weibull": {"k": 3.0, **PRIORS["bam-weibull"]}, "bam-lognormal": {"sigma": 0.7, **PRIORS["bam-lognormal"]}}
SCALE = DIM ** -0.5
found = {}


def setup(name, prior, noise):
    torch.manual_seed(0)
    kernel = build_attention({"name": name, "prior": prior, **noise[name]}, num_heads=HEADS, head_dim=DIM,
                             site=SITE).train()
    with torch.no_grad():
        for p in kernel.parameters():
            p.add_(0.3 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, LENGTH, DIM, generator=g) for _ in range(3))
    valid = torch.ones(2, LENGTH, dtype=torch.bool)
    valid[1, LENGTH - 9:] = False
    return kernel, q, k, v, DenseGroups.from_key_padding(valid, query_valid=valid), valid


def call(kernel, q, k, v, groups, valid, need_weights):
    kernel.noise_generator = torch.Generator().manual_seed(7)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    kernel.zero_grad(set_to_none=True)
    with mechanism_diagnostics(True):
        out, result = kernel(*inputs, groups, scale=SCALE, need_weights=need_weights)
    rows = valid[:, None, :, None].to(out.dtype)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * upstream * rows).sum().add(result.aux_losses["kl"] * 0.37).backward()
    grads = [t.grad for t in inputs] + [p.grad for p in kernel.parameters() if p.grad is not None]
    return {"out": out.detach() * rows, "kl": result.aux_losses["kl"].detach(),
            "tv": result.diagnostics.get("sample_tv"), "grads": grads, "path": kernel.last_path}


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


for name in ("bam-weibull", "bam-lognormal"):
    for prior in ("fixed", "contextual"):
        # (1) the noise switched off: the eager path's output, KL and gradients
        kernel, q, k, v, groups, valid = setup(name, prior, QUIET)
        eager = call(kernel, q, k, v, groups, valid, True)
        with triton_kernels_anywhere():
            fused = call(kernel, q, k, v, groups, valid, False)
        largest = max(float(g.abs().max()) for g in eager["grads"])
        found[f"quiet-{name}-{prior}"] = {
            "path": fused["path"], "out": relative(fused["out"], eager["out"]),
            "kl": abs(float(fused["kl"] - eager["kl"])) / abs(float(eager["kl"])),
            "grads": [float((a - b).abs().max()) / largest for a, b in zip(fused["grads"], eager["grads"])]}
        if prior == "contextual":  # the noise reaches neither the KL nor sample_tv through the prior
            continue
        # (5) with noise: the KL of the SDPA path, sample_tv of the kernel's own draw
        kernel, q, k, v, groups, valid = setup(name, prior, NOISY)
        with fused_on_cpu():
            sdpa = call(kernel, q, k, v, groups, valid, False)
        with triton_kernels_anywhere():
            fused = call(kernel, q, k, v, groups, valid, False)
        seed = torch.randint(0, 2**31, (1,), generator=torch.Generator().manual_seed(7))
        param = 1 / NOISY[name]["k"] if name == "bam-weibull" else NOISY[name]["sigma"]
        noise = T.drawn_noise(seed, (2, HEADS, LENGTH, LENGTH), name.split("-")[1], param)
        scores = ((q @ k.transpose(-1, -2)) * SCALE).masked_fill(~groups.mask, float("-inf"))
        spread = (torch.softmax(scores + noise, -1) - torch.softmax(scores, -1)).abs().sum(-1)
        rows = valid[:, None, :].expand(spread.shape)
        tv = 0.5 * spread[rows].mean()
        found[f"noisy-{name}-{prior}"] = {
            "path": fused["path"], "sdpa_path": sdpa["path"], "kl": abs(float(fused["kl"] - sdpa["kl"])) / abs(float(sdpa["kl"])),
            "tv": float(fused["tv"]), "tv_reference": float(tv), "tv_sdpa": float(sdpa["tv"])}
# sample_tv at the GLUE recipe's noise (sigma = 1e-4, k = 10): a draw moves ~1e-4 of the mass, so float32 keeps it only
# where no two nearly equal weights are subtracted; against float64 with the kernel's own draw
for name, param in (("bam-weibull", 0.1), ("bam-lognormal", 1e-4)):
    kernel = build_attention({"name": name}, num_heads=2, head_dim=16, site=SITE).train()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 96, 16, generator=g) * 2 for _ in range(3))
    kernel.noise_generator = torch.Generator().manual_seed(5)
    with triton_kernels_anywhere(), torch.no_grad(), mechanism_diagnostics(True):
        _, result = kernel(q, k, v, DenseGroups(), need_weights=False)
    seed = torch.randint(0, 2**31, (1,), generator=torch.Generator().manual_seed(5))
    noise = T.drawn_noise(seed, (2, 2, 96, 96), name.split("-")[1], param).double()
    logits = (q.double() @ k.double().transpose(-1, -2)) * 16 ** -0.5
    truth = (0.5 * (torch.softmax(logits + noise, -1) - torch.softmax(logits, -1)).abs().sum(-1)).mean().item()
    found[f"glue-{name}"] = {"path": kernel.last_path, "tv": float(result.diagnostics["sample_tv"]), "truth": truth}
print(json.dumps(found))
"""

STATS_CHECK = r"""
import json, math
import torch
from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention import triton_noisy_softmax as T
from modules.device_policy import triton_kernels_anywhere


def autocast_check():
    # under bf16 autocast the kernel takes q, k, v in bf16, as SDPA would, and returns bf16; noise off, against eager fp32
    kernel = build_attention({"name": "bam-weibull", "k": 1e8}, num_heads=2, head_dim=16,
                             site=AttentionSite("text", "self", sequence=True)).train()
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(3))
    with triton_kernels_anywhere(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = kernel(q, k, v, DenseGroups(), need_weights=False)
    path = kernel.last_path
    exact, _ = kernel(q, k, v, DenseGroups(), need_weights=True)
    return {"path": path, "dtype": str(out.dtype), "error": float((out.float() - exact).abs().max() / exact.abs().max())}


seed = torch.tensor([20201])
shape = (2, 2, 64, 64)  # 16384 draws, 4096 a plane
weibull = T.drawn_noise(seed, shape, "weibull", 1 / 3.0)
lognormal = T.drawn_noise(seed, shape, "lognormal", 0.7)
exponential = torch.exp(3.0 * weibull.double())  # E = exp(k n) ~ Exp(1)
normal = lognormal.double() / 0.7
planes = lognormal.reshape(4, -1).double()
print(json.dumps({
    "weibull_mean": float(weibull.double().mean()), "weibull_std": float(weibull.double().std()),
    "exp_mean": float(exponential.mean()), "exp_above_1": float((exponential > 1).double().mean()),
    "normal_mean": float(normal.mean()), "normal_std": float(normal.std()),
    "normal_kurtosis": float(((normal - normal.mean()) ** 4).mean() / normal.var() ** 2),
    "plane_correlation": float(torch.corrcoef(planes).sub(torch.eye(4, dtype=torch.float64)).abs().max()),
    "finite": bool(torch.isfinite(weibull).all() and torch.isfinite(lognormal).all()),
    "autocast": autocast_check()}))
"""


def interpreted(script: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_kernel_equals_softmax_attention_with_its_noise_as_an_explicit_bias_forward_and_backward():
    """(2), (3): the forward against the kernel's own draw written out as a bias, and the gradients of the output and of
    both per-row sums, so the backward regenerates the forward's noise; the same seed draws the same noise, another
    seed other noise."""
    for case, found in interpreted(KERNEL_CHECK).items():
        assert found["noise"] > 0.5, (case, found)  # the noise is there to be regenerated
        assert max(found["out"], found["lse"], found["lse_noisy"], found["squares"]) <= 1e-5, (case, found)
        assert max(found["gap"], found["spread"]) <= 1e-5, (case, found)
        assert max(found["grads"]) <= 1e-5, (case, found)
        assert found["same_seed"] == 0.0 and found["other_seed"] > 1e-3, (case, found)


def test_the_variant_on_the_kernel_equals_eager_without_noise_and_the_sdpa_path_s_kl_with_it():
    """(1): noise off, the eager path's output, KL and gradients (q, k, v, the prior MLP's) to fp32's level; (5) with
    noise, the SDPA path's KL, and `sample_tv` as the kernel's draw gives it (and near the SDPA path's draw)."""
    found = interpreted(VARIANT_CHECK)
    for case, values in found.items():
        assert values["path"] == "triton-noisy-softmax", (case, values)
        if case.startswith("glue"):
            assert values["tv"] == pytest.approx(values["truth"], rel=1e-4), (case, values)
        elif case.startswith("quiet"):
            assert values["out"] <= 1e-5 and values["kl"] <= 1e-5, (case, values)
            # relative to the largest gradient: the prior MLP's last bias has exact gradient 0 (rounding either way)
            assert max(values["grads"]) <= 1e-5, (case, values)
        else:
            assert values["sdpa_path"] == "sdpa", (case, values)
            assert values["kl"] <= 1e-5, (case, values)
            assert values["tv"] == pytest.approx(values["tv_reference"], rel=1e-4), (case, values)
            assert values["tv"] == pytest.approx(values["tv_sdpa"], rel=0.15), (case, values)


def test_the_kernel_s_noise_has_the_samplers_distributions():
    """(4): Weibull's log-noise log(E)/k with E ~ Exp(1) (E's mean and P(E > 1) = 1/e; log E's mean -γ and standard
    deviation π/√6), lognormal's σ ε with ε standard normal; the (sample, head) planes' streams uncorrelated."""
    found = interpreted(STATS_CHECK)
    draws = 16384
    assert found["finite"]
    gamma = 0.5772156649015329
    assert abs(found["exp_mean"] - 1.0) <= 5 / math.sqrt(draws), found
    assert abs(found["exp_above_1"] - math.exp(-1)) <= 5 * math.sqrt(0.25 / draws), found
    assert abs(found["weibull_mean"] + gamma / 3) <= 5 * (math.pi / math.sqrt(6) / 3) / math.sqrt(draws), found
    assert found["weibull_std"] == pytest.approx(math.pi / math.sqrt(6) / 3, rel=0.05), found
    assert abs(found["normal_mean"]) <= 5 / math.sqrt(draws), found
    assert found["normal_std"] == pytest.approx(1.0, rel=0.03), found
    assert found["normal_kurtosis"] == pytest.approx(3.0, abs=0.3), found
    assert found["plane_correlation"] <= 5 / math.sqrt(draws / 4), found
    autocast = found["autocast"]  # bf16 inputs and output: within a few of bf16's steps (2^-8) of the fp32 result
    assert autocast["path"] == "triton-noisy-softmax" and autocast["dtype"] == "torch.bfloat16", autocast
    assert autocast["error"] <= 2e-2, autocast


# ---- where the path is taken (no kernel runs) -----------------------------------------------------------------------

def _kernel_and_inputs(name="bam-weibull"):
    from modules.attention import AttentionSite, DenseGroups, build_attention

    kernel = build_attention({"name": name, "k": 3.0} if name == "bam-weibull" else {"name": name, "sigma": 0.7},
                             num_heads=2, head_dim=8, site=AttentionSite("text", "self", sequence=True))
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    return kernel, q, k, v, DenseGroups.from_key_padding(valid, query_valid=valid)


@pytest.mark.parametrize("name", ["bam-weibull", "bam-lognormal"])
def test_the_kernel_is_offered_in_training_without_dropout_where_triton_kernels_run(name):
    from modules.attention.backends import offered_paths
    from modules.device_policy import triton_kernels_anywhere

    kernel, q, k, _, groups = _kernel_and_inputs(name)
    kernel.train()
    assert kernel.fused_attention(q, k, groups, scale=0.3) is None  # CPU, outside: the eager path as it was
    with triton_kernels_anywhere():
        fused = kernel.fused_attention(q, k, groups, scale=0.3)
    assert fused.library.path == "triton-noisy-softmax"
    assert offered_paths(kernel, fused, groups, q)[0] == "triton-noisy-softmax"


def test_dropout_evaluation_held_noise_and_per_query_masks_keep_their_paths():
    from modules.attention import DenseGroups
    from modules.attention.contract import held_noise
    from modules.attention.variants.bam import fused_on_cpu
    from modules.device_policy import triton_kernels_anywhere

    kernel, q, k, v, groups = _kernel_and_inputs()
    with triton_kernels_anywhere(), fused_on_cpu():
        kernel.train()
        kernel(q, k, v, groups, dropout_p=0.1, need_weights=False)
        assert kernel.last_path == "sdpa"  # SDPA's form, which draws the dropout mask too
        kernel.eval()
        kernel(q, k, v, groups, need_weights=False)
        assert kernel.last_path == "sdpa"  # the mean weights
        kernel.train()
        causal = DenseGroups.from_key_padding(torch.ones(2, 6, dtype=torch.bool), causal=True)
        kernel(q, k, v, causal, need_weights=False)
        assert kernel.last_path == "eager"
        kernel.draw_noise = held_noise  # a check's held noise: the kernel cannot draw it
        try:
            kernel(q, k, v, groups, need_weights=False)
            assert kernel.last_path == "sdpa"
        finally:
            del kernel.draw_noise
