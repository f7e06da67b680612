"""The kill test of `bench` (tests/preemption/kill_bench.py) with 3 kills instead of 20: slow (about 75 s on a
loaded 2-core CPU), so `make test-slow` runs it, not `make test`."""

import pytest

from tests.preemption import kill_bench


@pytest.mark.slow
def test_bench_killed_three_times_ends_with_the_unkilled_records(shared_data, tmp_path):
    # each kill within 3 s of its bench's first checkpoint, so that every re-run resumes something
    args = kill_bench.parse(["--kills", "3", "--seed", "1", "--variants", "softmax,bam-weibull", "--seeds", "3", "--epochs", "20",
                             "--from", "first-save", "--window", "0,3", "--data", str(shared_data), "--workdir", str(tmp_path)])
    report = kill_bench.kill_bench(args)
    assert not report.problems, report.problems
    assert report.records == 6 and report.lost == 0 and report.duplicated == 0
    assert report.resumed_records > 0  # the kills came after checkpoints: the last bench resumed from them
    assert sum(a.killed for a in report.attempts) == 3
