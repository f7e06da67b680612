"""Mechanism diagnostics (issue 35): every variant declares them, they are kept as train and validation curves and
final values in the record, and they change no training number (same draws, same losses, same metrics)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.plan.spec import make_spec
from harness.results.record import Status
from harness.run.runner import execute
from harness.run.seed_batch import execute_batch
from modules.attention import attention_entry, list_attentions
from modules.attention.contract import check_mechanism_diagnostics
from modules.attention.kernel import mechanism_diagnostics

VARIANTS = list_attentions()
COMPARED = ("softmax", "align-gan", "bam-weibull")
TRAINING_NUMBERS = ("train/loss", "val/loss", "val/acc")


@pytest.fixture
def data_root():
    root = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if not (root / "planetoid").exists():
        pytest.skip("needs the Planetoid data under ../shared/data")
    return str(root)


@pytest.fixture
def full_history(monkeypatch):
    """Per-epoch rows instead of the compacted curves, so that every epoch's numbers are compared."""
    from harness.run import callbacks, seed_batch

    monkeypatch.setattr(callbacks.History, "compact", lambda self: list(self.epochs))
    monkeypatch.setattr(seed_batch, "_compact", lambda rows: list(rows))


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_declares_well_formed_diagnostics_and_reports_them(name):
    """modules/attention/contract.py's check, which `attnbench check` runs on a plugin that declares a mechanism."""
    assert attention_entry(name).cls.mechanism, f"{name} declares no mechanism diagnostic"
    check_mechanism_diagnostics(name)


def test_qk_distance_is_zero_for_equal_clouds_and_grows_with_their_gap():
    from modules.attention import SegmentGroups
    from modules.attention.kernel import qk_distance

    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 2, 8, generator=g)
    groups = SegmentGroups(torch.arange(500), torch.arange(500), 500)
    assert float(qk_distance(x, x, groups)) == 0.0
    near, far = (float(qk_distance(x, x + shift, groups)) for shift in (0.2, 2.0))
    assert 0 < near < far
    # scale-free: the same clouds at another scale are as far apart
    assert float(qk_distance(10 * x, 10 * (x + 2.0), groups)) == pytest.approx(far, rel=1e-5)


def _numbers(record):
    return record.metrics, [{k: row[k] for k in TRAINING_NUMBERS if k in row} for row in record.history]


@pytest.mark.parametrize("variant", COMPARED)
def test_a_lone_run_is_the_same_with_diagnostics_on_and_off(data_root, full_history, variant):
    spec = make_spec("cora", variant, 0, {"max_epochs": 3})
    on = execute(spec, data_root=data_root)
    with mechanism_diagnostics(False):
        off = execute(spec, data_root=data_root)
    assert on.status is Status.OK and off.status is Status.OK, (on.error, off.error)
    assert _numbers(on) == _numbers(off)
    assert on.best_epoch == off.best_epoch
    for d in attention_entry(variant).cls.mechanism:
        # training steps measure what their declaration says; validation and the test pass measure everything, and
        # the test pass's value (at the evaluated weights) is the one the mechanism rules read
        assert all((f"diag/{d.name}" in row) == d.in_training and f"val/diag/{d.name}" in row for row in on.history), d.name
        assert f"test/diag/{d.name}" in on.diagnostics and f"val/diag/{d.name}" in on.diagnostics, d.name
    assert not any(k.startswith("diag/") for row in off.history for k in row)
    assert not any(k.startswith("test/diag/") for k in off.diagnostics)


@pytest.mark.parametrize("variant", COMPARED)
def test_a_seed_batch_is_the_same_with_diagnostics_on_and_off(data_root, full_history, variant):
    specs = [make_spec("cora", variant, seed, {"max_epochs": 3}) for seed in (0, 1)]
    on = execute_batch(specs, data_root=data_root, on_record=lambda r: None)
    with mechanism_diagnostics(False):
        off = execute_batch(specs, data_root=data_root, on_record=lambda r: None)
    for a, b in zip(on, off):
        assert a.status is Status.OK and b.status is Status.OK, (a.error, b.error)
        assert _numbers(a) == _numbers(b)
        assert any(k.startswith("val/diag/") for k in a.diagnostics)
        assert {k for k in a.diagnostics if k.startswith("test/diag/")} == {f"test/diag/{d.name}" for d in attention_entry(variant).cls.mechanism}
    # and a batched seed's curves are its lone run's (train curves bit for bit; the validation pass is the same maths)
    lone = execute(specs[0], data_root=data_root)
    for row, lone_row in zip(on[0].history, lone.history):
        for name in (k for k in lone_row if k.startswith("diag/")):
            assert row[name] == pytest.approx(lone_row[name], rel=1e-6), name
        for name in (k for k in lone_row if k.startswith("val/diag/")):
            assert row[name] == pytest.approx(lone_row[name], rel=1e-5), name


def test_the_cpu_point_sort_is_torchs_order():
    from modules.attention.kernel import _sorted_points

    values = torch.randn(3, 257, 5, generator=torch.Generator().manual_seed(1))
    values[0, :7] = float("inf")  # masked points sort last
    assert torch.equal(_sorted_points(values), values.sort(dim=1).values)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):  # NumPy has no bf16: CPU autocast gives it
        assert torch.equal(_sorted_points(values.to(dtype)), values.to(dtype).sort(dim=1).values)


