"""Lightning DDP for one run and for tuning, on 2 CPU processes (gloo): one record from rank 0, text
batches sharded across ranks, and trials sampled on rank 0 only."""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

from datamodules.text import BucketBatchSampler
from harness.cli import main

REPO = Path(__file__).resolve().parents[2]
FAST = ["--set", "max_epochs=3", "--set", "patience=3"]


@pytest.fixture
def env(shared_data):
    return {**os.environ, "ATTNBENCH_DATA": str(shared_data), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def attnbench(*argv, env, timeout=420):
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, argv)], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_lightning_shards_bucketed_text_batches_across_ranks():
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.pytorch.utilities.data import _update_dataloader

    lengths = torch.randint(5, 60, (101,))
    data = list(range(101))
    # What Lightning does to a train loader under DDP: capture the batch sampler's arguments while the
    # *_dataloader hook builds it, then re-create it around a DistributedSampler per rank.
    with _replace_dunder_methods(BatchSampler):
        loader = DataLoader(data, batch_sampler=BucketBatchSampler(RandomSampler(data), 8, lengths=lengths))
    torch.manual_seed(0)
    shards = []
    for rank in range(2):
        sharded = _update_dataloader(loader, DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=0))
        assert isinstance(sharded.batch_sampler.sampler, DistributedSampler)
        shards.append([list(batch) for batch in sharded.batch_sampler])
    assert len(shards[0]) == len(shards[1]) == len(sharded.batch_sampler) == 7  # ranks step together: ceil(51 / 8)
    seen = [i for shard in shards for batch in shard for i in batch]
    assert sorted(set(seen)) == data and len(seen) == 102  # every example once, one padded in twice
    # The ranks' shards are disjoint apart from the one example padded in to even them out, which the global
    # bucket plan may hand to either rank (or to the same rank twice).
    assert len({i for b in shards[0] for i in b} & {i for b in shards[1] for i in b}) <= 1
    # Within a batch, lengths stay close (bucketing survives sharding).
    for batch in shards[0]:
        assert torch.equal(lengths[batch].sort().values, lengths[batch]) or len(batch) < 8


def test_one_process_batches_do_not_depend_on_the_sampler_order():
    lengths = torch.randint(5, 60, (40,))
    torch.manual_seed(3)
    a = list(BucketBatchSampler(RandomSampler(range(40)), 8, lengths=lengths))
    torch.manual_seed(3)
    torch.rand(5)  # the global RNG moves on; batches come from the run's seed only
    b = list(BucketBatchSampler(RandomSampler(range(40)), 8, lengths=lengths))
    assert a == b and sorted(i for batch in a for i in batch) == list(range(40))


@pytest.mark.parametrize("argv, message", [
    (["run", "cora", "softmax", "--devices", "2"], "needs --strategy ddp"),
    (["run", "cora", "softmax", "--strategy", "ddp", "--devices", "0"], "at least 1"),
    (["tune", "cora", "fenchel", "--strategy", "ddp", "--devices", "2", "--storage", "journal:/tmp/x.log"], "RDB storage"),
])
def test_bad_distribution_exits_2(argv, message, capsys, shared_data, tmp_path):
    assert main([*argv, "--runs-dir", str(tmp_path / "runs"), "--data-root", str(shared_data)]) == 2
    assert message in capsys.readouterr().err


def test_ddp_run_on_two_cpu_processes_writes_one_record_from_rank_zero(env, tmp_path):
    runs = tmp_path / "runs"
    done = attnbench("run", "cora", "softmax", "--strategy", "ddp", "--devices", "2", *FAST, "--runs-dir", runs, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (runs / "records").glob("*.json")]
    assert len(records) == 1
    record = records[0]
    assert record["status"] == "ok" and record["epochs"] == 3
    assert record["distributed"] == {"strategy": "ddp", "devices": 2, "num_nodes": 1, "world_size": 2}
    # The board's hardware class: a DDP run's cost is never mixed with single-process runs' (its quality is ranked with them).
    assert "2 processes" in record["hardware"]["label"] and "DDP" in record["hardware"]["label"]
    # Rank 1 trained too but printed nothing: each epoch line appears once.
    assert done.stdout.count("epoch 0:") == 1 and done.stdout.count("on 2 DDP processes") == 1
    # The record's key is the run's: a re-run without --force finds it, on every rank.
    again = attnbench("run", "cora", "softmax", "--strategy", "ddp", "--devices", "2", *FAST, "--runs-dir", runs, env=env)
    assert again.returncode == 0 and "already finished" in again.stdout


