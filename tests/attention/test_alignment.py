"""align-gan / align-ot / align-ct: the regulariser's math against independent references (POT's numpy
Sinkhorn and exact OT, scipy distances), gradient reversal, padding, subsampling and the λ = 0 limit."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch
import torch.nn.functional as F
from scipy.spatial.distance import cdist

from modules.attention import DenseGroups, SegmentGroups, build_attention
from modules.attention.variants.alignment import PointClouds, reverse_gradient, sinkhorn_plan

from .conftest import make_problem

NAMES = ["align-gan", "align-ot", "align-ct"]


@pytest.fixture(autouse=True)
def single_thread():
    # These problems are tiny: a second intra-op thread only adds synchronisation (20x slower on a busy CPU).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def kernel(name, heads=2, dim=8, **overrides):
    torch.manual_seed(0)
    return build_attention({"name": name, **overrides}, num_heads=heads, head_dim=dim).double()


def clouds(q, k):
    return PointClouds(q, k, None, None)


def shifted_pair(shift, n=32, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(4, n, dim, generator=g, dtype=torch.float64)
    direction = torch.randn(dim, generator=g, dtype=torch.float64)
    return q, q + shift * direction / direction.norm()


# ---- gradient reversal -----------------------------------------------------------------------------


def test_gradient_reversal_is_identity_forward_and_negates_gradients_exactly():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64)
    y = reverse_gradient(x)
    assert torch.equal(y, x)
    (y * w).sum().backward()
    assert torch.equal(x.grad, -w)


def test_gan_discriminator_descends_while_keys_ascend_and_queries_get_no_adversarial_gradient():
    """The authors' code detaches the queries: D learns from both clouds, only the keys are pushed to fool it."""
    kern = kernel("align-gan").train()
    q, k = (t.clone().requires_grad_(True) for t in shifted_pair(1.0))
    kern.alignment_loss(clouds(q, k)).backward()
    assert q.grad is None or not q.grad.any()
    reversed_grads = k.grad.clone(), [p.grad.clone() for p in kern.discriminator.parameters()]
    # The plain discriminator loss, written out without reversal.
    q.grad = k.grad = None
    kern.zero_grad()
    logit_q = kern.discriminator(q).squeeze(-1)
    logit_k = kern.discriminator(k).squeeze(-1)
    plain = 0.5 * (
        F.binary_cross_entropy_with_logits(logit_k, torch.ones_like(logit_k))
        + F.binary_cross_entropy_with_logits(logit_q, torch.zeros_like(logit_q))
    )
    plain.backward()
    assert q.grad.abs().sum() > 0  # without the detach the queries would have had a gradient
    assert k.grad.abs().sum() > 0
    torch.testing.assert_close(reversed_grads[0], -k.grad)
    for reversed_p, p in zip(reversed_grads[1], kern.discriminator.parameters()):
        assert p.grad.abs().sum() > 0
        torch.testing.assert_close(reversed_p, p.grad)


def test_gan_papers_form_moves_the_queries_too_when_asked():
    """detach_queries=False: eq. 2 as written, the reversed gradient reaches both clouds."""
    kern = kernel("align-gan", detach_queries=False).train()
    q, k = (t.clone().requires_grad_(True) for t in shifted_pair(1.0))
    kern.alignment_loss(clouds(q, k)).backward()
    reversed_q = q.grad.clone()
    q.grad = None
    logit_q = kern.discriminator(q).squeeze(-1)
    (0.5 * F.binary_cross_entropy_with_logits(logit_q, torch.zeros_like(logit_q))).backward()
    torch.testing.assert_close(reversed_q, -q.grad)


def test_gan_query_projection_gets_no_adversarial_gradient_through_a_host_layer():
    """End to end through the kernel's forward: the aux loss moves the keys' inputs, never the queries'."""
    p = make_problem()
    kern = kernel("align-gan", heads=p.q.shape[1], dim=p.q.shape[-1]).train()
    q, k, v = (t.clone().requires_grad_(True) for t in (p.q, p.k, p.v))
    _, result = kern(q, k, v, p.dense)
    result.aux_losses["align"].backward()
    assert q.grad is None or not q.grad.any()
    assert k.grad is not None and k.grad.abs().sum() > 0