@pytest.mark.parametrize("layout", ["graph", "graph with a keyless node", "dense", "dense padded"])
def test_qk_distance_s_cpu_shortcuts_for_all_valid_points_give_the_masked_path_s_bits(monkeypatch, layout):
    """Where every point is valid the CPU skips the masking passes (a third of a Cora layer's diagnostic): its value must
    be the masked computation's, bit for bit, since the records' curves were computed that way."""
    from modules.attention import DenseGroups, SegmentGroups, diagnostics
    from modules.attention.kernel import qk_distance

    g = torch.Generator().manual_seed(2)
    if layout.startswith("graph"):
        n = 300
        dst = torch.arange(n) if layout == "graph" else torch.arange(1, n)  # node 0 then sends no edge: not a key
        groups = SegmentGroups(dst.flip(0), dst, n)
        q, k = torch.randn(n, 4, 8, generator=g), 2 * torch.randn(n, 4, 8, generator=g) + 1
    else:
        valid = torch.ones(3, 40, dtype=torch.bool)
        if layout == "dense padded":
            valid[1, 31:] = False
        groups = DenseGroups.from_key_padding(valid)
        q, k = torch.randn(3, 4, 40, 8, generator=g), torch.randn(3, 4, 40, 8, generator=g) + 0.5
    fast = qk_distance(q, k, groups)
    monkeypatch.setattr(diagnostics, "_all_valid_on_cpu", lambda valid: False)  # where qk_distance reads it
    assert torch.equal(fast, qk_distance(q, k, groups))


TINY_TEXT = {"depth": 1, "width": 32, "heads": 2, "max_length": 32, "max_train_examples": 64, "max_val_examples": 32,
             "max_epochs": 2, "batch_size": 16}


@pytest.mark.parametrize("variant", ["softmax", "align-ct", "bam-weibull"])
def test_a_text_run_keeps_mechanism_curves_and_the_same_numbers_without_them(data_root, full_history, variant):
    """The minibatch hosts (GLUE here; VQA and captioning log the same way) keep the mechanism diagnostics as
    train and validation curves, as the graph host does; computing them changes no training number."""
    if not (Path(data_root) / "glue" / "RTE").exists():
        pytest.skip("needs GLUE RTE under ../shared/data")
    spec = make_spec("glue-rte", variant, 0, TINY_TEXT)
    on = execute(spec, data_root=data_root)
    with mechanism_diagnostics(False):
        off = execute(spec, data_root=data_root)
    assert on.status is Status.OK and off.status is Status.OK, (on.error, off.error)
    assert _numbers(on) == _numbers(off)
    for d in attention_entry(variant).cls.mechanism:
        assert all((f"diag/{d.name}" in row) == d.in_training and f"val/diag/{d.name}" in row for row in on.history), d.name
        assert f"test/diag/{d.name}" in on.diagnostics, d.name
    assert not any(k.startswith(("diag/", "val/diag/")) for row in off.history for k in row)


@pytest.mark.parametrize("variant", ["fenchel", "gmm"])
def test_a_fused_text_run_keeps_the_alpha_curve(data_root, variant):
    """fenchel and gmm run fused (SDPA) on the text hosts: α, a parameter read, is still kept as a curve (fenchel's
    prior_tv needs the weights: only its test pass, which asks for them, reports it)."""
    if not (Path(data_root) / "glue" / "RTE").exists():
        pytest.skip("needs GLUE RTE under ../shared/data")
    record = execute(make_spec("glue-rte", variant, 0, TINY_TEXT), data_root=data_root)
    assert record.status is Status.OK, record.error
    assert "sdpa" in (record.execution or {}).get("attention_paths", [])
    assert "diag/alpha" in record.history and "val/diag/alpha" in record.history


def test_a_long_graph_fit_measures_validation_diagnostics_on_its_cadence_and_the_test_pass_always(data_root):
    """Issue 51's cost bound: after the first 8 epochs the validation pass measures the diagnostics every 8th epoch
    (modules/lit/attention_terms.py), so a curve keeps points while the evidence comes from the test pass."""
    from modules.lit.attention_terms import DIAGNOSED_EVERY, diagnosed_validation

    assert [e for e in range(24) if diagnosed_validation(e)] == [*range(DIAGNOSED_EVERY), 15, 23]
    record = execute(make_spec("cora", "softmax", 0, {"max_epochs": 12, "patience": 100}), data_root=data_root)
    assert record.status is Status.OK, record.error
    measured = [e for e, value in zip(record.history["epoch"], record.history["val/diag/qk_distance"]) if value is not None]
    assert measured == [1, 2, 3, 4, 5, 6, 7, 8]  # 1-based epochs; the 16th would be next
    assert "test/diag/qk_distance" in record.diagnostics


def test_bams_evaluated_noise_comes_from_its_own_stream():
    """At evaluation BAM uses the mean weights; the draw its sample_tv measures there must leave the run's noise
    stream where it was (so no training number changes) and be the same for the same weights."""
    from modules.attention import build_attention
    from modules.attention.contract import make_problem, segment_weights

    kernel = build_attention({"name": "bam-weibull", "k": 5.0}, num_heads=2, head_dim=4).eval()
    p = make_problem()
    state = torch.get_rng_state()
    first = segment_weights(kernel, p).diagnostics["sample_tv"]
    assert torch.equal(state, torch.get_rng_state())
    assert float(first) > 0.01 and torch.equal(first, segment_weights(kernel, p).diagnostics["sample_tv"])
