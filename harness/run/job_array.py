"""`attnbench bench --launcher slurm|local`: a suite's unfinished runs as one job array, through submitit.

The runs still to do are dealt round-robin into `--shards` array tasks (`executor.map_array`). Each task
runs its shard's runs one after another and writes each record itself (atomic rename, as the worker
launcher does), skipping runs already recorded. So a task never needs the submitter alive, a shard that
times out is requeued by submitit and picks up where it stopped, and submitting again (after a crash,
a cancelled job, a node failure) runs exactly the runs that have no record yet.

    attnbench bench --suite paper-gat --launcher slurm --slurm-partition gpu --slurm-time-min 240
    attnbench bench --suite paper-gat --launcher slurm --no-wait     # submit, print job ids, exit
    attnbench leaderboard --suite paper-gat                           # later, from the records

While it waits, bench sees a task's end from its result file (looked at every second) and from `squeue` (every 15 s:
a task that died writes no result), never from submitit's `sacct` polling, which clusters without job accounting
do not answer (submitit warned at every poll and waited for ever on a task that died). A task that `scontrol
requeue` or a preemption stops resumes its run in flight from the run's last checkpoint when it starts again.
tests/slurm/ runs all of this on a real one-node cluster.

`--launcher local` is the same path through submitit's LocalExecutor (processes on this machine, all
shards at once), for laptops and tests. The runs dir, data root, cache dir and the submitit folder must
be on a filesystem the compute nodes share; the jobs run this interpreter (`sys.executable`).

One large run on several nodes (DDP) is a single sbatch script, not an array:

    #!/bin/bash
    #SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --time=08:00:00
    srun --kill-on-bad-exit=1 python -m harness.cli run glue-rte softmax --set backbone=minilm --set max_epochs=10 \
        --strategy ddp --devices 4 --num-nodes 2

(--kill-on-bad-exit: a rank that fails ends the others at once, rather than leaving them waiting for it in the
process group until ATTNBENCH_DDP_TIMEOUT_MIN.) srun starts one process per GPU and Lightning's SLURMEnvironment reads SLURM_NTASKS, SLURM_PROCID,
SLURM_NODELIST, ... to form the process group (it checks that --devices and --num-nodes equal
--ntasks-per-node and --nodes). Only global rank 0 tests and writes the record (harness/run/distributed.py).
`attnbench tune ... --strategy ddp` works the same way, with a PostgreSQL storage.

Tuning on a cluster: every `attnbench tune` process must reach the same Optuna storage, and SQLite on a
network filesystem does not lock reliably, so give `attnbench tune --storage postgresql://user@host/db`
(or `journal:/shared/path/journal.log`) and start as many tune jobs as you like (an array of them, say); they share
the study. A tune task that is requeued or preempted fails the trial it was training when it starts again, and
retries it once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from submitit.helpers import Checkpointable

from datamodules.paths import cache_dir as resolve_cache_dir

from harness.plan.spec import RunSpec
from harness.results.record import Record, Status
from harness.results.store import RecordStore
from harness.run.worker import RunWorker, WorkerSettings
from harness.run.worker_pool import visible_gpus

SKIPPED = "skipped"
"""A shard's summary of a run it found already recorded (not a record status: nothing was written)."""
MAX_DEFAULT_SHARDS = 64


class LauncherError(ValueError):
    """The launcher cannot submit (no SLURM here, a bad option); the message names the fix."""