def test_ct_critic_ascends_while_navigator_and_points_descend():
    kern = kernel("align-ct").train()
    q, k = (t.clone().requires_grad_(True) for t in shifted_pair(1.0))
    kern.alignment_loss(clouds(q, k)).backward()
    grads = {n: p.grad.clone() for n, p in kern.named_parameters()}
    gq, gk = q.grad.clone(), k.grad.clone()
    # eq. (4) written out independently, no reversal anywhere.
    q.grad = k.grad = None
    kern.zero_grad()
    fq, fk = kern.critic(q), kern.critic(k)
    cost = 1 - F.cosine_similarity(fq.unsqueeze(-2), fk.unsqueeze(-3), dim=-1)
    # navigator on the unit sphere (authors' navigator_for), affinity exp(τ(k)ᵀτ(q)) as in sec. 2.3.3
    nq, nk = kern.navigator(q), kern.navigator(k)
    nq, nk = nq / (nq.norm(dim=-1, keepdim=True) + 1e-6), nk / (nk.norm(dim=-1, keepdim=True) + 1e-6)
    affinity = (nq.unsqueeze(-2) * nk.unsqueeze(-3)).sum(-1)
    forward = (affinity.softmax(-1) * cost).sum(-1).mean(-1)
    backward = (affinity.softmax(-2) * cost).sum(-2).mean(-1)
    (0.5 * forward + 0.5 * backward).mean().backward()
    torch.testing.assert_close(gq, q.grad)
    torch.testing.assert_close(gk, k.grad)
    for name, p in kern.named_parameters():
        sign = -1 if name.startswith("critic.") else 1
        torch.testing.assert_close(grads[name], sign * p.grad, msg=name)


# ---- optimal transport ------------------------------------------------------------------------------


def test_sinkhorn_matches_pot_numpy_backend():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 3)), rng.normal(size=(5, 3)) + 0.5
    a, b = rng.uniform(0.5, 1.5, 7), rng.uniform(0.5, 1.5, 5)
    a, b = a / a.sum(), b / b.sum()
    cost = cdist(x, y, "cosine")
    reference = ot.sinkhorn(a, b, cost, 0.05, method="sinkhorn_log", numItermax=20000, stopThr=1e-12)
    plan = sinkhorn_plan(torch.from_numpy(cost)[None], torch.from_numpy(a)[None], torch.from_numpy(b)[None], 0.05, 5000, 1e-12)
    np.testing.assert_allclose(plan[0].numpy(), reference, atol=1e-9)


def test_ot_loss_matches_pot_sinkhorn2_on_cosine_costs():
    q, k = shifted_pair(1.0, n=12, dim=5)
    kern = kernel("align-ot", dim=5, eps=0.5, iterations=3000, tol=1e-12)
    loss = kern.alignment_loss(clouds(q, k))
    uniform = np.full(12, 1 / 12)
    expected = np.mean([
        ot.sinkhorn2(uniform, uniform, cdist(qi, ki, "cosine"), 0.5, numItermax=10000, stopThr=1e-12)
        for qi, ki in zip(q.numpy(), k.numpy())
    ])
    assert loss.item() == pytest.approx(expected, abs=1e-8)


def test_ot_loss_at_small_eps_approaches_exact_ot():
    # ε = 0.002 puts max cost / ε past the exp-domain limit: this exercises the log-domain path too.
    q, k = shifted_pair(1.5, n=10, dim=4)
    kern = kernel("align-ot", dim=4, eps=0.002, iterations=3000, tol=1e-9)
    loss = kern.alignment_loss(clouds(q, k))
    exact = np.mean([ot.emd2(np.full(10, 0.1), np.full(10, 0.1), cdist(qi, ki, "cosine")) for qi, ki in zip(q.numpy(), k.numpy())])
    assert loss.item() == pytest.approx(exact, abs=5e-3)


def test_sqeuclidean_cost_is_scaled_to_unit_maximum():
    q, k = shifted_pair(1.0, n=9, dim=3)
    kern = kernel("align-ot", dim=3, cost="sqeuclidean", eps=0.5, iterations=3000, tol=1e-12)
    loss = kern.alignment_loss(clouds(q, k))
    expected = []
    for qi, ki in zip(q.numpy(), k.numpy()):
        cost = cdist(qi, ki, "sqeuclidean")
        expected.append(ot.sinkhorn2(np.full(9, 1 / 9), np.full(9, 1 / 9), cost / cost.max(), 0.5,
                                     numItermax=10000, stopThr=1e-12))
    assert loss.item() == pytest.approx(np.mean(expected), abs=1e-8)
    # scale-free: multiplying every point by 10 leaves it unchanged
    assert kern.alignment_loss(clouds(10 * q, 10 * k)).item() == pytest.approx(loss.item(), abs=1e-8)


