"""A lone run's callbacks read the device once per epoch: KeepBestAndStop and History take the validation metrics
from one transfer, which carries History's sums of the epoch's training values too (three transfers before: the
same validation values twice, then the sums). Counted as `tolist` calls from harness/run/callbacks.py over a short
Cora fit (on CPU a transfer dispatches no ATen op, so a dispatch mode does not see it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.plan.spec import make_spec
from harness.run import callbacks, runner


def test_a_lone_cora_epoch_reads_its_callbacks_values_in_one_transfer(monkeypatch):
    data = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if not (data / "planetoid").exists():
        pytest.skip("needs the Planetoid data under ../shared/data")
    transfers = []
    tolist = torch.Tensor.tolist

    def counted(self):
        import traceback

        if any(frame.filename == callbacks.__file__ for frame in traceback.extract_stack()[:-1]):
            transfers.append(self.numel())
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    record = runner.execute(make_spec("cora", "softmax", 0, {"max_epochs": 3, "patience": 4}), data_root=str(data))
    assert record.error is None
    epochs = len(record.history["epoch"])
    assert epochs == 3 and len(transfers) == epochs, transfers
    # the values History keeps are those read: every epoch has its training loss and its validation metrics
    assert all(v is not None for name in ("train/loss", "val/loss", "val/acc") for v in record.history[name])
