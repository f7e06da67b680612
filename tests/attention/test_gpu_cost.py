"""Counts of what a GPU would run, taken on the CPU (harness/studies/gpu_cost.py): host syncs of every variant's
forward+backward on its CUDA path, of a Cora training step, and of a seed batch's epoch as its seed count grows;
and the counter itself on calls whose counts are known. Counts only: nothing here is timed."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

from harness.studies import gpu_cost
from modules.attention import list_attentions

DATA_ROOT = os.environ.get("ATTNBENCH_DATA")

PENDING_SYNCS: dict[str, str] = {}
"""Variants whose forward+backward on the CUDA path still reads the host without declaring why (`host_syncs_why`),
with what reads: each an expected failure until its fix lands (strict: a fix that lands turns it into a failure to
remove from here)."""


def _sync_cases():
    for name in sorted(list_attentions()):
        marks = [pytest.mark.xfail(strict=True, reason=PENDING_SYNCS[name])] if name in PENDING_SYNCS else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", _sync_cases())
def test_a_forward_backward_on_the_cuda_path_reads_nothing_on_the_host_unless_declared(name):
    """Real tensors (B = H = 2, L = 128: AdaSplash's unmasked length, where sparsemax and entmax15 take it when it is
    installed), every device branch on its CUDA form. A variant that must read says why in `host_syncs_why`."""
    counter, _, path = gpu_cost.count_step(name, 128, 2, fake=False, heads=2)
    syncs = sum(counter.syncs.values())
    declared = getattr(gpu_cost._build(name, 2), "host_syncs_why", None)
    if declared:
        assert isinstance(declared, str) and len(declared.split()) >= 4, "say why the variant reads the host"
        return
    assert syncs == 0, f"{name} ({path}) reads the host: " + "; ".join(f"{n} x {what} at {where}" for (what, where), n in counter.syncs.items())


def test_the_counter_counts_sdpa_as_cuda_runs_it():
    """Softmax: one fused launch each way, flash's saved set exactly (q, k, v, out, logsumexp), no sync; a bias sends
    it to the memory-efficient kernel, a head dimension of 65 to the math path."""
    counter, saved, path = gpu_cost.count_step("softmax", 256, 2)
    row = gpu_cost.Count("softmax", 256, 2)
    assert path == "sdpa" and counter.by_kernel["sdpa flash forward"] == 1 and counter.by_kernel["sdpa flash backward"] == 1
    assert saved == (4 * 2 * 12 * 256 * 64 + 2 * 12 * 256) * gpu_cost.FLOAT_BYTES == row.flash_ideal
    assert not counter.syncs
    q = torch.zeros(1, 1, 4, 64)
    assert gpu_cost.cuda_sdpa_backend(q, None) == "flash"
    assert gpu_cost.cuda_sdpa_backend(q, torch.zeros(1, 1, 4, 4)) == "efficient"
    assert gpu_cost.cuda_sdpa_backend(torch.zeros(1, 1, 4, 65), None) == "math"
    assert gpu_cost.cuda_sdpa_backend(q, None, v=torch.zeros(1, 1, 4, 32)) == "efficient"  # flash needs one width
    # the gradients come back in q, k and v's layout, as CUDA's fused backwards allocate them: no leaf copy, so the
    # step is the two launches and the upstream gradient (ones_like)
    assert counter.kernels == 3, dict(counter.by_kernel)


def test_a_bias_that_needs_a_gradient_costs_its_full_size_gradient_as_on_cuda():
    """CUDA's memory-efficient backward writes a bias's gradient at [B, H, Lq, Lk] (the bias expanded), which autograd
    sums to the bias's shape: a [1, H, L, L] bias at B = 4 costs four of its size written, then read by the sum."""
    batch, heads, length, dim = 4, 2, 32, 64
    counter = gpu_cost.CostCounter(where=False)
    q, k, v = (torch.randn(batch, heads, length, dim, requires_grad=True) for _ in range(3))
    bias = torch.zeros(1, heads, length, length, requires_grad=True)
    with counter, gpu_cost.CudaSDPA(counter):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        out.backward(torch.ones_like(out))
    assert counter.by_kernel["sdpa efficient backward"] == 1
    assert counter.by_kernel["sum (the bias gradient to the bias's shape)"] == 1
    element, tensor = gpu_cost.FLOAT_BYTES, batch * heads * length * dim
    full, own = batch * heads * length * length, heads * length * length
    forward = (3 * tensor + own + tensor) * element + batch * heads * length * element
    backward = (3 * tensor + own + tensor + batch * heads * length + tensor) * element + (3 * tensor + full) * element
    assert counter.bytes == tensor * element + forward + backward + (full + own) * element  # ones_like, fwd, bwd, sum
    assert bias.grad is not None and bias.grad.shape == bias.shape