@dataclass(frozen=True)
class SubmititOptions:
    launcher: str = "slurm"
    """"slurm" (sbatch job array) or "local" (submitit's LocalExecutor: processes on this machine)."""
    folder: str | None = None
    """submitit's folder for pickles and logs, `%j` the job id (default: <runs-dir>/submitit/%j)."""
    shards: int | None = None
    """Array tasks (default: min(runs, 64) on SLURM; locally min(runs, GPUs or CPU cores), as they all start at once)."""
    wait: bool = True
    """Wait for the array, print a line per finished shard and write the leaderboard; False: submit and exit."""
    partition: str | None = None
    """SLURM partition (default: the cluster's default)."""
    time_min: int = 240
    """Time limit of one array task in minutes; a task that reaches it is requeued and resumes."""
    gpus_per_task: int | None = None
    """GPUs per array task, 0 = CPU only (default: 1 on SLURM; locally each shard takes one visible GPU in turn)."""
    cpus_per_task: int | None = None
    """CPUs per array task; the runs use that many torch threads (default: the cluster's default)."""
    array_parallelism: int | None = None
    """At most this many array tasks run at once (SLURM only; default: submitit's 256)."""
    account: str | None = None
    """SLURM account to charge."""
    poll_s: float | None = None
    """Seconds between checks of the jobs while waiting (default: 2 locally; on SLURM 15 between `squeue` calls, while
    the tasks' result files are looked at every second)."""

    def __post_init__(self) -> None:
        if self.launcher not in ("slurm", "local"):
            raise LauncherError(f"launcher {self.launcher!r}: submitit launches 'slurm' or 'local'")
        for flag, value, least in (("--shards", self.shards, 1), ("--slurm-time-min", self.time_min, 1),
                                   ("--slurm-gpus-per-task", self.gpus_per_task, 0), ("--slurm-cpus-per-task", self.cpus_per_task, 1),
                                   ("--slurm-array-parallelism", self.array_parallelism, 1)):
            if value is not None and value < least:
                raise LauncherError(f"{flag} must be at least {least}, got {value}")


@dataclass(frozen=True)
class Shard:
    """One array task's runs and everything they need, passed explicitly: a job on a compute node sees
    neither the submitter's environment variables nor its working directory's defaults."""

    index: int
    specs: tuple[dict[str, Any], ...]
    runs_dir: str
    data_root: str | None
    cache_dir: str | None
    plugin_files: tuple[str, ...] = ()
    commit: str | None = None
    retry_failed: bool = False
    threads: int | None = None
    """torch threads; None: every CPU the scheduler gave this task."""
    gpu: str | None = None
    """Local launcher: the GPU this shard runs on; None: whatever the scheduler gave (or CPU)."""
    checkpoint_every: str | None = None
    """The submitter's ATTNBENCH_CHECKPOINT_EVERY (harness/results/checkpoints.py), None: the default interval. A
    requeued task (time limit, preemption) resumes its run in flight from the run's last checkpoint."""

    def settings(self) -> WorkerSettings:
        from harness.results.checkpoints import ENV

        return WorkerSettings(self.runs_dir, self.data_root, self.cache_dir, self.plugin_files, self.commit, self.threads, self.gpu,
                              env={ENV: self.checkpoint_every} if self.checkpoint_every is not None else {},
                              execution={"launcher": "job-array", "shard": self.index})


def shard_runs(specs: Sequence[Any], shards: int) -> list[list[Any]]:
    """Deal runs round-robin into at most `shards` non-empty shards. Round-robin rather than contiguous
    chunks because plans are ordered task by task: chunks would give one shard all of the slow task."""
    if shards < 1:
        raise LauncherError(f"--shards must be at least 1, got {shards}")
    count = min(shards, len(specs))
    return [list(specs[i::count]) for i in range(count)]


class ShardRunner(Checkpointable):
    """The array task. Checkpointable, so that submitit requeues a task that reaches its time limit with
    this same object: runs it finished are recorded, and `completed` keeps it from repeating a failed run
    under --retry-failed."""

    def __init__(self) -> None:
        self.completed: set[str] = set()

    def __call__(self, shard: Shard) -> list[dict[str, Any]]:
        worker = RunWorker(shard.settings())
        summaries = []
        for data in shard.specs:
            key = RunSpec.from_dict(data).key
            if key in self.completed or worker.store.finished(key, shard.retry_failed):
                summaries.append({"key": key, "status": SKIPPED})
                continue
            record = worker.run(data)
            self.completed.add(key)
            summaries.append(record.summary())
            if record.retryable:
                # A device failure (OOM, CUDA error) may leave this process's CUDA context unusable: the
                # shard's remaining runs stay unrecorded and run on the next bench, not here.
                break
        return summaries