def test_ddp_tuning_samples_each_trial_on_rank_zero_only(env, tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    done = attnbench("tune", "cora", "fenchel", "--trials", "3", "--strategy", "ddp", "--devices", "2", "--storage", storage, *FAST,
                     "--params-dir", tmp_path / "params", "--runs-dir", tmp_path / "runs", env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    # Had the other rank opened the study too, it would have asked for trials of its own.
    assert len(study.trials) == 3
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert study.trials[0].user_attrs["defaults"] and {"alpha", "prior"} <= set(study.trials[1].params)
    assert (tmp_path / "runs" / "params" / "cora" / "fenchel.yaml").is_file()  # beside the study: not promoted
    assert not (tmp_path / "params").exists()
    assert done.stdout.count("best parameters written") == 1


def test_ranks_see_the_same_lengths_at_every_step():
    """A global bucket plan (issue #18): at each step the ranks' batches are slices of one length-sorted
    global batch, so no rank gets long sequences while another gets short ones."""
    lengths = torch.randint(5, 500, (203,))
    world = 4
    per_rank = []
    for rank in range(world):
        sampler = DistributedSampler(range(203), num_replicas=world, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(2)
        batches = BucketBatchSampler(sampler, 8, lengths=lengths)
        per_rank.append(list(batches))
        assert len(per_rank[-1]) == len(batches)
    assert len({len(b) for b in per_rank}) == 1
    for step in zip(*per_rank):
        assert len({len(b) for b in step}) == 1  # equal batch sizes on every rank
        # taking the ranks' j-th examples in rank order, j = 0, 1, ..., gives one length-sorted global batch
        interleaved = [int(lengths[step[r][j]]) for j in range(len(step[0])) for r in range(world)]
        assert interleaved == sorted(interleaved)
    seen = [i for batches in per_rank for b in batches for i in b]
    assert sorted(set(seen)) == list(range(203)) and len(seen) == 204  # 203 padded to 204: one example twice
    # the plan is the same on every rank, so the shards are disjoint apart from the padding
    shards = [{i for b in batches for i in b} for batches in per_rank]
    assert sum(len(s) for s in shards) - len(set().union(*shards)) == 1


@pytest.mark.slow  # two gloo processes trained three times: about 50 s, which the default run's 15 minutes cannot spare
def test_a_killed_ddp_run_resumes_from_rank_zeros_checkpoint_to_the_unkilled_record(env, shared_data, tmp_path):
    """Issue 40 on 2 gloo processes: the run's process group is SIGKILLed (both ranks) right after rank 0 wrote the
    checkpoint of epoch 4; the re-run resumes both ranks from it (each with its own generators) and writes the record
    the unkilled run wrote, bit for bit but for timings and execution. bam-weibull: each rank's noise stream too."""
    import signal

    from tests.harness.test_preemption import assert_same

    child = REPO / "tests" / "harness" / "preemption_cli_child.py"
    argv = ["run", "cora", "bam-weibull", "--strategy", "ddp", "--devices", "2", "--set", "max_epochs=8", "--set", "patience=8",
            "--data-root", str(shared_data)]
    env = {**env, "ATTNBENCH_CHECKPOINT_EVERY": "2"}
    env.pop("KILL_AFTER", None)

    def run(runs, kill_after=None):
        return subprocess.run([sys.executable, str(child), *argv, "--runs-dir", str(runs)], cwd=REPO, capture_output=True, text=True,
                              timeout=300, start_new_session=True,  # its own process group: the one the kill takes
                              env={**env, **({"KILL_AFTER": str(kill_after)} if kill_after is not None else {})})

    unkilled = run(tmp_path / "unkilled")
    assert unkilled.returncode == 0, unkilled.stdout[-2000:] + unkilled.stderr[-3000:]
    killed = run(tmp_path / "runs", kill_after=4)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
    assert not list((tmp_path / "runs").glob("records/*.json")) and len(list((tmp_path / "runs" / "checkpoints").glob("*.pt"))) == 1
    resumed = run(tmp_path / "runs")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "discarding" not in resumed.stderr
    assert_same(tmp_path / "runs", tmp_path / "unkilled")
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "records").glob("*.json")]
    assert record["execution"]["resumed_from_epoch"] == 4 and record["execution"]["world_size"] == 2 and record["epochs"] == 8
    assert not list((tmp_path / "runs" / "checkpoints").glob("*.pt"))  # recorded: nothing resumes from it now
