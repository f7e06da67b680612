"""One place decides device behaviour (modules/device_policy.py): a CPU run "as on CUDA" takes every CUDA branch,
a plain CPU run the CPU's own, and path selection is the backend table's (modules/attention/backends.py)."""

from __future__ import annotations

import types

import pytest
import torch

from modules.attention import AttentionSite, DenseGroups, SegmentGroups, build_attention
from modules.attention.backends import BACKENDS, Call, offered_paths, select_path
from modules.attention.kernel import FusedAttention, query_block_rows
from modules.device_policy import as_on_cuda, behave_as_cuda, host_reads_are_cheap, takes_cpu_path, takes_cuda_path


def kernel_for(name: str, heads: int = 2, dim: int = 16):
    torch.manual_seed(0)
    return build_attention({"name": name}, num_heads=heads, head_dim=dim, site=AttentionSite("text", "self", sequence=True))


def test_the_policy_answers_by_device_and_as_on_cuda():
    cpu = torch.zeros(1)
    assert not as_on_cuda() and takes_cpu_path(cpu) and host_reads_are_cheap(cpu) and not takes_cuda_path(cpu)
    assert takes_cuda_path("cuda") and not host_reads_are_cheap(torch.device("cuda")) and not takes_cpu_path("cuda")
    assert not takes_cpu_path("mps") and not takes_cuda_path("mps")  # other accelerators take neither CPU form
    with behave_as_cuda():
        assert as_on_cuda() and takes_cuda_path(cpu) and not takes_cpu_path(cpu) and not host_reads_are_cheap(cpu)
        with behave_as_cuda(False):
            assert takes_cpu_path(cpu)
        assert takes_cuda_path(cpu)
    assert not as_on_cuda()


