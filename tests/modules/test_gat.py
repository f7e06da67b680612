"""Our GAT layer with the softmax kernel must be GAT: it matches PyG's GATConv given the same weights."""

import torch
from torch_geometric.nn import GATConv

from modules.hosts.gat import GAT, GATLayer, graph_groups


def random_graph(n=30, e=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), torch.randn(n, 12, generator=g)


def test_gat_layer_matches_pyg_gatconv():
    edge_index, x = random_graph()
    for concat in (True, False):
        ours = GATLayer(12, 5, 3, "softmax", concat=concat, attn_dropout=0.0).eval()
        ref = GATConv(12, 5, heads=3, concat=concat, dropout=0.0).eval()
        with torch.no_grad():
            ref.lin.weight.copy_(ours.weight.T)
            ref.att_src.copy_(ours.att_src)
            ref.att_dst.copy_(ours.att_dst)
            ours.bias.normal_()
            ref.bias.copy_(ours.bias)
        trace = []
        out = ours(x, graph_groups(edge_index, x.shape[0]), trace)
        torch.testing.assert_close(out, ref(x, edge_index), atol=1e-5, rtol=1e-5)
        [(kernel, result)] = trace
        assert kernel is ours.kernel and result.weights.shape == (graph_groups(edge_index, 30).dst.numel(), 3)


def test_sparse_input_gives_the_same_model_as_dense():
    edge_index, x = random_graph()
    x = torch.relu(x)
    model = GAT(12, 4, "softmax").eval()
    groups = graph_groups(edge_index, x.shape[0])
    dense = model(x, groups)
    sparse = model(x.to_sparse_coo().coalesce(), groups)
    torch.testing.assert_close(dense, sparse, atol=1e-5, rtol=1e-5)


def test_every_kernel_is_told_it_sits_in_a_graph():
    from modules.attention import AttentionSite

    model = GAT(12, 4, "softmax")
    assert [kernel.site for kernel in model.kernels()] == [AttentionSite("graph", "self", sequence=False)] * 2
    edge_index, x = random_graph()
    trace = []
    model(x, graph_groups(edge_index, x.shape[0]), trace)
    assert [kernel for kernel, _ in trace] == model.kernels()