def test_ot_loss_vanishes_for_equal_clouds_and_grows_with_the_shift():
    kern = kernel("align-ot").eval()
    losses = [kern.alignment_loss(clouds(*shifted_pair(s))).item() for s in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert losses[0] < 1e-3
    assert all(lo < hi for lo, hi in zip(losses, losses[1:])), losses


def test_ct_loss_grows_with_the_shift_and_a_trained_navigator_lowers_it():
    kern = kernel("align-ct").eval()
    losses = [kern.alignment_loss(clouds(*shifted_pair(s))).item() for s in (0.0, 1.0, 2.0, 4.0)]
    assert all(lo < hi for lo, hi in zip(losses, losses[1:])), losses
    # The navigator minimises the transport cost; on the unit sphere its affinities are cosines, so it can
    # sharpen π(·|q) towards near points (measured: -22% for equal clouds in 60 steps) but not collapse it.
    trained = {}
    for shift in (0.0, 4.0):
        kern = kernel("align-ct").train()
        optimiser = torch.optim.Adam(kern.navigator.parameters(), lr=0.05)
        pair = clouds(*shifted_pair(shift))
        start = kern.alignment_loss(pair).item()
        for _ in range(60):
            optimiser.zero_grad()
            kern.alignment_loss(pair).backward()
            optimiser.step()
        trained[shift] = kern.alignment_loss(pair).item()
        assert trained[shift] < 0.9 * start
    assert trained[0.0] < trained[4.0]


def test_ct_navigator_affinity_is_a_cosine_whatever_the_navigator_scale():
    """Sec. 2.3.3's exp(τ_φ(k)ᵀτ_φ(q)) with τ_φ on the unit sphere (authors' navigator_for): an unnormalised
    τ_φ (or −‖τ_φ(q) − τ_φ(k)‖²) lets the navigator's scale act as an inverse temperature."""
    kern = kernel("align-ct").eval()
    pair = clouds(*shifted_pair(1.0))
    affinity = kern.navigator_log_affinity(pair)
    assert affinity.abs().max() <= 1.0 + 1e-9
    with torch.no_grad():
        out_layer = kern.navigator[-1]
        out_layer.weight.mul_(50.0)
        out_layer.bias.mul_(50.0)
    # equal up to the 1e-6 the authors add to the norm
    torch.testing.assert_close(kern.navigator_log_affinity(pair), affinity, atol=1e-4, rtol=0)


def test_gan_discriminator_learns_to_separate_shifted_clouds():
    kern = kernel("align-gan").train()
    pair = clouds(*shifted_pair(3.0))
    optimiser = torch.optim.Adam(kern.discriminator.parameters(), lr=0.02)
    start = kern.alignment_loss(pair).item()
    for _ in range(60):
        optimiser.zero_grad()
        kern.alignment_loss(pair).backward()
        optimiser.step()
    end = kern.alignment_loss(pair).item()
    assert start == pytest.approx(np.log(2), abs=0.1)
    assert end < 0.25


# ---- layouts: padding and subsampling ----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_padding_tokens_do_not_affect_the_dense_regulariser(name):
    p = make_problem(batch=2, heads=2, length=6, dim=8)
    kern = kernel(name).eval()
    loss = kern.alignment_loss(kern.point_clouds(p.q, p.k, p.dense))
    padded = ~p.key_valid[:, None, :, None]  # the last two tokens of the last sequence
    q2 = torch.where(padded, 100 * torch.randn_like(p.q), p.q)
    k2 = torch.where(padded, -50 * torch.randn_like(p.k), p.k)
    assert kern.alignment_loss(kern.point_clouds(q2, k2, p.dense)).item() == pytest.approx(loss.item(), abs=1e-12)
    # a real token does count (the check above could fail)
    k3 = p.k.clone()
    k3[0, :, 0] += 3.0
    assert abs(kern.alignment_loss(kern.point_clouds(p.q, k3, p.dense)).item() - loss.item()) > 1e-6


def test_padding_is_read_from_the_mask_and_empty_samples_are_finite():
    p = make_problem(batch=2, heads=2, length=6, dim=8)
    kern = kernel("align-ot").eval()
    c = kern.point_clouds(p.q, p.k, p.dense)
    assert c.q.shape == (4, 6, 8) and c.k_valid.shape == (4, 6)
    assert c.k_valid[2:, -2:].logical_not().all() and c.q_valid[2:, -2:].logical_not().all()
    assert c.k_valid[:2].all()
    everything_padded = DenseGroups.from_key_padding(torch.zeros(2, 6, dtype=torch.bool))
    for name in NAMES:
        value = kernel(name).eval().alignment_loss(kernel(name).point_clouds(p.q, p.k, everything_padded))
        assert torch.isfinite(value)


@pytest.mark.parametrize("name", NAMES)
def test_subsampling_caps_the_clouds_of_a_large_graph(name):
    nodes, heads, dim = 5000, 2, 8
    q, k = torch.randn(nodes, heads, dim), torch.randn(nodes, heads, dim)
    dst = torch.arange(nodes)
    groups = SegmentGroups(dst=dst, src=dst.roll(1), num_nodes=nodes)
    kern = build_attention({"name": name, "max_points": 32}, num_heads=heads, head_dim=dim).train()
    c1, c2 = kern.point_clouds(q, k, groups), kern.point_clouds(q, k, groups)
    assert c1.q.shape == c1.k.shape == (heads, 32, dim)
    assert not torch.equal(c1.q, c2.q)  # a fresh random subsample in training
    # self-attention keeps the same nodes as queries and keys
    assert torch.equal(torch.isin(c1.q[0, :, 0], q[:, 0, 0]), torch.ones(32, dtype=torch.bool))
    kern.eval()
    assert torch.equal(kern.point_clouds(q, k, groups).q, kern.point_clouds(q, k, groups).q)
    assert torch.isfinite(kern.alignment_loss(c1))
    # dense sequences longer than the cap are subsampled too
    dense_q = torch.randn(2, heads, 100, dim)
    assert kern.point_clouds(dense_q, dense_q, DenseGroups()).q.shape == (2 * heads, 32, dim)


# ---- the λ = 0 limit in a real host -----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_zero_weight_leaves_the_training_gradients_of_softmax_attention(name):
    from modules.hosts.gat import GAT, graph_groups
    from modules.lit.attention_terms import trace_aux_loss

    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 12, generator=g)
    groups = graph_groups(torch.randint(0, 30, (2, 90), generator=g), 30)
    y = torch.randint(0, 3, (30,), generator=g)

    shared_weights = GAT(12, 3, "softmax", hidden=4, heads=2).state_dict()

    def gradients(attention):
        model = GAT(12, 3, attention, hidden=4, heads=2, dropout=0.0, attn_dropout=0.0).train()
        missing, unexpected = model.load_state_dict(shared_weights, strict=False)
        assert not unexpected and all(".kernel." in n for n in missing)
        torch.manual_seed(1)
        trace = []
        logits = model(x, groups, trace)
        aux, _ = trace_aux_loss(trace, step=0)
        loss = F.cross_entropy(logits, y) + (aux if aux is not None else 0)
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if ".kernel." not in n}

    reference = gradients("softmax")
    assert build_attention({"name": name, "weight": 0.0}, num_heads=2, head_dim=4).loss_weights(0) == {"align": 0.0}
    for n, grad in gradients({"name": name, "weight": 0.0}).items():
        torch.testing.assert_close(grad, reference[n], msg=n)
    # with λ > 0 the regulariser reaches the projections (GAT passes q = k = h, so OT sees ~identical clouds)
    weighted = gradients({"name": name, "weight": 1.0})
    assert any(not torch.allclose(weighted[n], reference[n]) for n in reference)


