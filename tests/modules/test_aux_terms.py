"""The aux-loss bookkeeping every LightningModule shares (modules/lit/attention_terms.py), unit by unit: each
weighted term averaged over the layers that produce it, with each kernel's step or epoch schedule, the logged means, diagnostics, the
divergence check and Monte-Carlo sampling mode. test_training_loss.py checks the same sum end to end through
every host's training_step; this file is the fast one that mutation testing runs."""

from __future__ import annotations

import pytest
import torch

from modules.attention import AttentionResult
from modules.lit.attention_terms import trace_aux_loss, weighted_aux_loss

from .test_training_loss import KnownAuxAttention, KnownAuxByEpochAttention, KnownAuxByEpochConfig, KnownAuxConfig, _shape


def test_weighted_aux_loss_averages_weight_times_term_over_layers_and_logs_unweighted_means():
    first, second = (KnownAuxAttention(KnownAuxConfig(weight=w), _shape()) for w in (0.5, 2.0))
    results = [AttentionResult(None, {"known": torch.tensor(1.5), "unweighted": torch.tensor(4.0)}),
               AttentionResult(None, {"known": torch.tensor(-0.25), "unweighted": torch.tensor(8.0)})]
    total, logs = weighted_aux_loss(results, [first, second], step=1)
    assert total.item() == pytest.approx((0.5 * 2 * 1.5 + 2.0 * 2 * -0.25) / 2)
    assert {k: v.item() for k, v in logs.items()} == {"aux/known": pytest.approx(0.625), "aux/unweighted": 6.0}
    assert trace_aux_loss([], step=0) == (None, {})
    none, logs = weighted_aux_loss(results[:1], [KnownAuxAttention(KnownAuxConfig(weight=0.0), _shape())], step=0)
    assert none is None and logs["aux/known"].item() == 1.5


def test_a_term_is_averaged_only_over_the_layers_that_produce_it_and_terms_add_up():
    """Alignment's term exists at self-attention sites only: a cross-attention call without it must not dilute
    its mean; two different terms (a KL and an alignment term) are added, each at its own mean."""
    kernels = [KnownAuxAttention(KnownAuxConfig(weight=1.0), _shape()) for _ in range(3)]
    results = [AttentionResult(None, {"known": torch.tensor(2.0), "other": torch.tensor(10.0)}),
               AttentionResult(None, {}),
               AttentionResult(None, {"known": torch.tensor(4.0)})]
    total, logs = weighted_aux_loss(results, kernels, step=0)
    assert total.item() == pytest.approx((2.0 + 4.0) / 2 + 0.0)  # "other" has no weight in KnownAuxConfig
    assert logs["aux/known"].item() == 3.0 and logs["aux/other"].item() == 10.0
    deeper, _ = weighted_aux_loss(results * 4, kernels * 4, step=0)
    assert deeper.item() == pytest.approx(total.item())  # a deeper host with the same per-layer terms: same loss


def test_an_epoch_schedule_reads_the_epoch_and_refuses_to_guess_it():
    kernel = KnownAuxByEpochAttention(KnownAuxByEpochConfig(weight=1.0), _shape())
    total, _ = weighted_aux_loss([AttentionResult(None, {"known": torch.tensor(1.0)})], [kernel], step=100, epoch=4)
    assert total.item() == 5.0
    with pytest.raises(ValueError, match="pass epoch="):
        kernel.loss_weights(100)


def test_diagnostics_are_logged_per_call_and_averaged_over_calls():
    from modules.lit.attention_terms import diagnostics

    kernel = KnownAuxAttention(KnownAuxConfig(), _shape())
    trace = [(kernel, AttentionResult(None, {}, {"entropy": torch.tensor(1.0), "support": torch.tensor(3.0)})),
             (kernel, AttentionResult(None, {}, {"entropy": torch.tensor(2.0)}))]
    logs = {k: v.item() for k, v in diagnostics(trace).items()}
    assert logs == {"attn/l0/entropy": 1.0, "attn/l0/support": 3.0, "attn/l1/entropy": 2.0, "attn/entropy": 1.5, "attn/support": 3.0}
    assert diagnostics([]) == {}


