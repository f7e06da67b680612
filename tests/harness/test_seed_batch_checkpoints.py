"""A seed batch resumes only from a checkpoint that holds every one of its seeds still training; one of other seeds
(some of ours had stopped in it, or it holds other seeds altogether) is refused with the reason said, and the
batch starts afresh. harness/results/checkpoints.py load_trusted, as harness/run/seed_batch.py asks it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from harness.results import checkpoints as cp
from harness.run.seed_batch import _checkpointing

COMMIT = "abc123"


def saved_batch(checkpoints: cp.Checkpoints, keys, active, *, named=None):
    """A seed-batch checkpoint named for `named` (default: `keys`) holding state for the `active` seeds."""
    named = list(named or keys)
    checkpoints.root.mkdir(parents=True, exist_ok=True)
    checkpoints.announce_batch(named)
    path = checkpoints.batch_path(named)
    cp.save_atomically({"attnbench": cp.metadata("seed_batch", keys, COMMIT, 5, 0, active), "rng": {},
                        "seeds": {key: {"epoch": 5, "fit_time_s": 1.0, "weights": torch.zeros(2)} for key in active}}, path)
    return path


def specs(*keys):
    return [SimpleNamespace(key=key, seed=index, task="cora", display="softmax") for index, key in enumerate(keys)]


def test_a_batch_resumes_from_a_checkpoint_holding_all_its_seeds(tmp_path, capsys):
    checkpoints = cp.Checkpoints(tmp_path / "runs", cp.Interval.parse("1"))
    saved_batch(checkpoints, ["s0", "s1", "s2"], ["s0", "s1", "s2"])
    _, resumed_path, resumed = _checkpointing(specs("s0", "s2"), checkpoints, COMMIT)
    assert resumed_path is not None and resumed["epoch"] == 5 and sorted(resumed["seeds"]) == [0, 1]


def test_a_checkpoint_in_which_some_seeds_had_stopped_is_refused_with_the_reason(tmp_path, capsys):
    checkpoints = cp.Checkpoints(tmp_path / "runs", cp.Interval.parse("1"))
    path = saved_batch(checkpoints, ["s0", "s1", "s2"], ["s0", "s1"])  # s2 had stopped (early stopping) at the save
    assert cp.load_trusted(path, keys=["s0", "s2"], commit=COMMIT, kind="seed_batch") is None
    said = capsys.readouterr().err
    assert f"not resuming from checkpoint {path.name}" in said and "s2" in said and "start afresh" in said
    assert path.is_file()  # left for the runs it holds
    _, resumed_path, resumed = _checkpointing(specs("s0", "s2"), checkpoints, COMMIT)
    assert resumed_path is None and resumed is None
    assert cp.load_trusted(path, keys=["s0", "s1"], commit=COMMIT, kind="seed_batch") is not None


def test_a_checkpoint_of_other_seeds_under_this_batchs_name_is_refused_with_the_reason(tmp_path, capsys):
    checkpoints = cp.Checkpoints(tmp_path / "runs", cp.Interval.parse("1"))
    path = saved_batch(checkpoints, ["t0", "t1"], ["t0", "t1"], named=["s0", "s1"])
    _, resumed_path, resumed = _checkpointing(specs("s0", "s1"), checkpoints, COMMIT)
    assert resumed_path is None and resumed is None
    said = capsys.readouterr().err
    assert f"discarding checkpoint {path.name}: it was written for other seeds (s0, s1 not among them)" in said