def test_the_counter_charges_each_kernel_what_it_moves():
    """A copy writes its destination (not read); a gather reads what it returns; a scatter into a tensor reads and
    writes where its source lands; a new tensor like another reads nothing of it; an in-place add reads and writes."""
    big = torch.zeros(1000, 64)
    rows = torch.arange(10)
    small = torch.ones(10, 64)
    element = gpu_cost.FLOAT_BYTES
    cases = [
        (lambda: big.clone().copy_(big), 2 * 64000 * element + 2 * 64000 * element),  # the clone, then the copy
        (lambda: big.index_select(0, rows), 2 * 640 * element + 10 * 8),
        (lambda: big.index_add_(0, rows, small), 10 * 8 + 640 * element + 2 * 640 * element),
        (lambda: big.new_zeros(5), 5 * element),
        (lambda: big.add_(big), 3 * 64000 * element),
    ]
    for run, expected in cases:
        counter = gpu_cost.CostCounter(where=False)
        with counter:
            run()
        assert counter.bytes == expected, (counter.by_kernel, counter.bytes, expected)


def test_a_triton_launch_s_custom_op_counts_as_one_kernel_reading_its_arguments_and_writing_its_results():
    """The project wraps each Triton launch in a custom op (attnbench::*): counted as one kernel, its tensor arguments
    read once, its results written once, a buffer it fills (a mutated argument) written once; its FLOPs where a
    formula is registered, else the launch is named among those left out."""
    pytest.importorskip("triton")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from modules.attention import adasplash_full_length, triton_entmax

    element = gpu_cost.FLOAT_BYTES
    with FakeTensorMode():
        q, k, v = (torch.zeros(2, 3, 128, 64) for _ in range(3))
        alpha = torch.zeros(3)
        taus = torch.zeros(2, 3, 128)
        counter = gpu_cost.CostCounter(where=False)
        with counter:
            tau = triton_entmax.entmax_tau(q, k, alpha, 0.125, 5)
            adasplash_full_length.adasplash_tau(q, k, taus, None, 1.5, 0.125, 5, False)
    assert tau.shape == (2, 3, 128) and counter.kernels == 2
    assert counter.by_kernel == {"attnbench::entmax_tau": 1, "attnbench::adasplash_tau": 1}
    tensor, rows = 2 * 3 * 128 * 64 * element, 2 * 3 * 128 * element
    # entmax_tau reads q, k, α and writes τ; adasplash_tau reads q, k and fills τ
    assert counter.bytes == (2 * tensor + 3 * element + rows) + (2 * tensor + rows)
    assert counter.flops == 2 * (1 + 5) * 2 * 2 * 3 * 128 * 128 * 64 and not counter.flops_unknown