@pytest.mark.parametrize("name", ["align-gan", "align-ot", "align-ct"])
def test_fused_dense_path_equals_the_weights_path(name):
    from modules.attention import build_attention

    from .conftest import make_problem

    p = make_problem(dtype=torch.float32)
    torch.manual_seed(0)
    kernel = build_attention(name, num_heads=2, head_dim=4).eval()
    fused, fused_result = kernel(p.q.float(), p.k.float(), p.v.float(), p.dense, need_weights=False)
    slow, slow_result = kernel(p.q.float(), p.k.float(), p.v.float(), p.dense, need_weights=True)
    assert fused_result.weights is None
    valid_rows = p.key_valid.any(-1)
    torch.testing.assert_close(fused[valid_rows], slow[valid_rows], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_result.aux_losses["align"], slow_result.aux_losses["align"])


# ---- where the regulariser is defined ----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("need_weights", [True, False])
def test_regulariser_only_at_self_attention_sites(name, need_weights):
    """Sec. 2.2 defines L_Align for self-attention (n = m = w tokens): cross-attention and pooling sites get
    softmax attention and no aux loss, on the weights path and the fused path alike."""
    from modules.attention.kernel import AttentionSite

    p = make_problem(dtype=torch.float32)
    q, k = p.q.clone().requires_grad_(), p.k.clone().requires_grad_()
    reference = p.dense.softmax(p.dense.scores(p.q, p.k, 0.5))
    sites = {
        "text self": AttentionSite("text", "self", sequence=True),
        "graph self": AttentionSite("graph"),
        "cross": AttentionSite("vision-language", "cross"),
        "pool": AttentionSite("vision-language", "pool"),
    }
    for label, site in sites.items():
        torch.manual_seed(0)
        kern = build_attention(name, num_heads=2, head_dim=4, site=site).train()
        out, result = kern(q, k, p.v, p.dense, scale=0.5, need_weights=need_weights)
        if site.role == "self":
            assert set(result.aux_losses) == {"align"}, label
            assert result.aux_losses["align"].requires_grad, label
        else:
            assert result.aux_losses == {}, label
        if need_weights:
            torch.testing.assert_close(result.weights, reference, msg=label)
