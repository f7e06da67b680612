"""`attnbench ARGS...` (harness.cli) for the preemption tests, run as a script so that Lightning's DDP launcher can
start the other ranks with the same command line.

KILL_AFTER=k: right after the checkpoint holding k epochs has reached the disk (rank 0 writes it), rank 0 SIGKILLs
its whole process group, every rank at once, as a scheduler preempting the job does. The test starts this in a
session of its own (start_new_session=True): the group is then this run's ranks and nothing else.

The commit is pinned, as in preemption_child.py: other developers' commits during a test must not make its
checkpoints stale."""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness.provenance  # noqa: E402

harness.provenance.git_commit = lambda: "preemption-test"

from harness.results import checkpoints as cp  # noqa: E402

kill_after = int(os.environ.get("KILL_AFTER", "-1"))
_save = cp.save_atomically


def saving(payload, target):
    out = _save(payload, target)
    if payload["attnbench"]["epoch"] == kill_after:
        group = os.getpgid(0)
        # only a group this process leads (the test's own session); never the test runner's
        os.killpg(group, signal.SIGKILL) if group == os.getpid() else os.kill(os.getpid(), signal.SIGKILL)
    return out


cp.save_atomically = saving

from harness.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
