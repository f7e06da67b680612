"""Every Groups operation against a brute-force reference, on dense rows and on their graph twin.

The reference is written from the docstrings with explicit loops over (query, key) pairs of the padded
batch of tests/attention/conftest.py (two sequences, the second padded by two tokens): a padded token is a
padded query row and a masked key on dense groups, and a node without edges on segment groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.utils import softmax as pyg_softmax

from modules.attention import DenseGroups, SegmentGroups

from .conftest import make_problem

SCALE = 0.7


@pytest.fixture(scope="module")
def p():
    return make_problem(batch=2, heads=2, length=5, dim=3)


def pairs(p):
    """(b, i, j) of every valid pair: real query i attends real key j of sample b."""
    return [(b, i, j) for b in range(p.key_valid.shape[0]) for i in range(p.key_valid.shape[1]) for j in range(p.key_valid.shape[1])
            if p.key_valid[b, i] and p.key_valid[b, j]]


def real_queries(p):
    return [(b, i) for b in range(p.key_valid.shape[0]) for i in range(p.key_valid.shape[1]) if p.key_valid[b, i]]


def logits_of(p):
    return torch.einsum("bhid,bhjd->bhij", p.q, p.k) * SCALE


def both(p):
    """(layout name, groups, logits, q, k, v) for dense and segment."""
    return [("dense", p.dense, p.dense.scores(p.q, p.k, SCALE), p.q, p.k, p.v),
            ("segment", p.segment, p.segment.scores(p.nodes(p.q), p.nodes(p.k), SCALE), p.nodes(p.q), p.nodes(p.k), p.nodes(p.v))]


def at(p, layout, x, b, i, j=None):
    """The entry of a logits-layout (j given) or per-query/per-key tensor (j None) at sample b, position i."""
    length = p.key_valid.shape[1]
    if layout == "dense":
        return x[b, :, i, j] if j is not None else x[b, :, i]
    if j is None:
        return x[b * length + i]
    edge = ((p.segment.dst == b * length + i) & (p.segment.src == b * length + j)).nonzero().item()
    return x[edge]


def test_scores_are_scaled_dot_products(p):
    full = logits_of(p)
    for layout, groups, logits, *_ in both(p):
        for b, i, j in pairs(p):
            torch.testing.assert_close(at(p, layout, logits, b, i, j), full[b, :, i, j], rtol=0, atol=1e-12)


@pytest.mark.parametrize("how", ["sum", "max", "mean"])
def test_reduce_over_the_valid_keys_of_each_query(p, how):
    full = logits_of(p)
    for layout, groups, logits, *_ in both(p):
        reduced = groups.reduce(groups.fill_invalid(logits, 0.0) if how != "max" else logits, how)
        for b, i in real_queries(p):
            keys = full[b, :, i, p.key_valid[b]]
            expected = {"sum": keys.sum(-1), "max": keys.max(-1).values, "mean": keys.mean(-1)}[how]
            torch.testing.assert_close(at(p, layout, reduced, b, i), expected, rtol=0, atol=1e-12)


def test_softmax_and_its_log_against_torch_and_pyg(p):
    full = logits_of(p)
    for layout, groups, logits, *_ in both(p):
        weights = groups.softmax(logits)
        probs, log_probs = groups.softmax_and_log(logits)
        for b, i in real_queries(p):
            valid = p.key_valid[b]
            expected = torch.zeros(2, 5, dtype=full.dtype)
            expected[:, valid] = torch.softmax(full[b, :, i, valid], -1)
            for j in range(5):
                if layout == "dense" or valid[j]:
                    torch.testing.assert_close(at(p, layout, weights, b, i, j), expected[:, j], rtol=0, atol=1e-12)
                    torch.testing.assert_close(at(p, layout, probs, b, i, j), expected[:, j], rtol=0, atol=1e-12)
                    log_expected = expected[:, j].log() if valid[j] else torch.zeros(2, dtype=full.dtype)
                    torch.testing.assert_close(at(p, layout, log_probs, b, i, j), log_expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(p.segment.softmax(both(p)[1][2]), pyg_softmax(both(p)[1][2], p.segment.dst, num_nodes=10), rtol=0, atol=1e-12)


def test_softmax_and_log_survive_logits_spread_over_hundreds_of_nats(p):
    """Shifting by the global max underflows a group far below it; the group max must take over."""
    for layout, groups, logits, *_ in both(p):
        spread = logits.clone()
        if layout == "dense":
            spread[0] -= 500.0
        else:
            spread[p.segment.dst < 5] -= 500.0
        probs, log_probs = groups.softmax_and_log(spread)
        torch.testing.assert_close(probs, groups.softmax(logits), rtol=0, atol=1e-12)
        torch.testing.assert_close(log_probs, groups.softmax_and_log(logits)[1], rtol=0, atol=1e-9)


def test_aggregate_and_its_transpose_sum_over_queries(p):
    for layout, groups, logits, q, k, v in both(p):
        weights = groups.softmax(logits)
        out = groups.aggregate(weights, v)
        totals, weighted_q = groups.sum_over_queries(weights, q)
        only_totals, none = groups.sum_over_queries(weights)
        assert none is None
        torch.testing.assert_close(only_totals, totals, rtol=0, atol=0)
        operator = groups.weighted_sum_operator(v)
        torch.testing.assert_close(operator(weights, torch.ones_like(out)), out + 1, rtol=0, atol=1e-12)
        for b, i in real_queries(p):
            expected = sum(at(p, layout, weights, b, i, j)[:, None] * at(p, layout, v, b, j) for j in range(5) if p.key_valid[b, j])
            torch.testing.assert_close(at(p, layout, out, b, i), expected, rtol=0, atol=1e-12)
        for b, j in real_queries(p):  # keys: the real positions too
            senders = [i for i in range(5) if p.key_valid[b, i]]
            expected = sum(at(p, layout, weights, b, i, j) for i in senders)
            torch.testing.assert_close(at(p, layout, totals, b, j), expected, rtol=0, atol=1e-12)
            expected_q = sum(at(p, layout, weights, b, i, j)[:, None] * at(p, layout, q, b, i) for i in senders)
            torch.testing.assert_close(at(p, layout, weighted_q, b, j), expected_q, rtol=0, atol=1e-12)


def test_second_moment_is_the_weighted_outer_product_of_keys(p):
    for layout, groups, logits, q, k, v in both(p):
        weights = groups.softmax(logits)
        moment = groups.second_moment(weights, k)
        for b, i in real_queries(p):
            expected = sum(at(p, layout, weights, b, i, j)[:, None, None] * torch.einsum("hd,he->hde", at(p, layout, k, b, j), at(p, layout, k, b, j))
                           for j in range(5) if p.key_valid[b, j])
            torch.testing.assert_close(at(p, layout, moment, b, i), expected, rtol=0, atol=1e-12)


def test_counts_degrees_and_means_over_queries_keys_and_pairs(p):
    lengths = p.key_valid.sum(-1).tolist()  # [5, 3]
    n_pairs = sum(n * n for n in lengths)
    for layout, groups, logits, q, k, v in both(p):
        sizes = groups.group_size(logits)
        for b, i in real_queries(p):
            assert set(at(p, layout, sizes, b, i).tolist()) == {lengths[b]}
            assert set(at(p, layout, groups.count(logits).expand_as(logits), b, i, i).tolist()) == {lengths[b]}
        degree = groups.key_degree()
        if degree is not None:  # segment: per key, how many queries attend it
            for b, j in real_queries(p):
                assert at(p, layout, degree, b, j).tolist() == [lengths[b]]
        per_query = torch.arange(float(sizes.numel()), dtype=logits.dtype).view_as(sizes)
        expected_mean = torch.stack([at(p, layout, per_query, b, i) for b, i in real_queries(p)]).mean()
        torch.testing.assert_close(groups.mean_over_queries(per_query), expected_mean, rtol=0, atol=1e-12)
        per_key = groups.map_keys(lambda x: x.sum(-1), k)
        expected_keys = torch.stack([at(p, layout, k, b, j).sum(-1) for b, j in real_queries(p)]).mean()
        torch.testing.assert_close(groups.mean_over_keys(per_key), expected_keys, rtol=0, atol=1e-12)
        torch.testing.assert_close(groups.sum_over_pairs(logits, logits), sum(logits_of(p)[b, :, i, j].sum() for b, i, j in pairs(p)), rtol=0, atol=1e-9)
        assert groups.count_pairs(logits).item() == n_pairs * 2  # both heads


def test_entropy_and_support_average_over_real_queries(p):
    for layout, groups, logits, *_ in both(p):
        weights = groups.softmax(logits)
        sparse = torch.where(weights > 0.25, weights, 0.0)
        entropies, supports = [], []
        for b, i in real_queries(p):
            row = torch.stack([at(p, layout, weights, b, i, j) for j in range(5) if p.key_valid[b, j]], -1)
            entropies.append(-(row * row.log()).sum(-1))
            supports.append(torch.stack([at(p, layout, sparse, b, i, j) for j in range(5) if p.key_valid[b, j]], -1).gt(0).sum(-1))
        torch.testing.assert_close(groups.entropy(weights), torch.stack(entropies).mean(), rtol=0, atol=1e-12)
        assert groups.support(sparse).item() == pytest.approx(torch.stack(supports).double().mean().item())
        assert groups.support(weights).item() == pytest.approx((5 * 5 + 3 * 3) / 8)


def test_normalize_divides_by_the_group_sum_and_zeroes_masked_keys(p):
    for layout, groups, logits, *_ in both(p):
        positive = logits.exp()
        torch.testing.assert_close(groups.normalize(positive), groups.softmax(logits), rtol=0, atol=1e-12)
        zero = groups.normalize(torch.zeros_like(logits))
        assert torch.equal(zero, torch.zeros_like(logits))  # no mass: 0, not NaN


def test_pad_gives_each_group_as_a_row_and_unpad_inverts_it(p):
    for layout, groups, logits, *_ in both(p):
        rows, unpad = groups.pad(logits, float("-inf"))
        torch.testing.assert_close(groups.zero_invalid(unpad(rows)), groups.zero_invalid(logits), rtol=0, atol=0)
        if layout == "segment":
            assert rows.shape == (10, 2, 5)  # nodes x heads x the largest in-degree
            for b, i in real_queries(p):
                node = b * 5 + i
                expected = sorted(at(p, layout, logits, b, i, j)[0].item() for j in range(5) if p.key_valid[b, j])
                got = sorted(x for x in rows[node, 0].tolist() if not math.isinf(x))
                assert got == pytest.approx(expected)


def test_query_and_key_sets_and_valid_points(p):
    dense_q, dense_k, q_valid, k_valid = p.dense.query_and_key_sets(p.q, p.k)
    assert dense_q.shape == (4, 5, 3) and torch.equal(dense_q[1], p.q[0, 1]) and torch.equal(dense_k[2], p.k[1, 0])
    assert torch.equal(q_valid, p.key_valid.repeat_interleave(2, 0)) and torch.equal(k_valid, q_valid)
    seg_q, seg_k, _, _ = p.segment.query_and_key_sets(p.nodes(p.q), p.nodes(p.k))
    assert seg_q.shape == (2, 10, 3) and torch.equal(seg_q[1], p.nodes(p.q)[:, 1])


def test_restricting_a_graph_to_some_queries_keeps_their_edges(p):
    groups, logits = p.segment, both(p)[1][2]
    rows = torch.tensor([7, 1])
    restricted, kept = groups.restrict_queries(rows)
    assert restricted.num_nodes == 2
    torch.testing.assert_close(restricted.softmax(logits.index_select(0, kept)), groups.softmax(logits).index_select(0, kept), rtol=0, atol=1e-12)
    assert sorted(groups.dst[kept].tolist()) == [1] * 5 + [7] * 3
    # the keys are unchanged: still every node of the batch graph, with the out-degrees the kept edges give
    assert restricted.num_src_nodes == groups.num_src_nodes == 10
    assert restricted.key_degree().squeeze(-1).tolist() == torch.bincount(groups.src[kept], minlength=10).tolist()
    # built on the device of the rows, not the default device (`meta` here tells the two apart on a CPU)
    torch.set_default_device("meta")
    try:
        on_rows_device, kept_there = groups.restrict_queries(rows)
    finally:
        torch.set_default_device(None)
    assert torch.equal(kept_there, kept) and torch.equal(on_rows_device.dst, restricted.dst)


def test_query_and_key_sets_of_other_shapes_masks_and_graphs():
    """Batch, heads, length and width all distinct, so that no axis can stand in for another; a 2-D mask
    (broadcast over batch and heads) with a key no query sees; no mask at all; a graph with a node that
    nothing attends to, one that attends to nothing and a key seen by exactly one edge."""
    p = make_problem(batch=3, heads=2, length=4, dim=5)
    dense_q, dense_k, q_valid, k_valid = p.dense.query_and_key_sets(p.q, p.k)
    assert torch.equal(dense_q, p.q.reshape(6, 4, 5)) and torch.equal(dense_k, p.k.reshape(6, 4, 5))
    assert torch.equal(q_valid, p.key_valid.repeat_interleave(2, 0)) and torch.equal(k_valid, q_valid)
    assert DenseGroups().query_and_key_sets(p.q, p.k)[2:] == (None, None)
    mask = torch.tensor([[True, False, True, False], [True, True, False, False], [False, True, True, False], [True, True, True, False]])
    _, _, q_valid, k_valid = DenseGroups(mask).query_and_key_sets(p.q, p.k)
    assert q_valid is None and torch.equal(k_valid, torch.tensor([True, True, True, False]).expand(6, 4))

    graph = SegmentGroups(dst=torch.tensor([0, 1, 1]), src=torch.tensor([2, 2, 0]), num_nodes=3)
    q, k = torch.randn(3, 2, 4), torch.randn(3, 2, 4)  # [nodes, heads, width]
    seg_q, seg_k, q_valid, k_valid = graph.query_and_key_sets(q, k)
    assert torch.equal(seg_q, q.transpose(0, 1)) and torch.equal(seg_k, k.transpose(0, 1))
    assert torch.equal(q_valid, torch.tensor([[True, True, False]] * 2))  # node 2 has no incoming edge
    assert torch.equal(k_valid, torch.tensor([[True, False, True]] * 2))  # node 1 is nobody's key, node 0 one edge's
    complete = SegmentGroups(dst=torch.tensor([0, 1]), src=torch.tensor([1, 0]), num_nodes=2)
    assert complete.query_and_key_sets(q[:2], k[:2])[2:] == (None, None)


def test_max_and_mean_broadcast_each_querys_value_over_its_keys(p):
    full = logits_of(p)
    for layout, groups, logits, *_ in both(p):
        # broadcastable against the logits (dense [B, H, Lq, 1]), so expanded to read them pair by pair
        largest, average = groups.max(logits).expand_as(logits), groups.mean(groups.zero_invalid(logits)).expand_as(logits)
        for b, i, j in pairs(p):
            keys = full[b, :, i, p.key_valid[b]]
            torch.testing.assert_close(at(p, layout, largest, b, i, j), keys.max(-1).values, rtol=0, atol=1e-12)
            torch.testing.assert_close(at(p, layout, average, b, i, j), keys.mean(-1), rtol=0, atol=1e-12)
        cheap = groups.max_if_cheap(logits)
        if layout == "dense":  # one elementwise pass on rows; a scatter on segments, which it declines
            torch.testing.assert_close(cheap, groups.reduce(logits, "max"), rtol=0, atol=0)
        else:
            assert cheap is None


@pytest.mark.parametrize("requires_grad", [False, True], ids=["one sparse product", "autograd"])
def test_several_sums_at_once_equal_one_sum_each(p, requires_grad):
    """Segments batch the sums into one CSR product without autograd, and fall back to one sum each with it."""
    for layout, groups, logits, *_ in both(p):
        x = logits.detach().clone().requires_grad_(requires_grad)
        y = (logits.detach() * 2 - 1).requires_grad_(requires_grad)
        got = groups.sums(x, y)
        assert len(got) == 2
        torch.testing.assert_close(got[0], groups.reduce(x, "sum"), rtol=0, atol=1e-12)
        torch.testing.assert_close(got[1], groups.reduce(y, "sum"), rtol=0, atol=1e-12)
        (only,) = groups.sums(x)
        torch.testing.assert_close(only, groups.reduce(x, "sum"), rtol=0, atol=1e-12)


def test_per_key_values_broadcast_to_every_query_of_the_key(p):
    full = logits_of(p)[..., 0, :]  # any per-key quantity, dense [B, H, Lk]
    spread = p.dense.per_key(full).expand(2, 2, 5, 5)  # broadcastable against the logits, never expanded itself
    for b, i, j in pairs(p):
        torch.testing.assert_close(spread[b, :, i, j], full[b, :, j], rtol=0, atol=0)
    keys = p.nodes(p.k)[..., 0]  # segment [N, H]
    torch.testing.assert_close(p.segment.per_key(keys), keys[p.segment.src], rtol=0, atol=0)


@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_dense_attention_is_the_masked_softmax_of_the_scaled_scores_times_v(p, with_bias):
    bias = torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float32) if with_bias else None
    logits = logits_of(p) + (0 if bias is None else bias.double())
    expected = p.dense.softmax(logits) @ p.v
    got = p.dense.fused_attention(p.q, p.k, p.v, bias=bias, scale=SCALE, dropout_p=0.0)
    for b, i in real_queries(p):  # padded query rows are never read
        torch.testing.assert_close(got[b, :, i], expected[b, :, i], rtol=0, atol=1e-12)
    assert p.dense.has_fused_attention and not p.segment.has_fused_attention
    unmasked = DenseGroups()
    torch.testing.assert_close(unmasked.fused_attention(p.q, p.k, p.v, bias=bias, scale=SCALE, dropout_p=0.0),
                               unmasked.softmax(logits) @ p.v, rtol=0, atol=1e-12)


def test_layouts_without_an_operation_say_so():
    with pytest.raises(NotImplementedError, match="DenseGroups cannot restrict its queries; check can_restrict_queries"):
        DenseGroups().restrict_queries(torch.tensor([0]))
    assert not DenseGroups.can_restrict_queries and SegmentGroups.can_restrict_queries
    graph = SegmentGroups(dst=torch.tensor([0]), src=torch.tensor([0]), num_nodes=1)
    with pytest.raises(NotImplementedError, match="SegmentGroups has no fused attention kernel"):
        graph.fused_attention(torch.ones(1, 1, 1), torch.ones(1, 1, 1), torch.ones(1, 1, 1), bias=None, scale=1.0, dropout_p=0.0)


@pytest.mark.parametrize("num_queries", [None, 5, 2])
def test_causal_key_padding_masks_every_later_key_and_every_padded_one(num_queries):
    """A decoder's groups: query i (of the last Lq positions when queries are fewer than keys, as when
    decoding continues a prefix) attends to keys up to its own position, and never to padding."""
    key_valid = torch.tensor([[True] * 5, [True, True, True, False, False]])
    groups = DenseGroups.from_key_padding(key_valid, causal=True, num_queries=num_queries)
    lq = num_queries or 5
    expected = torch.tensor([[[[key <= query + 5 - lq and bool(key_valid[b, key]) for key in range(5)] for query in range(lq)]]
                             for b in range(2)])
    assert groups.mask.dtype == torch.bool and groups.mask.shape == (2, 1, lq, 5)
    assert torch.equal(groups.mask, expected)
    plain = DenseGroups.from_key_padding(key_valid)
    assert plain.mask.shape == (2, 1, 1, 5) and torch.equal(plain.mask[:, 0, 0], key_valid)


def test_dense_groups_reject_non_boolean_masks_and_say_what_they_need():
    with pytest.raises(TypeError, match=r"^DenseGroups mask must be boolean with True where a query may attend to a key$"):
        DenseGroups(torch.ones(1, 1, 1, 3))
    with pytest.raises(TypeError, match=r"^DenseGroups query_valid must be a boolean \[B, Lq\] tensor, True for real queries$"):
        DenseGroups(None, torch.ones(2, 3, dtype=torch.bool)[None])


def test_unmasked_dense_groups_softmax_and_sum_over_queries_like_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    groups = DenseGroups()
    weights, log_p = groups.softmax_and_log(logits)
    torch.testing.assert_close(weights, logits.softmax(-1), rtol=0, atol=1e-15)
    torch.testing.assert_close(log_p, logits.log_softmax(-1), rtol=0, atol=1e-15)
    x = torch.randn(2, 3, 4, 6, generator=g, dtype=torch.float64)
    per_key, weighted = groups.sum_over_queries(weights, x)
    torch.testing.assert_close(per_key, weights.sum(-2))
    torch.testing.assert_close(weighted, weights.transpose(-1, -2) @ x)


def test_a_query_without_keys_gets_zero_weights_and_normalize_divides_by_each_rows_own_sum():
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[0, 0, 1] = False  # query 1 sees no key
    groups = DenseGroups(mask)
    weights = groups.softmax(torch.randn(1, 2, 3, 3, dtype=torch.float64))
    assert torch.equal(weights[0, :, 1], torch.zeros(2, 3)) and torch.allclose(weights[0, :, [0, 2]].sum(-1), torch.ones(2, 2, dtype=torch.float64))
    positive = torch.rand(1, 2, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.05  # rows sum far below 1
    positive = positive.masked_fill(~mask, 0.0)
    expected = torch.where(mask.any(-1, keepdim=True), positive / positive.sum(-1, keepdim=True).clamp_min(1e-300), 0.0)
    for zero_on_masked in (False, True):
        torch.testing.assert_close(groups.normalize(positive, zero_on_masked=zero_on_masked), expected)


def test_key_degree_of_a_causal_mask_counts_the_queries_that_see_each_key():
    key_valid = torch.tensor([[True, True, True, False]])
    groups = DenseGroups.from_key_padding(key_valid, causal=True)
    # key j is seen by queries j..3 (4 - j of them), the padded key by none
    assert groups.key_degree().flatten().tolist() == [4.0, 3.0, 2.0, 0.0]
    assert DenseGroups.from_key_padding(key_valid).key_degree() is None  # key padding only: all valid queries see all valid keys


def test_softmax_and_log_of_a_group_86_nats_below_the_rest_stays_exact_in_float32():
    """Shifted by the global max, that group's smallest terms would be subnormal (3 digits); its own max is used."""
    groups = SegmentGroups(dst=torch.tensor([0, 0, 1, 1, 1]), src=torch.tensor([0, 1, 0, 1, 2]), num_nodes=2)
    logits = torch.tensor([[0.0], [-1.0], [-86.0], [-92.0], [-98.0]])
    weights, log_p = groups.softmax_and_log(logits)
    torch.testing.assert_close(weights[2:, 0], torch.tensor([0.0, -6.0, -12.0]).softmax(0), rtol=1e-6, atol=0)
    torch.testing.assert_close(log_p[2:, 0], torch.tensor([0.0, -6.0, -12.0]).log_softmax(0), rtol=1e-6, atol=0)


