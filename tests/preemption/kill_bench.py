"""Kill test of `attnbench bench` (issue 40): SIGKILL a bench of seed batches at random moments, re-run it after each
kill, and check that the final records are the unkilled bench's, with nothing lost and nothing twice.

    .venv/bin/python -m tests.preemption.kill_bench                 # 20 kills (7.4 minutes on a loaded 2-core CPU)
    .venv/bin/python tests/preemption/kill_bench.py --kills 3 --epochs 30 --seeds 3

What it does, in a temp folder:
1. writes a small Cora suite (3 variants x 6 seeds, a narrow GAT at lr 0.05 and patience 10, so that the seeds stop at
   their own epochs), which `bench` trains as one seed batch per variant;
2. runs one unkilled `bench` of it into `reference/`, with checkpoints off;
3. in `killed/`, with checkpoints every `--every` epochs, starts `bench` and SIGKILLs its whole process group
   (coordinator and worker) at a moment drawn uniformly from `--window` seconds after its first checkpoint write (or,
   with `--from start`, after its start), `--kills` times, each time starting it again; then lets a last `bench` run
   to the end;
4. compares: the same keys, each record equal to the reference's bit for bit but for timings and `execution`; exactly
   one record file per key (no other executions, conflicts or retractions); no checkpoint left, none discarded;
5. counts the work in seed-epochs: the records' epochs (the useful work), what checkpoints kept across each kill (read
   from them after the kill: what a restart from epoch 0 would have trained again), and a bound on what the kills
   lost (at most `--every` epochs of each unfinished seed of the batch in flight).
It prints a report and exits 1 on any mismatch.

Why bench runs from a copy of the code: this checkout is shared and edited while the test runs, and a commit or an
edit in the middle would (rightly) make every checkpoint stale or change the reference's numbers. The copy is outside
git, so the code identity checkpoints carry is the same ("unknown" commit) for every attempt.

Why SLURM_CPUS_PER_TASK=1: bench has no threads option, and it gives its one worker every core (harness/run/threads.py
reads this cap); on a loaded 2-core machine two threads per run are several times slower than one."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run by path
    sys.path.insert(0, str(REPO))

from tests.harness.test_preemption import comparable  # noqa: E402 - what may differ between two executions of one run

CODE = ("harness", "modules", "datamodules")


@dataclass
class Attempt:
    number: int
    seconds: float
    killed: bool
    returncode: int | None
    log: Path
    kept: int = 0
    """Seed-epochs the checkpoints held after it for seeds without a record: what the next attempt resumed from."""
    lost_bound: int = 0
    """At most this many seed-epochs were trained after its last checkpoint and lost (killed attempts)."""
    recorded: int = 0
    progress: int = 0
    """Records' epochs plus `kept`: the work that survived it."""


@dataclass
class Report:
    reference_s: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    useful: int = 0
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    resumed_records: int = 0
    max_resumes: int = 0
    named_checkpoints: int = 0
    leftover_tmp: int = 0


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    p.add_argument("--variants", default="bam-weibull,fenchel,softmax", help="in bench's order: the first ones take most kills")
    p.add_argument("--seeds", type=int, default=6, help="seeds per variant: one seed batch each")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--patience", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05, help="GAT's 0.005 improves for 100+ epochs; at 0.05 seeds stop at 35-90")
    p.add_argument("--every", type=int, default=2, help="checkpoint interval of the killed benches, in epochs")
    p.add_argument("--window", default="0,2", metavar="LO,HI", help="a kill comes this many seconds (uniform) after --from")
    p.add_argument("--from", dest="origin", choices=("first-save", "start"), default="first-save",
                   help="first-save (default): the attempt's first checkpoint write, so that every kill lands in training, a "
                        "save, a test or a record write; start: the bench's start (a loaded 2-core CPU takes ~15 s to start "
                        "bench and its worker, so kills in a window like 4,24 land there as often as in training)")
    p.add_argument("--data", default=os.environ.get("ATTNBENCH_DATA") or str(REPO.parent / "shared" / "data"))
    p.add_argument("--workdir", default=None, help="keep everything here (default: a temp folder, deleted unless --keep)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--in-place", action="store_true", help="run bench from this checkout instead of a copy of its code")
    p.add_argument("--attempt-timeout", type=float, default=900.0, help="seconds an uninterrupted bench may take")
    return p.parse_args(argv)


