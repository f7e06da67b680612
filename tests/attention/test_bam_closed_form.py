"""BAM's CUDA path without L x L tensors: the KL in closed form from the rows' logsumexp and the keys' moments
(bam.py `_PairSums`, `_RowLogSumExp`) against the sums over the formed weights (`mean_kl`, what the eager path
computes), at logits spread over many nats, padded, in query blocks; the logsumexp's SDPA backward against
autograd's; the noisy SDPA in query blocks against the whole call under noise held equal; and the page's counts
(peak live, saved bytes, syncs) at the page's shape."""

from __future__ import annotations

import pytest
import torch

from modules.attention import AttentionSite, DenseGroups, build_attention
from modules.attention.contract import held_noise
from modules.attention.kernel import query_blocks
from modules.attention.variants import bam
from modules.attention.variants.bam import BayesianAttention, _RowLogSumExp, fused_on_cpu

SITE = AttentionSite("text", "self", sequence=True)
CASES = [(name, prior) for name in ("bam-weibull", "bam-lognormal") for prior in ("fixed", "contextual")]
# the graph recipe's settings (k = 1000, alpha = beta = 1, sigma = sigma0 = 1), where the KL's log terms weigh most
GAT_LIKE = {"bam-weibull": {"k": 1000.0, "alpha": 1.0, "beta": 1.0}, "bam-lognormal": {"sigma": 1.0, "prior_sigma": 1.0}}


def problem(dtype, *, spread: float, padded: bool, heads=3, dim=8, length=40):
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, heads, length, dim, generator=g, dtype=dtype) for _ in range(2))
    k = k + 3.0  # keys far from 0: a KL summed without centring them would cancel large terms
    q = q * spread
    if not padded:
        return q, k, DenseGroups()
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, length - 13:] = False
    return q, k, DenseGroups.from_key_padding(valid, query_valid=valid)


def eager_kl(kernel, q, k, groups, scale):
    """`mean_kl` over the formed weights, as the eager path computes it."""
    mean, log_mean = groups.softmax_and_log(kernel.score(q, k, groups, scale=scale))
    prior = kernel.prior_over_keys(k, groups) if kernel.key_prior is not None else None
    return kernel.mean_kl(mean, log_mean, prior, groups)


def closed_kl(kernel, q, k, groups, scale, rows):
    lse = _RowLogSumExp.apply(q, k, groups.mask, scale, rows)
    prior = kernel.prior_over_keys(k, groups) if kernel.key_prior is not None else None
    return kernel._closed_kl(q, k, lse, prior, groups, scale)


@pytest.mark.parametrize("name, prior", CASES)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("spread", [1.0, 30.0])
def test_the_closed_form_kl_and_its_gradients_equal_the_sums_over_the_weights(name, prior, padded, spread):
    """float64: equal to rounding, logits spread over a few nats or over hundreds, whole or in blocks of 7 rows."""
    torch.manual_seed(0)
    kernel = build_attention({"name": name, "prior": prior, **GAT_LIKE[name]}, num_heads=3, head_dim=8, site=SITE).double()
    q, k, groups = problem(torch.float64, spread=spread, padded=padded)
    scale = 8 ** -0.5

    def value_and_grads(kl_of):
        leaves = [t.clone().requires_grad_() for t in (q, k)]
        kernel.zero_grad(set_to_none=True)
        kl = kl_of(*leaves)
        kl.backward()
        return kl.detach(), [t.grad for t in leaves] + [p.grad for p in kernel.parameters() if p.grad is not None]

    want, want_grads = value_and_grads(lambda q_, k_: eager_kl(kernel, q_, k_, groups, scale))
    for rows in (40, 7):
        got, got_grads = value_and_grads(lambda q_, k_: closed_kl(kernel, q_, k_, groups, scale, rows))
        torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
        assert len(got_grads) == len(want_grads)
        largest = max(g.abs().max().item() for g in want_grads)
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10 * largest)