def test_segment_reductions_keep_nodes_without_incoming_edges():
    groups = SegmentGroups(dst=torch.tensor([0, 0, 2]), src=torch.tensor([1, 2, 0]), num_nodes=5)
    x = torch.tensor([[1.0], [2.0], [4.0]])
    assert groups.reduce(x, "sum").flatten().tolist() == [3.0, 0.0, 4.0, 0.0, 0.0]
    assert groups.reduce(x, "mean").flatten().tolist() == [1.5, 0.0, 4.0, 0.0, 0.0]
    assert groups.reduce(x, "max").shape == (5, 1) and groups.reduce(x, "max")[[0, 2], 0].tolist() == [2.0, 4.0]
    # normalize's own default: a group whose values sum far below 1 still sums to 1
    torch.testing.assert_close(groups.normalize(x * 0.01), torch.tensor([[1 / 3], [2 / 3], [1.0]]))
    # a single seen (key, head): its value is the mean
    one = SegmentGroups(dst=torch.tensor([0]), src=torch.tensor([1]), num_nodes=2)
    assert one.mean_over_keys(torch.tensor([[0.0], [5.0]])).item() == 5.0


def test_the_sparse_product_is_used_only_where_it_was_measured_faster_and_is_built_once_per_dtype():
    pays = SegmentGroups._csr_pays
    assert pays(torch.ones(10, 8)) and pays(torch.ones(10, 4, 16, dtype=torch.float64))
    assert not pays(torch.ones(10, 65)) and not pays(torch.ones(0, 8))  # too wide; nothing to sum
    assert not pays(torch.ones(10, 8, dtype=torch.bfloat16)) and not pays(torch.ones(10, 8, dtype=torch.float16))
    assert not pays(torch.ones(10, 8, requires_grad=True))  # its backward is slower than index_add_'s
    with torch.no_grad():
        assert pays(torch.ones(10, 8, requires_grad=True))
    groups = SegmentGroups(dst=torch.tensor([0, 0, 1]), src=torch.tensor([1, 2, 0]), num_nodes=3)
    like = torch.ones(3, 1)
    assert groups._edge_matrix(like) is groups._edge_matrix(like)
    assert groups._edge_matrix(like.double()).dtype == torch.float64