def test_the_counter_sees_syncs_views_and_bytes():
    """Floating elements at bf16's 2 bytes, bools at 1; a view launches nothing; a host read and a boolean index
    are syncs."""
    counter = gpu_cost.CostCounter()
    x = torch.ones(4, 8)
    counter.track(x)
    with counter:
        y = x.view(32)  # a view: no kernel
        z = y * 2  # reads 32 floats, writes 32: 128 bytes
        bool(z.sum() > 0)  # sum (64 + 2 bytes), gt (2 + 1), and a read on the host
        z[z > 1]  # gt (64 + 32), then the index (64 + 32 + 64), a data-dependent size
    with counter, gpu_cost.HostReads(counter):
        z.tolist()  # a copy to the host: no ATen op on a CPU tensor, a sync on a GPU
    assert dict(counter.by_kernel) == {"aten::mul": 1, "aten::sum": 1, "aten::gt": 2, "aten::index": 1}
    assert counter.kernels == 5 and counter.ops > counter.kernels
    assert sorted(what for what, _ in counter.syncs) == ["boolean indexing", "copy to the host (.tolist())",
                                                         "value read on the host (.item(), bool(), float(), int())"]
    assert counter.bytes == 128 + 66 + 3 + 96 + 160
    assert 64 + 64 <= counter.peak <= 64 + 64 + 2 + 1 + 32 + 64


def test_spearman_and_the_measured_page_reader(tmp_path):
    assert gpu_cost.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert gpu_cost.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert gpu_cost.spearman([1, 2], [1, 2]) is None
    page = tmp_path / "gpu.md"
    page.write_text("## (b) Dense\n\n### L = 512, B = 32\n\n| variant | path | bf16 ms | × SDPA | fp32 ms | × SDPA | peak GiB bf16 | × SDPA |\n"
                    "|---|---|---:|---:|---:|---:|---:|---:|\n| softmax | sdpa | 2.7 | 1.00 | 21.7 | 1.00 | 0.53 | 1.00 |\n"
                    "| gmm | flex | 183.4 | 69.09 | 212.0 | 9.77 | 0.76 | 1.42 |\n| bam-weibull |  | OOM |  | OOM |  |  |  |\n\n## (c) Cora\n")
    found = gpu_cost.read_measured(page)
    assert found[(512, "gmm")] == {"path": "flex", "ms_ratio": 69.09, "peak_ratio": 1.42, "path_counted": None}
    assert found[(512, "bam-weibull")]["ms_ratio"] is None
    # a page that sets the cost page's prediction beside each row is read by the path counted for its own code
    page.write_text("## (b) Dense\n\n### L = 512, B = 32\n\n| variant | path | bf16 ms | × SDPA | fp32 ms | × SDPA | peak GiB bf16 "
                    "| × SDPA | path counted | bytes × (cost page) | peak × (cost page) |\n|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|\n"
                    "| align-ot | sdpa | 3.0 | 1.10 | 22.0 | 1.01 | 0.55 | 1.03 | sdpa+triton | 1.16 | 1.06 |\n")
    assert gpu_cost.read_measured(page)[(512, "align-ot")]["path_counted"] == "sdpa+triton"


def _tiny_lone_run(epochs: int) -> None:
    """A GAT on a Cora-like graph through Lightning, one training step and one validation pass per epoch."""
    import lightning as L
    from torch.utils.data import DataLoader

    from tests.modules.test_host_syncs import gat_host

    torch.manual_seed(0)
    module, graph = gat_host("softmax")
    loader = DataLoader([graph], batch_size=1, collate_fn=lambda items: items[0])
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)


PENDING_STEP = ""
"""Why a Cora training step still reads the host on the CUDA path, while a fix is pending ('' when none)."""


@pytest.mark.xfail(bool(PENDING_STEP), strict=True, reason=PENDING_STEP or "-")
def test_a_cora_training_step_reads_nothing_on_the_host():
    """Between Lightning's on_train_batch_start and on_train_batch_end (forward, backward, optimiser step), per epoch
    of the difference between a 2- and a 4-epoch fit, on the CUDA path (fused Adam, no host shortcuts)."""
    found = gpu_cost.count_epochs(_tiny_lone_run, (2, 4))
    assert found.step_syncs == 0, found.step_where


PENDING_BATCH = ""
"""Why a seed batch's syncs per epoch still grow with its seed count, while a fix is pending ('' when none)."""


