"""The CUDA path's seed batch folds the seeds into the heads axis for kernels that qualify (kernel.folds_heads): one
kernel call on [E, S·H] logits instead of S calls. Held to the per-seed CUDA-path loop to float tolerance (a planted
seed mix-up must fail that check), the rule itself (who folds, who does not), and the per-seed traces."""

from __future__ import annotations

import pytest
import torch

from modules.attention import build_attention
from modules.attention.diagnostics import mechanism_diagnostics
from modules.attention.kernel import AttentionKernel, AttentionResult, folds_heads
from modules.device_policy import behave_as_cuda
from modules.hosts import gat_seed_batch
from modules.hosts.gat import SITE, graph_groups
from modules.hosts.gat_seed_batch import SeedBatchedGAT
from tests.harness.test_seed_batch import data_root, lone_built  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("data_root")


def one_step(data_root, *, fold: bool, monkeypatch, seeds=(0, 1, 2)):
    """One training forward and backward of a SeedBatchedGAT as on CUDA, then an unmeasured validation forward:
    (training logits, validation logits, each stacked parameter's gradient, the kernels folded per call)."""
    _, _, built = lone_built(list(seeds), data_root)
    dm = built[0][0]
    dm.setup()
    graph = dm.graph
    groups = graph_groups(graph.edge_index, graph.num_nodes)
    models = [m.model for _, m in built]
    generators = [m.noise.on(torch.device("cpu")) for m in models]
    folded = []

    def rule(kernels):
        answer = fold and folds_heads(kernels)
        folded.append(answer)
        return answer

    monkeypatch.setattr(gat_seed_batch, "folds_heads", rule)
    host = SeedBatchedGAT(models).train()
    train = graph.train_mask.nonzero().squeeze(1)
    with behave_as_cuda():
        traces = [[] for _ in seeds]
        logits = host(graph.x, groups, traces, generators)
        loss = sum(torch.nn.functional.cross_entropy(seed[train], graph.y[train]) for seed in logits)
        loss.backward()
        host.eval()
        with torch.no_grad(), mechanism_diagnostics(False):
            val = host(graph.x, groups, [[] for _ in seeds])
    return logits.detach(), val, [p.grad.clone() for p in host.host], folded, traces


def assert_fold_equals_the_per_seed_loop(data_root, monkeypatch):
    folded_run = one_step(data_root, fold=True, monkeypatch=monkeypatch)
    loop_run = one_step(data_root, fold=False, monkeypatch=monkeypatch)
    assert folded_run[3] == [True, True, True, True] and loop_run[3] == [False] * 4  # 2 layers, training and validation
    for a, b in zip(folded_run[:2], loop_run[:2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(folded_run[2], loop_run[2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * b.abs().max().item())
    return folded_run, loop_run


def test_softmaxs_folded_call_equals_the_per_seed_cuda_loop(data_root, monkeypatch):
    folded_run, loop_run = assert_fold_equals_the_per_seed_loop(data_root, monkeypatch)
    # each seed's trace: its own kernel and its own slice of the weights, as the per-seed loop's
    assert len({id(trace[0][0]) for trace in folded_run[4]}) == 3  # each seed's own kernel module
    for folded_trace, loop_trace in zip(folded_run[4], loop_run[4]):
        assert [type(k) for k, _ in folded_trace] == [type(k) for k, _ in loop_trace]
        for (_, a), (_, b) in zip(folded_trace, loop_trace):
            assert not a.aux_losses and not a.diagnostics
            torch.testing.assert_close(a.weights, b.weights, rtol=1e-5, atol=1e-7)


def test_a_fold_that_mixes_the_seeds_fails_the_check(data_root, monkeypatch):
    """The planted defect: the folded weights handed back with the seeds in the wrong order."""
    real = SeedBatchedGAT._folded_weights
    monkeypatch.setattr(SeedBatchedGAT, "_folded_weights", lambda self, *a: real(self, *a).flip(1))
    with pytest.raises(AssertionError):
        assert_fold_equals_the_per_seed_loop(data_root, monkeypatch)


def kernels(name, seeds=3, heads=8):
    return [build_attention(name, num_heads=heads, head_dim=8, site=SITE) for _ in range(seeds)]


def test_which_kernels_fold():
    """Softmax in training and in an unmeasured evaluation folds; a measured call, a kernel with parameters or
    buffers, a stochastic one, one that does not declare independent heads, or a mix of configs does not."""
    soft = kernels("softmax")
    assert folds_heads(soft)
    for k in soft:
        k.eval()
    assert not folds_heads(soft)  # evaluation with diagnostics on: entropy, support, the q/k distance
    with mechanism_diagnostics(False):
        assert folds_heads(soft)
    assert not folds_heads(kernels("entmax"))  # a learned α per head
    assert not folds_heads(kernels("bam-weibull"))  # stochastic, with parameters
    assert not folds_heads(kernels("sparsemax"))  # undeclared: keeps state between calls, measures in training

    class Undeclared(AttentionKernel):
        name = "undeclared"

        def normalize(self, logits, groups, *, q, k):
            return AttentionResult(groups.softmax(logits))

    from modules.attention.kernel import AttentionConfig, HeadShape

    plugin = [Undeclared(AttentionConfig(), HeadShape(8, 8, SITE)) for _ in range(3)]
    assert not folds_heads(plugin)
    Declared = type("Declared", (Undeclared,), {"independent_heads": True})
    assert folds_heads([Declared(AttentionConfig(), HeadShape(8, 8, SITE)) for _ in range(3)])
    assert not folds_heads([Declared(AttentionConfig(), HeadShape(8, 8, SITE))] + plugin)  # not one class


@pytest.mark.parametrize("dim", [0, 1])
def test_seed_dropout_draws_each_seeds_lone_mask(dim):
    """Each seed's mask, drawn into the batch's one buffer, is bit for bit its lone run's `gat.dropout` draw, with the
    seeds first (host features) or second (the folded weights [E, S, H])."""
    from modules.hosts import gat

    x = torch.rand(3, 50, 4) if dim == 0 else torch.rand(50, 3, 4)
    out = gat_seed_batch.seed_dropout(x, 0.6, True, [torch.Generator().manual_seed(s) for s in range(3)], dim=dim)
    for s in range(3):
        lone = gat.dropout(x.select(dim, s).contiguous(), 0.6, True, torch.Generator().manual_seed(s))
        assert torch.equal(out.select(dim, s), lone)
    assert not torch.equal(out.select(dim, 0) != 0, out.select(dim, 1) != 0)


def test_a_folded_seed_batch_epochs_ops_barely_grow_with_its_seeds(data_root):
    """Ops per epoch of a Cora seed batch as on CUDA (its own loop, unmeasured epochs 8 and 9), 1 and 3 seeds: with the
    kernel calls folded an extra seed costs its own mask draws and its share of the loop (measured: 10 ops a seed), not
    its own kernel calls forward and backward (61 a seed with the per-seed loop)."""
    from harness.studies import gpu_cost

    one = gpu_cost.count_epochs(lambda n: gpu_cost._batch_run(n, data_root, 1), (8, 10))
    three = gpu_cost.count_epochs(lambda n: gpu_cost._batch_run(n, data_root, 3), (8, 10))
    assert (three.ops - one.ops) / 2 <= 20, (one.ops, three.ops)