def test_segment_weighted_sum_operator_adds_each_query_and_heads_own_base():
    g = torch.Generator().manual_seed(0)
    groups = SegmentGroups(dst=torch.tensor([0, 0, 1, 2, 2, 2]), src=torch.tensor([1, 2, 0, 0, 1, 2]), num_nodes=3)
    x = torch.randn(3, 2, 4, generator=g, dtype=torch.float64)  # per key, 2 heads
    weights = torch.rand(6, 2, generator=g, dtype=torch.float64)
    base = torch.randn(3, 2, 4, generator=g, dtype=torch.float64)  # differs per query and per head
    expected = base + groups.aggregate(weights, x)
    torch.testing.assert_close(groups.weighted_sum_operator(x)(weights, base), expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_segment_softmax_on_the_cuda_path_equals_the_cpu_form_with_its_gradient(dtype):
    from torch.utils._python_dispatch import TorchDispatchMode

    from modules.device_policy import behave_as_cuda

    generator = torch.Generator().manual_seed(3)
    # nodes 7 and 9 have no incoming edges; logits spread over ~80 nats (the shift must be each group's own max)
    dst = torch.cat([torch.arange(7), torch.randint(0, 7, (40,), generator=generator), torch.tensor([8])])
    logits = (torch.randn(dst.numel(), 3, generator=generator, dtype=dtype) * 20).requires_grad_()
    upstream = torch.randn(dst.numel(), 3, generator=generator, dtype=dtype)
    groups = SegmentGroups(dst=dst, src=torch.randint(0, 10, (dst.numel(),), generator=generator), num_nodes=10)

    class Ops(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.count += 1
            return func(*args, **(kwargs or {}))

    reference = groups.softmax(logits)
    (reference_grad,) = torch.autograd.grad(reference, logits, upstream)
    with behave_as_cuda(), Ops():
        weights = groups.softmax(logits)
        forward_ops, Ops.count = Ops.count, 0
        (grad,) = torch.autograd.grad(weights, logits, upstream)
    tolerance = dict(rtol=0, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(weights, reference, **tolerance)
    torch.testing.assert_close(grad, reference_grad, **tolerance)
    # a GPU launch each: max, gather, sub, exp, sum, gather, div (and the two tensors they fill, and the Function's
    # detach of its output); backward: the saved weights' unpacking, p·g, its sum, gather, addcmul (and the sum's zeros)
    assert (forward_ops, Ops.count) == (10, 6)
    torch.autograd.gradcheck(lambda x: groups.softmax(x), (logits.detach().double().requires_grad_(),))
    with behave_as_cuda():
        torch.autograd.gradcheck(lambda x: groups.softmax(x), (logits.detach().double().requires_grad_(),))