@dataclass
class LaunchOutcome:
    job_ids: list[str]
    waited: bool
    ran: int = 0
    failed: int = 0
    lost_shards: list[int] = field(default_factory=list)
    """Shards whose job died (time limit after the last requeue, node failure, cancelled); their
    unrecorded runs run on the next submission."""


def make_executor(options: SubmititOptions, folder: str | Path, job_name: str):
    import submitit

    if options.launcher == "slurm":
        missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
        if missing:
            raise LauncherError(
                f"--launcher slurm needs SLURM's {' and '.join(missing)} on PATH and found none: run `attnbench bench` on a "
                "login node of the cluster, or use --launcher local (submitit's local executor) or --launcher workers "
                "(processes on this machine)"
            )
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=options.launcher)
    except RuntimeError as exc:  # submitit's "Could not detect srun": a PATH that has sbatch but a broken srun
        raise LauncherError(f"--launcher {options.launcher}: submitit cannot use this machine ({exc}); "
                            "run on a login node of the cluster, or use --launcher local or --launcher workers") from exc
    gpus = options.gpus_per_task
    executor.update_parameters(
        name=job_name,
        timeout_min=options.time_min,
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=options.cpus_per_task,
        # The local launcher pins each shard to one GPU itself (Shard.gpu); submitit's own local GPU option
        # would give every shard the same first GPUs. On SLURM, 0 GPUs is no GPU request at all: clusters
        # without GPU gres reject --gpus-per-node=0.
        gpus_per_node=(1 if gpus is None else gpus or None) if options.launcher == "slurm" else 0,
        slurm_partition=options.partition,
        slurm_account=options.account,
        slurm_array_parallelism=options.array_parallelism,
    )
    return executor