@pytest.mark.parametrize("name, prior", CASES)
def test_the_closed_form_kl_in_float32_is_as_close_to_float64_as_the_eager_sums(name, prior):
    """Centring the keys keeps the float32 closed form within the eager float32 KL's own error of the float64 value
    (or 1e-5 relative), with the keys' mean far from 0."""
    torch.manual_seed(0)
    kernel = build_attention({"name": name, "prior": prior, **GAT_LIKE[name]}, num_heads=3, head_dim=8, site=SITE)
    q, k, groups = problem(torch.float32, spread=4.0, padded=True)
    scale = 8 ** -0.5
    with torch.no_grad():
        truth = eager_kl(kernel.double(), q.double(), k.double(), groups, scale).item()
        kernel.float()
        eager32 = eager_kl(kernel, q, k, groups, scale).item()
        closed32 = closed_kl(kernel, q, k, groups, scale, 16).item()
    assert abs(closed32 - truth) <= max(2 * abs(eager32 - truth), 1e-5 * abs(truth)), (closed32, eager32, truth)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunks", [4, 2, 3])
def test_the_row_logsumexp_gradient_through_sdpa_is_autograd_s(padded, chunks, monkeypatch):
    """Whole (B = 2, H = 3 under 4 chunks), in chunks of the batch (2) and of the heads (3, fewer samples than that)."""
    monkeypatch.setattr(bam, "LSE_BACKWARD_CHUNKS", chunks)
    q, k, groups = problem(torch.float64, spread=3.0, padded=padded)
    scale = 0.3
    g = torch.randn(q.shape[:-1], generator=torch.Generator().manual_seed(2), dtype=q.dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k)]
    (_RowLogSumExp.apply(*leaves, groups.mask, scale, 9) * g).sum().backward()
    ref = [t.clone().requires_grad_() for t in (q, k)]
    logits = torch.matmul(ref[0], ref[1].transpose(-1, -2)) * scale
    if groups.mask is not None:
        logits = logits.masked_fill(~groups.mask, float("-inf"))
    lse = logits.logsumexp(-1)
    lse = lse.masked_fill(lse == float("-inf"), 0.0)
    (lse * g).sum().backward()
    for a, b in zip(leaves, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["bam-weibull", "bam-lognormal"])
def test_noisy_query_blocks_equal_the_whole_call_under_held_noise(name):
    """Held noise (a function of the weights it perturbs) is the same whole or in blocks: the blocked noisy SDPA, its
    backward's redrawn noise and `sample_tv` measured block by block equal the whole call's."""
    torch.manual_seed(0)
    noisy = {"bam-weibull": {"k": 3.0}, "bam-lognormal": {"sigma": 0.7}}[name]
    kernel = build_attention({"name": name, "prior": "contextual", **noisy}, num_heads=3, head_dim=8, site=SITE).double().train()
    kernel.draw_noise = held_noise
    q, k, groups = problem(torch.float64, spread=1.0, padded=True)
    v = torch.randn_like(q)
    rows = groups.query_valid[:, None, :, None].to(q.dtype)

    def run(block_rows):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with fused_on_cpu(), query_blocks(block_rows):
            out, result = kernel(*leaves, groups, need_weights=False)
        assert kernel.last_path == "sdpa"
        ((out * rows).square().sum() + result.aux_losses["kl"]).backward()
        return [out * rows, result.aux_losses["kl"], result.diagnostics["sample_tv"]] + [t.grad for t in leaves]

    # the held noise amplifies the weights' rounding (a block's logits round apart from the whole call's) ~1e5 times
    for a, b in zip(run(7), run(None)):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", ["bam-weibull", "bam-lognormal"])
@pytest.mark.parametrize("samples, rows", [(1, None), (1, 7)])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_noisy_blocks_of_samples_equal_the_whole_call_under_held_noise(name, samples, rows, dropout, monkeypatch):
    """Blocks of whole samples (as the CUDA path sizes them at the page's shapes) or of one sample's rows: the same
    output, KL, `sample_tv` and gradients as one block under held noise, padded (sample 1's mask and query rows);
    with attention dropout, the whole bias drawn block by block (SDPA's dropout mask from torch's seeded stream)."""
    torch.manual_seed(0)
    noisy = {"bam-weibull": {"k": 3.0}, "bam-lognormal": {"sigma": 0.7}}[name]
    kernel = build_attention({"name": name, "prior": "contextual", **noisy}, num_heads=3, head_dim=8, site=SITE).double().train()
    kernel.draw_noise = held_noise
    q, k, groups = problem(torch.float64, spread=1.0, padded=True)
    v = torch.randn_like(q)
    valid_rows = groups.query_valid[:, None, :, None].to(q.dtype)

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(11)
        with fused_on_cpu():
            out, result = kernel(*leaves, groups, need_weights=False, dropout_p=dropout)
        assert kernel.last_path == "sdpa"
        ((out * valid_rows).square().sum() + result.aux_losses["kl"]).backward()
        return [out * valid_rows, result.aux_losses["kl"], result.diagnostics["sample_tv"]] + [t.grad for t in leaves]

    whole = run()
    blocks = []
    monkeypatch.setattr(BayesianAttention, "_fused_blocks",
                        lambda self, q, k, whole_rows: blocks.append(1) or (samples, rows or whole_rows))
    for a, b in zip(run(), whole):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    assert blocks


