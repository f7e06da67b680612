"""A worker process for tests/harness/test_preemption.py: runs Cora specs (one lone run, or the seeds of one seed
batch) as bench's workers do, with checkpoints every EVERY epochs (default 1), writing records to <runs>/records.

KILL_AFTER=k: the process kills itself with SIGKILL (a real kill, not an exception) right after the checkpoint
holding k epochs has reached the disk, i.e. at the end of epoch k, before epoch k+1 starts.

usage: python preemption_child.py RUNS DATA VARIANT SEEDS(0,1,..) MAX_EPOCHS [PATIENCE]"""

import json
import os
import signal
import sys

sys.path.insert(0, os.getcwd())

from harness.results import checkpoints as cp  # noqa: E402

kill_after = int(os.environ.get("KILL_AFTER", "-1"))
_save = cp.save_atomically


def saving(payload, target):
    out = _save(payload, target)
    if payload["attnbench"]["epoch"] == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
    return out


cp.save_atomically = saving

from harness.plan.spec import make_spec  # noqa: E402
from harness.run.worker import RunWorker, WorkerSettings, run_item  # noqa: E402

runs, data, variant, seeds, epochs = sys.argv[1], sys.argv[2], sys.argv[3], [int(s) for s in sys.argv[4].split(",")], int(sys.argv[5])
params = {"max_epochs": epochs, **({"patience": int(sys.argv[6])} if len(sys.argv) > 6 else {})}
os.environ[cp.ENV] = os.environ.get("EVERY", "1")
specs = [make_spec("cora", variant, s, params) for s in seeds]
# commit fixed: other developers' commits during a test must not make its checkpoints stale
worker = RunWorker(WorkerSettings(runs, data, None, (), commit="preemption-test", threads=1))
for record in run_item(worker, [s.to_dict() for s in specs]):
    print(json.dumps({"key": record.key, "status": str(record.status), "execution": record.execution}), flush=True)