def submit_runs(
    todo: Sequence[RunSpec],
    options: SubmititOptions,
    *,
    suite_name: str,
    runs: str | os.PathLike,
    data_root: str | None,
    cache_dir: str | None,
    plugin_files: Sequence[str] = (),
    retry_failed: bool = False,
    commit: str | None = None,
    log: Callable[[str], None] = print,
    format_duration: Callable[[float], str] = str,
) -> LaunchOutcome:
    """Submit `todo` as a job array; with options.wait, wait for it and report each finished shard through
    `log` (times shown with `format_duration`)."""

    runs_root = Path(runs).expanduser().resolve()
    folder = options.folder or str(runs_root / "submitit" / "%j")
    executor = make_executor(options, folder, f"attnbench-{suite_name}")  # first: no SLURM here stops before anything else
    local_gpus = visible_gpus() if options.launcher == "local" and options.gpus_per_task != 0 else []
    cpus = os.cpu_count() or 1
    default_shards = MAX_DEFAULT_SHARDS if options.launcher == "slurm" else (len(local_gpus) or cpus)
    shards = shard_runs(list(todo), options.shards or default_shards)
    local_threads = max(1, cpus // len(shards))
    payload = [
        Shard(
            index=i,
            specs=tuple(spec.to_dict() for spec in specs),
            runs_dir=str(runs_root),
            checkpoint_every=os.environ.get("ATTNBENCH_CHECKPOINT_EVERY"),
            data_root=str(Path(data_root).expanduser().resolve()) if data_root else None,
            cache_dir=str(resolve_cache_dir(cache_dir)),
            plugin_files=tuple(str(Path(p).expanduser().resolve()) for p in plugin_files),
            commit=commit,
            retry_failed=retry_failed,
            threads=options.cpus_per_task if options.launcher == "slurm" else local_threads,
            gpu=local_gpus[i % len(local_gpus)] if local_gpus else None,
        )
        for i, specs in enumerate(shards)
    ]
    jobs = executor.map_array(ShardRunner(), payload)
    job_ids = [job.job_id for job in jobs]
    log(f"attnbench: submitted {len(todo)} runs as {len(jobs)} {options.launcher} job(s) "
        f"{_compact_ids(job_ids)}; logs in {Path(folder).parent if '%j' in Path(folder).name else folder}")
    if not options.wait:
        return LaunchOutcome(job_ids, waited=False)
    return _wait(jobs, payload, options, job_ids, format_duration, log)


def _compact_ids(job_ids: list[str]) -> str:
    """SLURM array tasks share one array id (1234_0, 1234_1, ...): name it once."""
    arrays = {job_id.split("_")[0] for job_id in job_ids}
    if len(arrays) == 1 and all("_" in job_id for job_id in job_ids):
        return f"{arrays.pop()}_[0-{len(job_ids) - 1}]"
    return ", ".join(job_ids)


SLURM_POLL_S = 15.0
"""Default seconds between two `squeue` calls while bench waits for an array: one call asks for every pending task,
which costs a cluster's controller little; the result files, which cost it nothing, are looked at every second."""
RESULT_POLL_S = 1.0
RESULT_GRACE_S = 15.0
"""How long a task squeue shows ended may take to show its result file (a shared filesystem's cache), as submitit waits."""
SLURM_UNFINISHED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
                    "SIGNALING", "STAGE_OUT", "SUSPENDED", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
"""squeue's states of a task that is still the scheduler's (a requeued task passes through REQUEUED and PENDING);
any other state it lists (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...) is final."""


SQUEUE_FAILURES_REPORTED = 3
"""Failed squeue calls in a row after which the user is told what failed (and again at every further multiple): one
failure is a busy controller, asked again at the next poll; a streak is something to look at."""


class SlurmQueue:
    """Where the tasks of a SLURM array stand, from `squeue` and the tasks' result files rather than submitit's `sacct`
    polling: sacct needs the cluster's accounting database, which many small clusters do not run (submitit then warns
    at every poll, and never sees a task that died), while squeue answers from the controller itself."""

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log
        self.last_state: dict[str, str] = {}
        self.gone_since: dict[str, float] = {}
        self.asked_at = float("-inf")
        self.accounting: bool | None = None
        """Whether sacct answers (None: not asked yet)."""
        self.failures = 0
        """squeue calls in a row that gave no answer."""

    def finished(self, pending: Sequence[tuple[Any, Shard]], poll_s: float) -> list[tuple[Any, Shard]]:
        """The pending (job, shard) pairs that are over: those whose result file is there (a task writes it just before
        it ends, so a finished array is seen within RESULT_POLL_S), and those squeue no longer shows as the scheduler's
        that still have none after submitit's grace for a slow shared filesystem (a task that died). squeue is asked
        at most every `poll_s` seconds."""
        if time.perf_counter() - self.asked_at >= poll_s:
            self.asked_at = time.perf_counter()
            ended = self.ended([job.job_id for job, _ in pending])
            for job_id in ended or ():
                self.gone_since.setdefault(job_id, time.perf_counter())
        now = time.perf_counter()
        return [(job, shard) for job, shard in pending
                if _result_written(job) or now - self.gone_since.get(job.job_id, float("inf")) >= RESULT_GRACE_S]

    def ended(self, job_ids: Sequence[str]) -> set[str] | None:
        """The tasks among `job_ids` that have ended (listed in a final state, or not listed at all), by one squeue
        call; None where squeue did not answer (controller busy or restarting, "Socket timed out", a missing squeue):
        nothing has ended by that, and it is asked again at the next poll (a task's result file still ends it), and
        after SQUEUE_FAILURES_REPORTED failures in a row the log says what failed. Only squeue's own word that the ids
        are gone ("Invalid job id": the controller forgot them, MinJobAge after they ended) ends tasks on an error."""
        if not job_ids:
            return set()
        arrays = sorted({job_id.split("_")[0] for job_id in job_ids})
        try:
            done = subprocess.run(["squeue", "--noheader", "--array", "--states=all", "--format=%i %T", f"--jobs={','.join(arrays)}"],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return self._no_answer(str(exc))
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                self.failures = 0
                return set(job_ids)
            return self._no_answer((done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1])
        self.failures = 0
        listed = dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)
        self.last_state.update({job_id: state for job_id, state in listed.items() if job_id in job_ids})
        return {job_id for job_id in job_ids if listed.get(job_id) not in SLURM_UNFINISHED}

    def _no_answer(self, why: str) -> None:
        self.failures += 1
        if self.failures % SQUEUE_FAILURES_REPORTED == 0:
            self.log(f"attnbench: squeue failed {self.failures} times in a row (last: {why}); the array's tasks are taken as "
                     f"not ended and squeue is asked again at every poll; a task that writes its result still ends. If this "
                     f"goes on, check the SLURM controller (scontrol ping) from this host.")
        return None

    def check_accounting(self, job_id: str) -> bool:
        """Ask sacct once; without accounting, say once what that means, rather than submitit's warning (and sacct's own
        message beside it) at every poll."""
        if self.accounting is None:
            try:
                done = subprocess.run(["sacct", "--noheader", "--parsable2", "--format=JobID", f"--jobs={job_id.split('_')[0]}"],
                                      capture_output=True, text=True, timeout=60)
                self.accounting = done.returncode == 0
                why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.accounting, why = False, str(exc)
            if not self.accounting:
                self.log(f"attnbench: sacct does not answer here ({why}): this cluster keeps no job accounting, which is "
                         "where submitit reads the tasks' states. Nothing is wrong with the runs: bench follows the array with "
                         "squeue and the tasks' result files instead, and a task that dies is reported with the last state "
                         "squeue showed for it.")
        return self.accounting

    def dead_task_reason(self, job) -> str:
        state = self.last_state.get(job.job_id)
        if state is None and self.check_accounting(job.job_id):
            state = job.state  # sacct remembers a task the controller has already forgotten
        return (f"ended without a result (state {state or 'unknown: gone from squeue'}: time limit after its requeues, out of "
                "memory, killed or cancelled)")


def _wait(jobs, payload: list[Shard], options: SubmititOptions, job_ids: list[str], fmt_duration, log) -> LaunchOutcome:
    outcome = LaunchOutcome(job_ids, waited=True)
    slurm = options.launcher == "slurm"
    poll_s = options.poll_s if options.poll_s is not None else (SLURM_POLL_S if slurm else 2.0)
    queue = SlurmQueue(log) if slurm else None
    if queue is not None:
        queue.check_accounting(job_ids[0])
    total_runs = sum(len(shard.specs) for shard in payload)
    pending = list(zip(jobs, payload))
    start, runs_done = time.perf_counter(), 0
    width = len(str(len(pending)))
    try:
        while pending:
            finished = [(job, shard) for job, shard in pending if job.done()] if queue is None else queue.finished(pending, poll_s)
            if not finished:
                time.sleep(poll_s if queue is None else min(poll_s, RESULT_POLL_S))
                continue
            for job, shard in finished:
                pending.remove((job, shard))
                done = len(payload) - len(pending)
                runs_done += len(shard.specs)
                elapsed = time.perf_counter() - start
                eta = elapsed / runs_done * (total_runs - runs_done)
                clock = f"| shards with {runs_done}/{total_runs} runs done, elapsed {fmt_duration(elapsed)}, ETA {fmt_duration(eta)}"
                try:
                    if queue is not None and not _result_written(job):
                        # submitit's job.result() would wait for the file again, then ask sacct for the state
                        raise _DeadTask(queue.dead_task_reason(job))
                    summaries = job.result()
                except Exception as exc:  # noqa: BLE001 - a dead shard is reported, the others go on
                    outcome.lost_shards.append(shard.index)
                    reason = str(exc) if isinstance(exc, _DeadTask) else _job_failure(job, exc)
                    blamed = record_dead_shard(shard, f"job {job.job_id} {reason}; log {job.paths.stderr}")
                    outcome.ran += blamed is not None
                    outcome.failed += blamed is not None
                    log(f"[{done:>{width}}/{len(payload)} shards] job {job.job_id} FAILED: {reason} (log {job.paths.stderr})"
                        f"{f'; run {blamed} recorded as failed' if blamed else ''}; its unrecorded runs run on the next bench {clock}")
                    continue
                ran = [s for s in summaries if s["status"] != SKIPPED]
                failed = [s for s in ran if s["status"] != Status.OK]
                outcome.ran += len(ran)
                outcome.failed += len(failed)
                results = ", ".join(_primary(s) for s in ran)
                log(f"[{done:>{width}}/{len(payload)} shards] job {job.job_id}: {len(ran)} ran ({len(ran) - len(failed)} ok, "
                    f"{len(failed)} failed), {len(summaries) - len(ran)} already recorded; {results} "
                    f"{sum(s.get('wall_time_s') or 0 for s in ran):.1f}s {clock}")
    except KeyboardInterrupt:
        log(f"attnbench: stopped waiting; job(s) {_compact_ids(job_ids)} keep running and write their records "
            f"(cancel with scancel on SLURM). Run bench again once they are done to fill any gaps.")
        raise
    return outcome


def _result_written(job) -> bool:
    folder = job.paths.folder
    try:
        folder.chmod(folder.stat().st_mode)  # as submitit does: makes an NFS client look at the folder again
    except OSError:
        pass
    return job.paths.result_pickle.exists()


class _DeadTask(Exception):
    """A SLURM task that ended without its result file."""


def record_dead_shard(shard: Shard, why: str) -> str | None:
    """A shard runs its specs in order, so when its job dies the first one without a record (or with a
    retryable one from an earlier death) is the run it was in, or about to start. Record that run as failed but retryable, as the worker launcher does for a
    dead worker: the leaderboard shows why, and the next bench runs it again. Returns its key."""
    if shard.retry_failed:  # a failed record may be the old one or the re-run's: which run died is not knowable
        return None
    store = RecordStore(shard.runs_dir)
    for data in shard.specs:
        key = RunSpec.from_dict(data).key
        record = store.read(key)
        if record is not None and not record.retryable:
            continue
        store.write(Record.died(key, data, f"ArrayTaskDied: {why}; this is the run it was on (or about to start)", commit=shard.commit))
        return key
    return None


def _job_failure(job, exc: Exception) -> str:
    from submitit.core.utils import UncompletedJobError

    if isinstance(exc, UncompletedJobError):
        return f"ended without a result (state {job.state}: time limit after its requeues, out of memory, killed or cancelled)"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]  # a traceback: its last line is the error
    return (lines[-1] if lines else type(exc).__name__)[:200]