@pytest.mark.parametrize("name", ["bam-weibull", "bam-lognormal"])
@pytest.mark.parametrize("length", [512, 2048])
@pytest.mark.parametrize("form", ["triton", "sdpa"])
def test_the_page_s_counts_keep_one_block_of_noise_and_no_host_sync(monkeypatch, name, length, form):
    """The GPU cost page's shapes (B = 32, H = 12, L = 512 and 2048, d = 64; fake tensors): peak live within 1.5 x
    SDPA softmax's, saved for backward within 1.5 x FlashAttention's, no host sync. Where Triton is installed the page
    takes the kernel that draws the noise inside (`triton-noisy-softmax`): then bytes touched within 2 x SDPA's too.
    The SDPA form (where Triton is missing, and under attention dropout) is counted with the kernel taken away."""
    from harness.studies import gpu_cost
    from modules.attention.variants import bam
    from modules.device_policy import triton_installed

    if form == "sdpa":
        monkeypatch.setattr(bam, "_noisy_kernel_module", lambda: None)
    base, _, _ = gpu_cost.count_step("softmax", length, 32)
    counter, saved, path = gpu_cost.count_step(name, length, 32)
    row = gpu_cost.Count(name, length, 32)
    if form == "triton" and triton_installed():
        assert path == "triton-noisy-softmax"
        assert counter.bytes <= 2.0 * base.bytes, counter.bytes / base.bytes
    else:
        assert path == "sdpa"
    assert counter.peak <= 1.5 * base.peak, counter.peak / base.peak
    assert saved <= 1.5 * row.flash_ideal, saved / row.flash_ideal
    assert sum(counter.syncs.values()) == 0, counter.syncs


@pytest.mark.parametrize("name", ["bam-weibull", "bam-lognormal"])
def test_float32_sample_tv_keeps_the_eager_path_s_precision_at_the_glue_noise(name):
    """At the GLUE recipe's noise (Lognormal sigma = 1e-4: a draw moves ~3e-5 of the mass) float32 sample_tv is a
    small difference of large sums; the fused path's form must stay as close to the float64 value (the same draw)
    as the eager path's: a form that subtracts sums of the weights (sum P max(e, Z) - Z) measured 1e-3 off here."""
    torch.manual_seed(0)
    kernel = build_attention({"name": name}, num_heads=4, head_dim=16, site=SITE).train()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 200, 16, generator=g) * 2 for _ in range(3))
    values = {}
    for fused in (False, True):
        kernel.noise_generator = torch.Generator().manual_seed(5)
        with fused_on_cpu(fused), torch.no_grad():
            _, result = kernel(q, k, v, DenseGroups(), need_weights=not fused)
        values[fused] = result.diagnostics["sample_tv"].double().item()
    if name == "bam-lognormal":  # the draw in float64: the same standard normals, scaled
        noise = 1e-4 * torch.randn((2, 4, 200, 200), generator=torch.Generator().manual_seed(5)).double()
    else:
        u = torch.rand((2, 4, 200, 200), generator=torch.Generator().manual_seed(5)).double()
        noise = u.clamp_min(torch.finfo(torch.float32).tiny).log().neg().log() / 10.0
    logits = (q.double() @ k.double().transpose(-1, -2)) * 16 ** -0.5
    truth = (0.5 * (torch.softmax(logits + noise, -1) - torch.softmax(logits, -1)).abs().sum(-1)).mean().item()
    assert abs(values[True] / truth - 1) <= max(3 * abs(values[False] / truth - 1), 1e-4), (values, truth)