def test_a_non_finite_loss_stops_the_run_naming_the_epoch():
    from modules.lit.attention_terms import DivergedError, check_finite

    check_finite(torch.tensor(1e30), epoch=0)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(DivergedError, match="at epoch 7; the run diverged"):
            check_finite(torch.tensor(bad), epoch=7)
    assert issubclass(DivergedError, FloatingPointError)


def test_data_parallel_ranks_stop_together_when_any_one_diverges(monkeypatch):
    """A finite loss on this rank still stops when another rank's was not (the all-reduced flag says so);
    a single process never all-reduces."""
    from modules.lit import attention_terms
    from modules.lit.attention_terms import DivergedError, check_finite

    calls = []

    def all_reduce(flag, op):
        calls.append(op)
        flag.fill_(1.0)  # another rank diverged

    dist = attention_terms.torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    check_finite(torch.tensor(0.5), epoch=1)
    assert calls == []
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    with pytest.raises(DivergedError, match="at epoch 3"):
        check_finite(torch.tensor(0.5), epoch=3)
    assert calls == [dist.ReduceOp.MAX]


def test_sampling_kernels_trains_only_the_kernels_and_restores_eval_even_on_error():
    from modules.lit.attention_terms import sampling_kernels

    kernels = [KnownAuxAttention(KnownAuxConfig(), _shape()).eval() for _ in range(2)]
    other = torch.nn.Dropout().eval()
    with sampling_kernels(kernels):
        assert all(k.training for k in kernels) and not other.training
    assert not any(k.training for k in kernels)
    with pytest.raises(RuntimeError):
        with sampling_kernels(kernels):
            raise RuntimeError("a failing pass")
    assert not any(k.training for k in kernels)


def test_trace_aux_loss_weights_each_call_by_its_kernels_step_or_epoch_schedule():
    """A trace mixing a step-scheduled and an epoch-scheduled kernel: each term is weighted by its own
    counter (weight x (1 + counter)), and the epoch is 0 unless given, in both entry points."""
    by_step = KnownAuxAttention(KnownAuxConfig(weight=1.0), _shape())
    by_epoch = KnownAuxByEpochAttention(KnownAuxByEpochConfig(weight=1.0), _shape())
    trace = [(by_step, AttentionResult(None, {"known": torch.tensor(2.0)})),
             (by_epoch, AttentionResult(None, {"known": torch.tensor(3.0)}))]
    total, logs = trace_aux_loss(trace, step=3, epoch=5)
    assert total.item() == ((1 + 3) * 2.0 + (1 + 5) * 3.0) / 2
    assert {k: v.item() for k, v in logs.items()} == {"aux/known": 2.5}
    total, _ = trace_aux_loss(trace, step=3)
    assert total.item() == ((1 + 3) * 2.0 + (1 + 0) * 3.0) / 2
    total, _ = weighted_aux_loss([result for _, result in trace], [by_step, by_epoch], step=3)
    assert total.item() == ((1 + 3) * 2.0 + (1 + 0) * 3.0) / 2


def test_results_and_kernels_of_unequal_length_are_refused():
    """A host that lost track of one call would otherwise pair each result with the wrong kernel's weights."""
    kernel = KnownAuxAttention(KnownAuxConfig(), _shape())
    results = [AttentionResult(None, {"known": torch.tensor(1.0)})] * 2
    with pytest.raises(ValueError, match="zip"):
        weighted_aux_loss(results, [kernel], step=0)


def test_the_divergence_flag_is_all_reduced_on_the_device_of_the_loss(monkeypatch):
    """NCCL all-reduces only CUDA tensors: the flag must live where the loss does, not on the default device.
    Here the default device is `meta` and the loss on the CPU, which tells the two apart without a GPU."""
    from modules.lit import attention_terms
    from modules.lit.attention_terms import check_finite

    devices = []
    dist = attention_terms.torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda flag, op: devices.append(flag.device))
    loss = torch.tensor(0.5, device="cpu")
    torch.set_default_device("meta")
    try:
        check_finite(loss, epoch=0)
    finally:
        torch.set_default_device(None)
    assert devices == [torch.device("cpu")]