def test_triton_kernels_run_on_cuda_on_fake_tensors_as_on_cuda_and_inside_triton_kernels_anywhere(monkeypatch):
    """Real CPU tensors as on CUDA keep the torch forms (a Triton kernel cannot run on them); a fake tensor as on CUDA
    takes the Triton path (the launches are custom ops whose fake forms run); without Triton, nothing does."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from modules import device_policy

    monkeypatch.setattr(device_policy, "triton_installed", lambda: True)
    cpu = torch.zeros(2)
    with FakeTensorMode():
        fake = torch.zeros(2)
    assert not device_policy.takes_triton_path(cpu) and not device_policy.takes_triton_path(fake)
    assert device_policy.takes_triton_path(torch.device("cuda"))
    with behave_as_cuda():
        assert not device_policy.takes_triton_path(cpu) and device_policy.takes_triton_path(fake)
    with device_policy.triton_kernels_anywhere():
        assert device_policy.takes_triton_path(cpu)
    monkeypatch.setattr(device_policy, "triton_installed", lambda: False)
    with behave_as_cuda(), device_policy.triton_kernels_anywhere():
        assert not device_policy.takes_triton_path(fake) and not device_policy.takes_triton_path(torch.device("cuda"))


def test_query_blocks_follow_the_policy(monkeypatch):
    """A row-separable kernel's eager call runs in query blocks on the CUDA path when its weights pass the budget:
    on CPU tensors too under the policy, never without it."""
    monkeypatch.setenv("ATTNBENCH_WEIGHTS_BUDGET_MB", "0.001")  # 1 KiB: a [1, 2, 64, 64] float32 tensor passes it
    kernel = kernel_for("sparsemax")
    q = torch.zeros(1, 2, 64, 16)
    assert query_block_rows(kernel, DenseGroups(), q, q) is None
    with behave_as_cuda():
        assert query_block_rows(kernel, DenseGroups(), q, q) == 16  # at least 16 rows a block


def test_graph_adam_is_fused_on_the_cuda_path_only():
    from modules.lit.optimization import graph_adam

    params = [torch.nn.Parameter(torch.zeros(3))]
    assert not graph_adam([{"params": params}], 1e-3, torch.device("cpu")).defaults.get("fused")
    with behave_as_cuda():
        assert graph_adam([{"params": params}], 1e-3, torch.device("cpu")).defaults.get("fused")


def test_the_point_sort_and_all_valid_read_are_the_cpu_s_only_off_the_cuda_path(monkeypatch):
    from modules.attention import diagnostics

    values = torch.randn(2, 33, 3, generator=torch.Generator().manual_seed(0))
    calls = []
    import numpy as np

    real_sort = np.sort
    monkeypatch.setattr(np, "sort", lambda *a, **k: calls.append(1) or real_sort(*a, **k))
    expected = values.sort(dim=1).values
    assert torch.equal(diagnostics._sorted_points(values), expected) and calls == [1]
    valid = torch.ones(4, dtype=torch.bool)
    assert diagnostics._all_valid_on_cpu(valid)
    with behave_as_cuda():
        assert torch.equal(diagnostics._sorted_points(values), expected) and calls == [1]  # torch's sort, as on a GPU
        assert not diagnostics._all_valid_on_cpu(valid)  # no host read


def test_select_path_is_the_table_s_first_chosen_backend():
    q = torch.zeros(1, 2, 4, 16)
    plain = FusedAttention(q, q, 0.25)
    assert select_path(plain, DenseGroups(), q, need_weights=False) == "sdpa"
    assert select_path(plain, DenseGroups(), q, need_weights=True) == "eager"
    assert select_path(None, DenseGroups(), q, need_weights=False) == "eager"
    library = FusedAttention(None, None, 0.25, library=types.SimpleNamespace(path="adasplash", fits=lambda v: True, run=None))
    assert select_path(library, DenseGroups(), q, need_weights=False) == "adasplash"
    assert select_path(library, DenseGroups(), q, need_weights=False, dropout_p=0.1) == "eager"  # never SDPA: no softmax form
    assert [b.path for b in BACKENDS] == ["library", "flex", "sdpa", "blocked", "eager"]


@pytest.mark.parametrize("name, expected", [("softmax", ["sdpa"]), ("sparsemax", ["blocked"]), ("entmax", ["blocked"]),
                                            ("gmm", ["sdpa"]), ("fenchel-exact", [])])
def test_offered_paths_list_what_a_kernel_offers_whatever_the_device(name, expected):
    """What gpu-perf's correctness check runs against eager: on this CPU, without AdaSplash's form (it is built only
    where it can run) and without FlexForms (built only where FlexAttention is asked for)."""
    kernel = kernel_for(name)
    q = torch.randn(1, 2, 8, 16)
    fused = kernel.fused_attention(q, q, DenseGroups(), scale=0.25)
    assert offered_paths(kernel, fused, DenseGroups(), q) == expected
    assert "blocked" not in offered_paths(kernel, fused, SegmentGroups(torch.arange(3), torch.arange(3), 3), q)


def test_gpu_perf_reads_the_table():
    """gpu-perf's fused paths are the table's offered paths (no second copy of select_path's rules)."""
    from harness.studies import gpu_perf

    kernel = kernel_for("bam-weibull", heads=2, dim=gpu_perf.DIM)
    q = torch.randn(1, 2, 8, gpu_perf.DIM)
    groups = DenseGroups()
    fused = kernel.fused_attention(q, q, groups, scale=gpu_perf.DIM ** -0.5)
    expected = ["sdpa+blocks" if p == "blocked" and fused is not None else p for p in offered_paths(kernel, fused, groups, q)]
    assert list(gpu_perf._fused_paths(kernel, q, q, groups)) == expected


def test_the_seed_batch_figures_are_named_as_what_they_are():
    """A batched record's time per epoch is its seed's share; the batch epoch is its execution's batch_epoch_s."""
    from harness.studies.gpu_perf import batch_epoch_figures

    records = [types.SimpleNamespace(time_per_epoch_s=0.0124, execution={"batch_epoch_s": 0.248}) for _ in range(20)]
    assert batch_epoch_figures(records) == (0.248, 0.0124)
    older = [types.SimpleNamespace(time_per_epoch_s=0.0124, execution={}) for _ in range(20)]
    assert batch_epoch_figures(older) == pytest.approx((0.248, 0.0124))


@pytest.mark.parametrize("layout", ["graph", "dense padded"])
def test_the_qk_distance_s_all_valid_shortcut_gives_the_masked_path_s_bits(monkeypatch, layout):
    """The CPU's all-valid shortcut (skipped as on CUDA) changes no bit of the distance: patched where it now lives
    (modules/attention/diagnostics.py; kernel.py re-exports the name only)."""
    from modules.attention import diagnostics

    g = torch.Generator().manual_seed(2)
    if layout == "graph":
        n = 300
        dst = torch.arange(n)
        groups = SegmentGroups(dst.flip(0), dst, n)
        q, k = torch.randn(n, 4, 8, generator=g), 2 * torch.randn(n, 4, 8, generator=g) + 1
    else:
        valid = torch.ones(3, 40, dtype=torch.bool)
        valid[1, 31:] = False
        groups = DenseGroups.from_key_padding(valid)
        q, k = torch.randn(3, 4, 40, 8, generator=g), torch.randn(3, 4, 40, 8, generator=g) + 0.5
    fast = diagnostics.qk_distance(q, k, groups)
    with behave_as_cuda():
        assert torch.equal(diagnostics.qk_distance(q, k, groups), fast)
    monkeypatch.setattr(diagnostics, "_all_valid_on_cpu", lambda valid: False)
    assert torch.equal(diagnostics.qk_distance(q, k, groups), fast)