@pytest.mark.skipif(not DATA_ROOT, reason="needs Cora (ATTNBENCH_DATA)")
@pytest.mark.xfail(bool(PENDING_BATCH), strict=True, reason=PENDING_BATCH or "-")
def test_a_seed_batch_s_syncs_per_epoch_do_not_grow_with_its_seeds():
    """Cora's seed batch (its own loop), 1 and 3 seeds, per epoch of the difference between a 1- and a 3-epoch fit."""
    one = gpu_cost.count_epochs(lambda n: gpu_cost._batch_run(n, DATA_ROOT, 1), (1, 3))
    three = gpu_cost.count_epochs(lambda n: gpu_cost._batch_run(n, DATA_ROOT, 3), (1, 3))
    assert three.syncs == one.syncs, (one.where, three.where)


def test_the_page_is_a_pure_function_of_the_counts():
    """The same counts give the same page and CSV, byte for byte (no time, no machine on them)."""
    counts = {(name, length): gpu_cost.Count(name, length, batch, "sdpa", 6, 0, {}, 1e9 * (i + 1), 2e8, 1e8, 9e10)
              for i, name in enumerate(["softmax", "gmm"]) for length, batch in gpu_cost.DENSE}
    first = gpu_cost.page_text(counts, None, []), gpu_cost.csv_text(counts)
    assert first == (gpu_cost.page_text(counts, None, []), gpu_cost.csv_text(counts))
    assert "| gmm: bytes touched ≤ 1.3× SDPA at L = 512 | 2.00× | NOT met |" in first[0]


def test_a_plugin_s_variant_reads_its_gpu_cost(tmp_path, capsys):
    """The README's plugin example, counted through `--plugin` as every command takes it: its row beside softmax's."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = re.search(r"```python\n(# my_variant\.py\n.*?)```", readme, re.S).group(1)
    plugin = tmp_path / "my_variant.py"
    plugin.write_text(example)
    from modules.attention.registry import ATTENTIONS

    before = set(list_attentions())
    try:
        assert gpu_cost.main(["--plugin", str(plugin), "--lengths", "512", "--variants", "softmax"]) == 0
        added = sorted(set(list_attentions()) - before)
        assert added, "the plugin registered no variant"
        capsys.readouterr()
        assert gpu_cost.main(["--plugin", str(plugin), "--lengths", "512", "--variants", added[0]]) == 0
        out = capsys.readouterr().out
        assert f"| {added[0]} | " in out and "| softmax | sdpa | 3 | 0 |" in out
    finally:  # the plugin's variant must not outlive the test: later tests count the registered variants
        for name in set(list_attentions()) - before:
            ATTENTIONS.unregister(name)


def test_an_unmeasured_validation_forward_on_cora_computes_no_diagnostic(monkeypatch):
    """A graph fit's validation passes between its measured ones (diagnostics off) log no diagnostic, so they compute
    none: no entropy, support or uniform entropy of the weights, fewer ops dispatched than a measured pass."""
    from modules.attention.groups import SegmentGroups
    from modules.attention.kernel import mechanism_diagnostics
    from tests.modules.test_host_syncs import gat_host

    torch.manual_seed(0)
    module, graph = gat_host("softmax")
    module.eval()
    reads = Counter()
    for name in ("entropy", "support"):
        real = getattr(SegmentGroups, name)
        monkeypatch.setattr(SegmentGroups, name, lambda self, w, _real=real, _name=name: reads.update([_name]) or _real(self, w))

    def ops(measured: bool) -> int:
        counter = gpu_cost.CostCounter(where=False, storage=False)
        with torch.no_grad(), mechanism_diagnostics(measured), counter:
            _, trace = module._forward(graph)
        assert all(("entropy" in result.diagnostics) == measured for _, result in trace)
        return counter.ops

    measured = ops(True)
    assert reads == {"entropy": 2, "support": 2}  # two GAT layers
    reads.clear()
    assert ops(False) < measured and not reads