def _primary(summary: dict[str, Any]) -> str:
    if summary["status"] != Status.OK:
        return f"{summary['status']}: {(summary.get('error') or '')[:80]}"
    name, metric = next(iter(summary["metrics"].items()), (None, None))
    return f"{name}={metric['value']:.4f}" if name else "ok"


def options_from_args(args) -> SubmititOptions | None:
    """None for --launcher workers, which takes none of the submitit flags (a stray one is an error)."""
    given = {flag: value for flag, value in (
        ("--shards", args.shards), ("--submitit-folder", args.submitit_folder), ("--slurm-partition", args.slurm_partition),
        ("--slurm-time-min", args.slurm_time_min), ("--slurm-gpus-per-task", args.slurm_gpus_per_task),
        ("--slurm-cpus-per-task", args.slurm_cpus_per_task), ("--slurm-array-parallelism", args.slurm_array_parallelism),
        ("--slurm-account", args.slurm_account), ("--no-wait", args.no_wait or None)) if value is not None}
    if args.launcher == "workers":
        if given:
            raise LauncherError(f"{', '.join(given)} apply to --launcher slurm or local, not to the default --launcher workers")
        return None
    return SubmititOptions(
        launcher=args.launcher,
        folder=args.submitit_folder,
        shards=args.shards,
        wait=not args.no_wait,
        partition=args.slurm_partition,
        time_min=args.slurm_time_min if args.slurm_time_min is not None else SubmititOptions.time_min,
        gpus_per_task=args.slurm_gpus_per_task,
        cpus_per_task=args.slurm_cpus_per_task,
        array_parallelism=args.slurm_array_parallelism,
        account=args.slurm_account,
    )