def write_suite(path: Path, args) -> Path:
    suite = {"name": "kill-bench", "description": "issue 40's kill test of bench (tests/preemption/kill_bench.py)",
             "tasks": ["cora"], "variants": args.variants.split(","), "seeds": args.seeds,
             # a narrow GAT: the test is of resuming, and each of the 21 restarts pays bench's start-up (~15 s here)
             "params": {"max_epochs": args.epochs, "patience": args.patience, "lr": args.lr, "hidden": 4, "heads": 2}}
    path.write_text(json.dumps(suite, indent=1))  # JSON is YAML
    return path


def snapshot(workdir: Path) -> Path:
    code = workdir / "code"
    for name in CODE:
        shutil.copytree(REPO / name, code / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return code


def environment(code: Path, every: int | None, args) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "SLURM_CPUS_PER_TASK": "1",
           "ATTNBENCH_DATA": args.data, "ATTNBENCH_CHECKPOINT_EVERY": str(every or 0)}
    env.setdefault("ATTNBENCH_CACHE", str(REPO / "tests" / "artifacts" / "cache"))
    return env


def start(suite: Path, runs: Path, env: dict[str, str], code: Path, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "harness.cli", "bench", "--suite", str(suite), "--runs-dir", str(runs), "--workers", "1",
               "--data-root", env["ATTNBENCH_DATA"]]
    with open(log, "wb") as out:
        # its own session: the kill takes the coordinator and its worker together, as a scheduler's does
        return subprocess.Popen(command, cwd=code, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the worker, reparented, is reaped by init
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise RuntimeError(f"process group {proc.pid} outlived SIGKILL")


def label(record: dict) -> str:
    return record["spec"].get("label") or record["spec"]["variant"]


def records(runs: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((runs / "records").glob("*.json"))}


def kept_epochs(runs: Path, unfinished: set[str]) -> dict[str, int]:
    """For each seed without a record, the epochs a checkpoint holds for it (the newest save that has it training)."""
    import torch

    held: dict[str, int] = {}
    for path in (runs / "checkpoints").glob("*.pt"):
        try:
            meta = torch.load(path, map_location="cpu", weights_only=True)["attnbench"]
        except Exception as exc:  # noqa: BLE001 - atomic writes: a checkpoint that does not load is a finding
            raise AssertionError(f"checkpoint {path.name} does not load after a kill: {exc}") from exc
        for key in set(meta.get("active") or []) & unfinished:
            held[key] = max(held.get(key, 0), int(meta["epoch"]))
    return held


def account(attempt: Attempt, runs: Path, reference: dict[str, dict], every: int) -> None:
    done = records(runs)
    unfinished = set(reference) - set(done)
    attempt.recorded = len(done)
    attempt.kept = sum(kept_epochs(runs, unfinished).values())
    attempt.progress = sum(int(r["epochs"]) for r in done.values()) + attempt.kept
    # one worker trains one seed batch (one variant) at a time: a kill loses at most `every` epochs of its unfinished seeds
    by_variant: dict[str, int] = {}
    for key in unfinished:
        by_variant[label(reference[key])] = by_variant.get(label(reference[key]), 0) + 1
    attempt.lost_bound = every * max(by_variant.values(), default=0) if attempt.killed else 0


def run_to_end(suite, runs, env, code, log, timeout) -> tuple[int, float]:
    t0 = time.monotonic()
    proc = start(suite, runs, env, code, log)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        rc = -1
    return rc, time.monotonic() - t0


def compare(report: Report, runs: Path, reference: dict[str, dict]) -> None:
    mine = records(runs)
    if sorted(mine) != sorted(reference):
        lost, extra = sorted(set(reference) - set(mine)), sorted(set(mine) - set(reference))
        report.problems.append(f"keys differ: {len(lost)} lost {lost[:4]}, {len(extra)} extra {extra[:4]}")
    for key in sorted(set(mine) & set(reference)):
        if mine[key].get("status") != "ok":
            report.problems.append(f"{key}: status {mine[key].get('status')}: {mine[key].get('error')}")
        elif comparable(mine[key]) != comparable(reference[key]):
            a, b = comparable(mine[key]), comparable(reference[key])
            fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            report.problems.append(f"{key} ({label(reference[key])} seed {reference[key]['spec']['seed']}): differs from the "
                                   f"unkilled record in {fields}")
    folder = runs / "records"
    for sub in ("executions", "conflicts", "retracted"):
        copies = list((folder / sub).glob("*.json")) if (folder / sub).is_dir() else []
        report.duplicated += len(copies)
        if copies:
            report.problems.append(f"{len(copies)} record(s) in records/{sub}/: a key recorded twice")
    left = sorted(p.name for p in (runs / "checkpoints").glob("*.pt")) if (runs / "checkpoints").is_dir() else []
    if left:
        report.problems.append(f"checkpoints left after every run was recorded: {left}")
    report.leftover_tmp = sum(1 for d in (folder, runs / "checkpoints") if d.is_dir() for _ in d.glob(".*.tmp"))
    if report.leftover_tmp:  # a finished run removes what a kill inside one of its writes left
        report.problems.append(f"{report.leftover_tmp} temp file(s) of killed writes left after every run was recorded")
    report.records = len(mine)
    report.lost = len(set(reference) - set(mine))
    report.useful = sum(int(r["epochs"]) for r in mine.values())
    executions = [r.get("execution") or {} for r in mine.values()]
    report.resumed_records = sum(1 for e in executions if "resumed_from_epoch" in e)
    report.max_resumes = max((int(e.get("resumes", 0)) for e in executions), default=0)


def kill_series(args, suite: Path, runs: Path, env, code: Path, logs: Path, reference: dict[str, dict], report: Report) -> None:
    rng = random.Random(args.seed)
    lo, hi = (float(x) for x in args.window.split(","))
    for number in range(1, args.kills + 1):
        delay = rng.uniform(lo, hi)
        log = logs / f"attempt-{number:02d}.log"
        t0 = time.monotonic()
        proc = start(suite, runs, env, code, log)
        origin = t0 if args.origin == "start" else first_save(proc, runs / "checkpoints", time.time())
        try:
            # no first save (it ended before one): nothing to wait for
            rc = proc.wait(timeout=None if origin is None else max(0.0, origin + delay - time.monotonic()))
            killed = False
        except subprocess.TimeoutExpired:
            seconds = time.monotonic() - t0
            kill_group(proc)
            rc, killed = None, True
        attempt = Attempt(number, seconds if killed else time.monotonic() - t0, killed, rc, log)
        account(attempt, runs, reference, args.every)
        report.attempts.append(attempt)
        print(f"kill_bench: attempt {number:2d}: {'killed' if killed else f'ended (rc {rc})'} after {attempt.seconds:5.1f} s; "
              f"{attempt.recorded}/{len(reference)} recorded, {attempt.kept} seed-epochs in checkpoints", flush=True)
        if not killed:
            report.problems.append(f"attempt {number} ended by itself (rc {rc}) before its kill at {delay:.1f} s: the suite is too "
                                   "short for this many kills (raise --epochs, or narrow --window)")
            return


def first_save(proc: subprocess.Popen, folder: Path, since: float) -> float | None:
    """The monotonic time of the attempt's first checkpoint write (a file there newer than `since`); None if it ended first."""
    while proc.poll() is None:
        for path in folder.glob("*.pt") if folder.is_dir() else ():
            try:
                if path.stat().st_mtime >= since:
                    return time.monotonic()
            except FileNotFoundError:  # removed meanwhile: its batch was recorded
                continue
        time.sleep(0.05)
    return None


def check_logs(report: Report, logs: Path) -> None:
    for log in sorted(logs.glob("attempt-*.log")):
        text = log.read_text(errors="replace")
        report.named_checkpoints += "resume from checkpoint(s)" in text
        for line in text.splitlines():
            if "discarding checkpoint" in line:
                report.problems.append(f"{log.name}: {line.strip()}")


def print_report(report: Report, args, reference: dict[str, dict]) -> None:
    killed = [a for a in report.attempts if a.killed]
    kept = sum(a.kept for a in killed)
    lost = sum(a.lost_bound for a in killed)
    advanced = sum(1 for prev, a in zip([None, *killed], killed) if a.progress > (prev.progress if prev else 0))
    final = report.attempts[-1] if report.attempts and not report.attempts[-1].killed else None
    series_s = sum(a.seconds for a in report.attempts)
    print()
    print(f"kill_bench report: {len(reference)} runs ({args.variants} x {args.seeds} seeds, Cora, narrow GAT, lr {args.lr}, "
          f"{args.epochs} epochs max, patience {args.patience}), checkpoints every {args.every} epochs, {len(killed)} SIGKILLs at U({args.window}) s "
          f"after {'its start' if args.origin == 'start' else 'its first checkpoint'}, seed {args.seed}")
    print(f"  unkilled reference bench: {report.reference_s:.1f} s; killed series: {series_s:.1f} s over {len(report.attempts)} "
          f"bench starts (the last, uninterrupted: {final.seconds if final else float('nan'):.1f} s)")
    print(f"  records: {report.records} of {len(reference)}; lost {report.lost}, duplicated {report.duplicated}; {report.resumed_records} resumed from a checkpoint (up to {report.max_resumes} resumes each)")
    print(f"  kills after which the surviving work had grown: {advanced} of {len(killed)}; bench named its checkpoints in "
          f"{report.named_checkpoints} of {len(report.attempts)} starts; temp files of killed writes left: {report.leftover_tmp}")
    print(f"  work, in seed-epochs: useful (the records' epochs, = the reference's) {report.useful}; lost to the kills "
          f"(trained after a checkpoint, trained again) at most {lost}")
    print(f"    total trained across all attempts: at most {report.useful + lost} ({(report.useful + lost) / max(report.useful, 1):.2f}x the useful work)")
    print(f"    {len(killed)} restarts from epoch 0 would have trained {kept} more (what the checkpoints held at the kills): "
          f"at least {report.useful + kept} ({(report.useful + kept) / max(report.useful, 1):.2f}x)")
    if report.problems:
        print(f"  FAILED: {len(report.problems)} problem(s):")
        for problem in report.problems:
            print(f"    - {problem}")
    else:
        print("  OK: every record equals the unkilled bench's (metrics, history, everything but timings and execution)")


def main(argv=None) -> int:
    args = parse(argv)
    if not (Path(args.data) / "planetoid").is_dir():
        print(f"kill_bench: no Planetoid data under {args.data} (--data, or ATTNBENCH_DATA)", file=sys.stderr)
        return 2
    return 1 if kill_bench(args).problems else 0


def kill_bench(args: argparse.Namespace) -> Report:
    """The whole test; its report's `problems` are empty when it passed."""
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kill-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    code = REPO if args.in_place else snapshot(workdir)
    suite = write_suite(workdir / "kill-bench.yaml", args)
    report = Report()
    try:
        rc, report.reference_s = run_to_end(suite, workdir / "reference", environment(code, 0, args), code, logs / "reference.log",
                                            args.attempt_timeout)
        reference = records(workdir / "reference")
        if rc != 0 or len(reference) != len(args.variants.split(",")) * args.seeds:
            report.problems.append(f"the unkilled bench failed (rc {rc}, {len(reference)} records); see {logs / 'reference.log'}")
            print(f"kill_bench: {report.problems[-1]}", file=sys.stderr)
            return report
        print(f"kill_bench: reference: {len(reference)} records in {report.reference_s:.1f} s", flush=True)
        env = environment(code, args.every, args)
        runs = workdir / "killed"
        kill_series(args, suite, runs, env, code, logs, reference, report)
        log = logs / f"attempt-{len(report.attempts) + 1:02d}.log"
        rc, seconds = run_to_end(suite, runs, env, code, log, args.attempt_timeout)
        report.attempts.append(Attempt(len(report.attempts) + 1, seconds, False, rc, log))
        if rc != 0:
            report.problems.append(f"the last, uninterrupted bench exited {rc}; see {log}")
        compare(report, runs, reference)
        check_logs(report, logs)
        print_report(report, args, reference)
        return report
    finally:
        if args.keep or args.workdir or report.problems:
            print(f"kill_bench: kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
