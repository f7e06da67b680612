"""Validation under DDP counts every example once (issue #18): the evaluation samplers shard without padding,
full-batch graphs split their scored nodes over ranks, and the validation loss is a float mean over examples.
The end-to-end check runs one validation pass on 1 and on 2 gloo CPU processes (ddp_evaluation_probe.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from datamodules.evaluation import unrepeated
from datamodules.text import LengthSortedSampler

REPO = Path(__file__).resolve().parents[2]


def trainer_on(world: int, rank: int):
    """What the samplers read of a Trainer: Lightning gives ParallelStrategy trainers these kwargs, others None."""
    return SimpleNamespace(distributed_sampler_kwargs={"num_replicas": world, "rank": rank} if world > 1 else None)


def test_evaluation_shards_partition_an_odd_set_in_length_order():
    lengths = torch.randint(3, 60, (45,), generator=torch.Generator().manual_seed(0))
    order = list(LengthSortedSampler(lengths))
    shards = [list(unrepeated(LengthSortedSampler(lengths), trainer_on(2, rank))) for rank in range(2)]
    assert [len(s) for s in shards] == [23, 22]
    assert sorted(shards[0] + shards[1]) == list(range(45))  # each example on exactly one rank
    assert shards[0] == order[0::2] and shards[1] == order[1::2]  # ranks take turns along the length order
    # What Lightning would have used instead: its DistributedSampler pads 45 to 46 by repeating an example.
    padded = [list(DistributedSampler(range(45), num_replicas=2, rank=rank, shuffle=False)) for rank in range(2)]
    assert len(padded[0] + padded[1]) == 46 and len(set(padded[0] + padded[1])) == 45


def test_one_process_keeps_its_sampler_and_lightning_keeps_ours():
    sampler = LengthSortedSampler(torch.arange(7))
    assert unrepeated(sampler, None) is sampler and unrepeated(sampler, trainer_on(1, 0)) is sampler
    sharded = unrepeated(sampler, trainer_on(3, 2))
    # Lightning re-shards only loaders whose sampler is not a DistributedSampler already.
    assert isinstance(DataLoader(range(7), sampler=sharded).sampler, DistributedSampler)
    assert list(sharded) == [2, 5]


def test_full_batch_graph_scores_each_node_on_one_rank():
    from modules.lit.node_classification import NodeClassificationModule

    nodes = torch.tensor([3, 4, 8, 9, 10])
    shares = []
    for rank in range(2):
        module = NodeClassificationModule.__new__(NodeClassificationModule)
        module.__dict__["_trainer"] = trainer_on(2, rank)
        shares.append(module._own_share(nodes).tolist())
    assert shares == [[3, 8, 10], [4, 9]]


def probe(world: int, tmp_path: Path, shared_data: Path) -> dict:
    out = tmp_path / f"world{world}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "ATTNBENCH_DATA": str(shared_data), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.harness.ddp_evaluation_probe", str(world), str(out), str(tmp_path / "cache")],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_gloo_processes_validate_like_one(tmp_path, shared_data):
    """A 45-example validation set (Lightning's sampler would repeat one example) and Cora's 500 validation
    nodes (every rank holds the whole graph): the metrics synced over 2 ranks equal one process's, and the ranks
    scored 45 and 500 examples between them, each once."""
    one, two = probe(1, tmp_path, shared_data), probe(2, tmp_path, shared_data)
    assert one["text"]["scored"] == two["text"]["scored"] == 45
    assert one["cora"]["scored"] == two["cora"]["scored"] == 500
    for host in ("text", "cora"):
        assert set(two[host]["metrics"]) == set(one[host]["metrics"])
        for name, value in one[host]["metrics"].items():
            # float sums in another order: equal to about 1e-7; one repeated example moves them by about 1e-2
            assert two[host]["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (host, name)
    assert {"val/acc", "val/f1", "val/mcc", "val/ece", "val/nll", "val/loss"} <= set(one["text"]["metrics"])
    assert one["text"]["metrics"]["val/loss"] == pytest.approx(one["text"]["metrics"]["val/nll"], rel=1e-6)


def test_validation_loss_is_the_example_weighted_mean():
    from modules.lit.example_mean import ExampleMean

    mean = ExampleMean()
    for loss, size in ((0.5, 8), (1.0, 8), (2.0, 7)):
        mean.update(torch.tensor(loss), size)
    assert mean.compute().item() == pytest.approx((4 + 8 + 14) / 23)
    mean.update(torch.tensor(float("nan")), 2)  # a diverged batch stays visible to early stopping
    assert mean.compute().isnan()


MECHANISM_RANK = r"""
import os, sys, json
import torch
import torch.distributed as dist
from types import SimpleNamespace
from modules.lit import attention_terms

rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
# stand-in for mechanism_logs: each batch reports one diagnostic, its value the batch's index
attention_terms.mechanism_logs = lambda trace, loss, step, epoch: {"diag/qk_distance": torch.tensor(float(trace))}
means = attention_terms.ValidationMechanism()
module = SimpleNamespace(global_step=0, current_epoch=0)
batches = {0: [(1, 8), (2, 8), (3, 7)], 1: []}[rank]  # rank 1 holds no validation batch at all
for value, examples in batches:
    means.update(module, value, torch.tensor(0.0), examples)
out = {k: float(v) for k, v in means.compute_and_reset().items()}
print(json.dumps(out))
dist.destroy_process_group()
"""


def test_validation_mechanism_means_sum_over_ranks_even_when_one_rank_has_no_batch():
    """The minibatch hosts' val/diag/<name> under DDP (modules/lit/attention_terms.py ValidationMechanism): the
    example-weighted mean over every rank's batches, and no hang where a rank validated nothing (it has no names
    to offer; the names are gathered before the sums are reduced)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", MECHANISM_RANK, str(rank), "2", port], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    expected = (1 * 8 + 2 * 8 + 3 * 7) / 23
    for out, _ in outs:
        assert json.loads(out.strip().splitlines()[-1]) == {"val/diag/qk_distance": pytest.approx(expected, rel=1e-6)}
