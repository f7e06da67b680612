"""A throwaway one-node SLURM cluster on this machine, for the tests against a real scheduler (tests/slurm/).

Debian's packages (`make slurm` installs slurmctld, slurmd, slurm-client and munge) run with everything in one
temporary folder: a munge key and socket of their own, a slurm.conf for this machine's CPUs and memory (as
`slurmd -C` reports them) on free ports, the controller's state and the node's spool. The three daemons run in the
foreground as children of this process, so they are stopped by their process ids; nothing is written under /etc or
/var and no system service is touched. Clients (sbatch, srun, squeue, scontrol, submitit) find the cluster through
SLURM_CONF in `Cluster.env`.

Accounting is off (no slurmdbd), as on many small clusters: `sacct` answers "accounting storage is disabled".

    .venv/bin/python -m tests.slurm.cluster     # start one by hand: prints its SLURM_CONF, Ctrl-C stops it
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.run.job_array import SLURM_UNFINISHED
from harness.studies.tune import _alive

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol")
STARTUP_S = 60


class ClusterError(RuntimeError):
    """The daemons are installed but the cluster did not come up; the message holds their logs."""


def unavailable() -> str | None:
    """Why no cluster can run here (for a skip), or None."""
    missing = [p for p in PROGRAMS if shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if missing:
        return (f"SLURM is not installed ({', '.join(missing)} missing): `make slurm` installs Debian's slurmctld, slurmd, "
                "slurm-client and munge")
    if os.geteuid() != 0:
        # slurmd starts every job as its submitting user, which takes root
        return "the SLURM tests start slurmd, which must run as root; run them as root (as `make test` does in CI)"
    return None


def _program(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    home: Path
    node: str
    cpus: int
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.home / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This environment, less any SLURM_* variables it inherited (a test run inside a job of another cluster),
        with SLURM_CONF naming this cluster."""
        return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "SLURM_CONF": str(self.conf)}

    def command(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([_program(argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True, timeout=timeout)

    def sbatch(self, script: Path, env: dict[str, str] | None = None) -> str:
        """Submit a batch script; returns its job id."""
        done = subprocess.run([_program("sbatch"), "--parsable", str(script)], env={**(env or {}), **self.env} if env else self.env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def states(self, job: str) -> dict[str, str]:
        """squeue's state of each task of a job or array ('12_0' -> 'RUNNING'), finished ones included (the controller
        keeps them MinJobAge, 300 s)."""
        done = self.command("squeue", "--noheader", "--array", "--states=all", "--format=%i %T", f"--jobs={job}")
        return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)

    def wait_for(self, condition, what: str, timeout: float = 300, every: float = 0.1):
        """Poll `condition` until it returns something true (returned); fail with the daemons' state after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(every)
        queue = self.command("squeue", "--array", "--states=all").stdout
        raise AssertionError(f"waited {timeout:.0f} s for {what}; squeue:\n{queue}")

    def requeue(self, task: str, attempts: int = 3) -> None:
        """`scontrol requeue` a running task, as a preemption does, and let it start again at once: SLURM holds a
        requeued job for about two minutes (its BeginTime), which only the test's clock would notice.

        Started again at once, the task can reach slurmd while slurmd is still killing its first incarnation: slurmd
        then refuses the launch ("Job N already killed, do not launch batch job", seen once in CI) and the task ends
        FAILED without running, a race of this one-node test cluster, not of the job. A preemption's requeue waits far
        longer. So the new start waits until the first incarnation's processes are gone, and a launch slurmd refused
        so is requeued again (at most `attempts` times); any other ending is the job's own."""
        job_id = self._job_id(task)
        pids = self._pids(job_id)
        refused = f"Job {job_id} already killed, do not launch batch job"
        for _ in range(attempts):
            seen = self._slurmd_log().count(refused)
            done = self.command("scontrol", "requeue", task)
            assert done.returncode == 0, done.stderr
            self.wait_for(lambda: self.states(task).get(task) == "PENDING", f"{task} to be pending again after its requeue", timeout=120)
            self.wait_for(lambda: not any(_alive(pid) for pid in pids), f"{task}'s first incarnation to exit", timeout=120)
            done = self.command("scontrol", "update", f"JobId={task}", "StartTime=now")
            assert done.returncode == 0, done.stderr
            outcome = self.wait_for(lambda: self._relaunch(task, job_id, refused, seen), f"{task} to start again",
                                    timeout=120, every=0.2)
            if outcome != "refused":
                return
            self.wait_for(lambda: self.states(task).get(task) not in SLURM_UNFINISHED, f"{task}'s refused launch to end",
                          timeout=120)
            pids = set()
        raise AssertionError(f"slurmd refused {task}'s relaunch {attempts} times\n{self.logs()}")

    def _relaunch(self, task: str, job_id: str, refused: str, seen: int) -> str | None:
        """'refused' once slurmd logs a refused launch since the requeue, 'running' once the task has processes again,
        its state once it has ended (a quick job), else None (still starting)."""
        if self._slurmd_log().count(refused) > seen:
            return "refused"
        if self._pids(job_id):
            return "running"
        state = self.states(task).get(task)
        return state if state is not None and state not in SLURM_UNFINISHED else None

    def _job_id(self, task: str) -> str:
        done = self.command("squeue", "--noheader", "--array", "--format=%A", f"--jobs={task}")
        assert done.returncode == 0 and done.stdout.strip(), done.stderr
        return done.stdout.split()[0]

    def _pids(self, job_id: str) -> set[int]:
        """The processes of a running job on this node (`scontrol listpids`), empty where slurmd lists none."""
        done = self.command("scontrol", "listpids", job_id)
        return {int(line.split()[0]) for line in done.stdout.splitlines()[1:] if line.split() and line.split()[0].isdigit()}

    def _slurmd_log(self) -> str:
        path = self.home / "slurmd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_until_ended(self, job: str, timeout: float = 300) -> dict[str, str]:
        """Wait until no task of `job` is pending, running or completing; returns their final states."""
        return self.wait_for(lambda: (s := self.states(job)) and all(v not in SLURM_UNFINISHED for v in s.values()) and s,
                             f"job {job} to end", timeout=timeout, every=0.5)

    def logs(self) -> str:
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            path = self.home / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- {name} (exit status {self.processes[name].poll() if name in self.processes else 'not started'}):\n"
                         f"{text[-3000:]}")
        return "\n".join(parts)

    def start(self) -> "Cluster":
        self.home.mkdir(parents=True, exist_ok=True)
        # munged refuses a socket folder others may write to; 0711 lets clients reach the socket
        self.home.chmod(0o711)
        key = self.home / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        socket_path = self.home / "munge.socket"
        # --force: munged runs as root here (it prefers a `munge` user; the key is ours, in a folder only root can write)
        self._spawn("munged", [_program("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}",
                               f"--pid-file={self.home / 'munged.pid'}", f"--seed-file={self.home / 'munged.seed'}"])
        self._until(lambda: socket_path.exists(), "munged to open its socket")
        self.conf.write_text(self._configuration(socket_path))
        for folder in ("state", "spool"):
            (self.home / folder).mkdir(exist_ok=True)
        # -i: ignore any saved state (there is none: a fresh folder); -D: stay in the foreground, our child
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_program("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
        self._until(self._node_idle, f"node {self.node} to be idle in sinfo")
        return self

    def stop(self) -> None:
        """Cancel what is still queued, then stop the daemons by their process ids (the node first, munge last)."""
        if self.processes.get("slurmctld") and self.processes["slurmctld"].poll() is None:
            try:
                self.command("scancel", f"--user={os.geteuid()}", timeout=20)
                self._until(lambda: not self.command("squeue", "--noheader", timeout=20).stdout.strip(), "jobs to end", timeout=30)
            except (ClusterError, subprocess.TimeoutExpired, OSError):
                pass  # stopping the daemons ends the jobs' steps anyway
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.home, ignore_errors=True)

    def _configuration(self, munge_socket: Path) -> str:
        # The node as slurmd itself counts it (CPUs, sockets, cores, threads, memory): a node configured with more
        # than slurmd finds is drained, one with less leaves the rest unused.
        found = subprocess.run([_program("slurmd"), "-C"], capture_output=True, text=True, timeout=60).stdout.splitlines()[0]
        hardware = " ".join(word for word in found.split() if not word.startswith(("NodeName=", "UpTime=")))
        self.cpus = int(next(word for word in found.split() if word.startswith("CPUs=")).split("=")[1])
        home = self.home
        return f"""# written by tests/slurm/cluster.py for one test session
ClusterName=attnbench-tests
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={home}/state
SlurmdSpoolDir={home}/spool
SlurmctldPidFile={home}/slurmctld.pid
SlurmdPidFile={home}/slurmd.pid
# No cgroups: containers rarely let slurmd create them; jobs are tracked through /proc.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# Seconds between a cancelled or requeued job's SIGTERM and its SIGKILL (SLURM's default 30 would only slow the tests).
KillWait=5
# Launch and RPC limits for a loaded 2-core machine (make test beside other work). At SLURM's defaults (10 s each) a
# requeued array task once ended FAILED in CI with nothing in its output file: its batch script never started. A launch
# slower than BatchStartTimeout ends a job that way, the likeliest cause at that load (not reproduced in 5 loaded runs
# since, nor its cause proven). The limits only bound a hang.
BatchStartTimeout=120
MessageTimeout=60
NodeName={self.node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.home / f"{name}.log", "ab")  # in the foreground, with no log file configured, each logs to stderr
        self.processes[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, start_new_session=True)
        log.close()

    def _node_idle(self) -> bool:
        done = self.command("sinfo", "--noheader", "--Node", "--format=%T", timeout=20)
        return done.returncode == 0 and done.stdout.split() == ["idle"]

    def _until(self, condition, what: str, timeout: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [name for name, p in self.processes.items() if p.poll() is not None]
            if dead:
                raise ClusterError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs()}")
            if condition():
                return
            time.sleep(0.2)
        raise ClusterError(f"waited {timeout:.0f} s for {what}:\n{self.logs()}")


def start(home: Path | None = None) -> Cluster:
    """A started cluster (its own temporary folder unless `home` is given); stop it with `.stop()`."""
    cluster = Cluster(Path(home or tempfile.mkdtemp(prefix="attnbench-slurm-")), node=socket.gethostname().split(".")[0], cpus=0)
    try:
        return cluster.start()
    except BaseException:
        cluster.stop()
        raise


if __name__ == "__main__":
    reason = unavailable()
    if reason:
        sys.exit(f"tests/slurm/cluster.py: {reason}")
    # Ctrl-C or a kill stops the daemons too (a shell's background job ignores SIGINT unless told otherwise)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    cluster = start()
    print(f"SLURM cluster up: node {cluster.node} ({cluster.cpus} CPUs); in another shell:\n  export SLURM_CONF={cluster.conf}\n"
          f"Ctrl-C (or kill {os.getpid()}) stops it.", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
