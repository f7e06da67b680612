"""Issue 37: a row-separable variant's eager call may run in query blocks, each recomputed in the backward
(kernel.py `query_block_rows`), so that long sequences on a GPU never hold all the L x L weights. Blocks are
another way to compute the same call: output, gradients (of q, k, v and the kernel's own parameters), aux
losses and diagnostics equal the whole call's. Parametrised over every registered variant that declares
itself row-separable, plugins included."""

from __future__ import annotations

import pytest
import torch

from modules.attention import DenseGroups, attention_entry, list_attentions
from modules.attention import contract
from modules.attention.contract import SCALE, kernel_for, make_problem
from modules.attention.kernel import query_block_rows, query_blocks

ROW_SEPARABLE = [name for name in list_attentions() if getattr(attention_entry(name).cls, "row_separable", False)]


def test_the_materialising_builtins_are_row_separable():
    assert {"sparsemax", "entmax15", "entmax", "bam-weibull", "bam-lognormal"} <= set(ROW_SEPARABLE)
    # gmm's EM sums over queries per key, and fenchel-exact's solver couples rows: neither may be split by queries
    assert not {"gmm", "fenchel-exact"} & set(ROW_SEPARABLE)


@pytest.mark.parametrize("name", ROW_SEPARABLE)
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("kind", ["padded", "causal", "unmasked"])
def test_query_blocks_compute_the_whole_call(name, mode, kind):
    contract.check_query_blocks(name, modes=(mode == "train",), kinds=(kind,))


@pytest.mark.parametrize("name", ["bam-lognormal", "bam-weibull"])
def test_the_recomputation_draws_what_the_forward_drew_and_leaves_the_stream_alone(name):
    """A run's own noise stream (the graph host sets one) is outside checkpoint's RNG preservation: the backward's
    recomputation must replay each block's draws, or the gradients would belong to other samples, and must not
    rewind the stream, or the next step would repeat them."""
    p = make_problem(length=7)
    kernel = kernel_for(name).train()
    kernel.noise_generator = torch.Generator().manual_seed(5)
    _, out, _, grads = contract.blocked_call(kernel, p, p.dense, 3, with_aux=False)  # the KL's gradient does not depend on the draws
    after_forward_and_backward = kernel.noise_generator.get_state()

    # the reference: the same blocks in order, from the same stream, without checkpointing
    kernel.noise_generator = torch.Generator().manual_seed(5)
    q, k, v = (t.clone().requires_grad_() for t in (p.q, p.k, p.v))
    parts = [kernel._eager(q[..., rows, :], k, v, p.dense.query_rows(rows), SCALE, 0.0)[0]
             for rows in (slice(0, 3), slice(3, 6), slice(6, 7))]
    assert torch.equal(kernel.noise_generator.get_state(), after_forward_and_backward)
    reference = torch.cat(parts, dim=-2)
    torch.testing.assert_close(out, reference, atol=0, rtol=0)
    params = [t for t in kernel.parameters() if t.requires_grad]
    reference_grads = torch.autograd.grad(reference.square().sum(), [q, k, v, *params], allow_unused=True)
    for a, b in zip(grads, reference_grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_blocks_are_chosen_on_cuda_by_the_weights_size_only_when_forced_elsewhere(monkeypatch):
    p = make_problem(length=7)
    kernel = kernel_for("sparsemax")
    assert query_block_rows(kernel, p.dense, p.q, p.k) is None  # CPU: the whole call, as before
    with query_blocks(4):
        assert query_block_rows(kernel, p.dense, p.q, p.k) == 4
        assert query_block_rows(kernel_for("gmm"), p.dense, p.q, p.k) is None  # not row-separable
        assert query_block_rows(kernel, p.segment, p.q, p.k) is None  # graphs' segments are not split
    with query_blocks(7):
        assert query_block_rows(kernel, p.dense, p.q, p.k) is None  # one block is the whole call

    class OnCuda:  # the shape arithmetic of the CUDA rule, without a GPU
        def __init__(self, shape):
            self.shape, self.is_cuda = shape, True

    monkeypatch.setenv("ATTNBENCH_WEIGHTS_BUDGET_MB", "1024")
    q, k = OnCuda((32, 12, 512, 64)), OnCuda((32, 12, 512, 64))
    assert query_block_rows(kernel, DenseGroups(), q, k) is None  # 0.4 GB: whole, as measured at L = 512
    q, k = OnCuda((4, 12, 8192, 64)), OnCuda((4, 12, 8192, 64))
    rows = query_block_rows(kernel, DenseGroups(), q, k)
    assert rows is not None and 4 * 4 * 12 * 8192 * rows <= 2**30 < 4 * 4 * 12 * 8192 * (rows + 1)
