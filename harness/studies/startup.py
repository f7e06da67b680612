"""How fast `attnbench` answers the commands that should feel instant: `make startup`
(`python -m harness.studies.startup`).

Each command runs in a fresh interpreter (as a user types it), a few times; the best and median wall times
are printed against the 1.5 s target. The first command of a run may build the CLI's catalogue
(harness/plan/catalogue.py) if the sources changed; that build is timed separately.

A second table times the read-only commands over the committed records against their own goals:
a re-run of a finished `run`, a board, every committed board (what `make leaderboard` renders), and `results
export`. Their first call may write the run keys and the suites' plan snapshots (harness/plan/catalogue.py),
also timed apart. They write into a temporary
folder, never over the committed boards. Timings on a shared machine vary with its load."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 1.5
COMMANDS = (
    ["--help"],
    ["--version"],
    ["run", "--help"],
    ["list"],
    ["describe", "bam-weibull"],
    ["describe", "cora"],
    ["run", "cora", "softmx"],
    ["run", "coraa", "softmax"],
    ["run", "cora", "softmax", "--set", "max_epochs=abc"],
    ["run", "cora", "softmax", "--set", "lr=-0.1"],
    ["run", "cora", "entmax", "--set", "attention.alpha=0"],
    ["run", "cora", "softmax", "--seed", "-1"],
    ["run", "cora", "softmax", "--precision", "bf16"],
    ["tune", "cora", "softmax", "--set", "max_epochs=-5"],
    ["bench", "--suite", "quik"],
    ["bench", "--workers", "64"],
    ["bench", "--devices", "2"],
    ["tune", "cora", "softmax", "--storage", "notaurl://x"],
    ["tune", "cora", "softmax", "--storage", "journal:/missing/dir/j.log"],
)


REPO = Path(__file__).resolve().parents[2]


def read_only_commands(out: str) -> list[tuple[str, list[str], float]]:
    """(what, argv, goal in seconds) for the read-only commands, over the committed records."""
    from harness.plan.suite import list_suites

    boards = [name for name in list_suites() if (REPO / "leaderboards" / f"{name}.md").is_file()]
    records = str(REPO / "leaderboards")
    commands = []
    finished = finished_run(out)
    if finished:
        commands.append(("run of a finished run (cora softmax seed 0)", finished, 2.0))
    return commands + [
        ("leaderboard --suite quick", ["leaderboard", "--suite", "quick", "--runs-dir", records, "--out", out], 2.0),
        (f"every committed board ({len(boards)}, as make leaderboard)",
         ["leaderboard", "--suite", *boards, "--runs-dir", records, "--skip-unrecorded", "--out", out], 10.0),
        ("results export", ["results", "export", f"{out}/all.jsonl", "--runs-dir", records], 2.0),
    ]


def finished_run(out: str) -> list[str] | None:
    """`run` flags of a committed quick-suite record (cora, softmax, seed 0), copied into a runs folder
    under `out`; None when that record is not committed (a `run` would then train, which is not timed here)."""
    import shutil

    from harness.plan.planner import plan_runs

    params = {"max_epochs": 300, "patience": 100}
    key = plan_runs([("cora", {"name": "softmax"}, 0, params)], None).specs[0].key
    record = REPO / "leaderboards" / "records" / f"{key}.json"
    if not record.is_file():
        return None
    (Path(out) / "runs" / "records").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(record, Path(out) / "runs" / "records" / record.name)
    return ["run", "cora", "softmax", "--seed", "0", *(f"--set={k}={v}" for k, v in params.items()), "--runs-dir", f"{out}/runs"]


def time_command(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness.cli", *argv], capture_output=True)
    return time.perf_counter() - start, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warm_s, _ = time_command(["list"])
    print(f"first `attnbench list` (builds the catalogue if the sources changed): {warm_s:.2f} s")
    print(f"{'command':<56} {'best':>7} {'median':>7}  exit  target {TARGET_S} s")
    slow = 0
    for argv in COMMANDS:
        times, code = [], 0
        for _ in range(args.repeats):
            seconds, code = time_command(argv)
            times.append(seconds)
        best, median = min(times), statistics.median(times)
        slow += median > TARGET_S
        print(f"{'attnbench ' + ' '.join(argv):<56} {best:>6.2f}s {median:>6.2f}s  {code:>4}  {'ok' if median <= TARGET_S else 'SLOW'}")
    print(f"{len(COMMANDS) - slow} of {len(COMMANDS)} within {TARGET_S} s (median of {args.repeats})")
    with tempfile.TemporaryDirectory() as out:
        commands = read_only_commands(out)
        warm_s = sum(time_command(argv)[0] for _, argv, _ in commands)
        print(f"\nfirst call of each (writes the run keys and plan snapshots if the sources changed): {warm_s:.2f} s in all")
        print(f"{'read-only command':<56} {'best':>7} {'median':>7}  exit  goal")
        within = 0
        for what, argv, goal in commands:
            times, code = [], 0
            for _ in range(args.repeats):
                seconds, code = time_command(argv)
                times.append(seconds)
            best, median = min(times), statistics.median(times)
            within += median <= goal
            print(f"{what:<56} {best:>6.2f}s {median:>6.2f}s  {code:>4}  {goal:g} s {'ok' if median <= goal else 'SLOW'}")
        print(f"{within} of {len(commands)} within their goals (median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
