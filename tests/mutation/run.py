"""`make mutation`: mutmut over the core modules, each against the focused tests that cover it.

One mutmut run per module, in its own copy of the tracked tree under build/mutation/<module> (mutmut writes a
mutants/ folder next to its config, and a run per module keeps each run's test selection to the files that
cover that module, so a run takes minutes, not hours). Writes leaderboards/mutation.md: killed / survived per
module, the mutmut version and the commit, and every surviving mutant by name (`mutmut show NAME` in that
module's folder prints its diff).

    python -m tests.mutation.run [--only harness/plan/spec.py ...] [--max-children N] [--sample N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from scipy import stats

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "mutation"
REPORT = REPO / "leaderboards" / "mutation.md"
TARGET = 0.90
TEST_TIMEOUT_S = 120
"""Wall-clock limit per test under a mutant; the slowest focused test takes ~20 s on two busy cores."""
MUTMUT_TIMEOUT_CONSTANT_S = 10
"""mutmut's own wall-clock allowance per mutant, added to the tests' measured time (prepare() says why)."""

MODULES: dict[str, list[str]] = {
    # module -> the focused test files that pin its behaviour (the whole suite would take hours per module)
    "harness/results/store.py": ["tests/harness/test_records.py", "tests/test_record_compat.py"],
    "harness/results/record.py": ["tests/harness/test_records.py", "tests/test_record_compat.py", "tests/harness/test_worker_retry.py",
                                  "tests/harness/test_provenance.py", "tests/harness/test_results_exchange.py"],
    "harness/plan/spec.py": ["tests/harness/test_run_keys.py"],
    "harness/report/stats.py": ["tests/harness/test_stats.py", "tests/harness/test_board.py", "tests/harness/test_chance_correlations.py",
                                "tests/harness/test_conclusions.py"],
    "harness/report/board.py": ["tests/harness/test_board.py", "tests/harness/test_chance_correlations.py",
                                "tests/harness/test_conclusions.py", "tests/harness/test_history.py",
                                "tests/harness/test_board_safety.py", "tests/harness/test_results_exchange.py",
                                "tests/test_fixture_boards.py"],
    "modules/attention/groups.py": ["tests/attention/test_groups.py", "tests/attention/test_realistic_scale.py"],
    "modules/lit/attention_terms.py": ["tests/modules/test_aux_terms.py", "tests/modules/test_host_syncs.py",
                                       "tests/modules/test_training_loss.py"],
    "harness/run/worker_pool.py": ["tests/harness/test_worker_retry.py", "tests/harness/test_gpu_failures.py", "tests/harness/test_node_resources.py"],
}
SAMPLED = {"harness/report/board.py": 100, "modules/attention/groups.py": 200, "harness/run/worker_pool.py": 60}
"""Modules measured on a random sample of their mutants by default: about a thousand mutants each in board.py and
groups.py; board.py's golden-board tests and worker_pool.py's worker processes take 20-30 s per mutant (see run_module)."""
COPIED = ("harness", "modules", "datamodules", "tests", "leaderboards", "pyproject.toml")
"""What a run's copy holds: the code, the tests and the committed boards and records some tests read."""


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *COPIED], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f]


def prepare(module: str, tests: list[str]) -> Path:
    folder = WORK / module.replace("/", "__").removesuffix(".py")
    shutil.rmtree(folder, ignore_errors=True)
    for name in tracked_files():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    for test in tests:  # an untracked new test file is still what the module is measured with
        shutil.copy2(REPO / test, folder / test)
    lines = ["[mutmut]", "source_paths =", "    harness", "    modules", "    datamodules", f"only_mutate = {module}",
             # mutmut's own timeout is a CPU-time limit, which a mutant that leaves a test waiting on a worker
             # never reaches: a wall-clock limit per test (pytest-timeout) turns that hang into a failure
             "pytest_add_cli_args =", f"    --timeout={TEST_TIMEOUT_S}",
             # mutmut also stops a mutant's tests after 15 x (their measured time + timeout_constant) seconds of
             # wall clock and counts that as killed: at its default constant of 1 s, tests that take 2 s alone
             # were cut off on two busy cores (42 of groups.py's first 77 'timeouts' fail at once when run alone)
             f"timeout_constant = {MUTMUT_TIMEOUT_CONSTANT_S}",
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             "also_copy =", "    leaderboards", ""]
    (folder / "setup.cfg").write_text("\n".join(lines))
    return folder


def mutmut(folder: Path, *args: str, log: str = "mutmut.log") -> str:
    """mutmut's output. A mutant of the worker pool can leave worker processes behind that hold a pipe open
    forever, so the output goes to a file, mutmut runs in its own session and that whole process group is
    killed when mutmut itself has returned."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's mutants/, not this tree
    env.setdefault("ATTNBENCH_DATA", str((REPO.parent / "shared" / "data").resolve()))
    # mutmut forks each mutant's test run from a process that has imported torch: a forked child that enters an
    # OpenMP parallel region the parent's thread pool started hangs, idle, until mutmut's wall clock calls it a
    # timeout (seen on groups.py's sparse products). One thread per process: no pool to inherit.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    path = folder / log
    with path.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "mutmut", *args], cwd=folder, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            process.wait()
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return path.read_text()


def run_module(module: str, tests: list[str], max_children: int | None, sample: int | None = None) -> dict:
    """mutmut over `module`; with `sample`, over that many of its mutants drawn at random (seeded by the
    module's name, so a re-run draws the same ones): board.py and groups.py have about a thousand mutants
    each, whose tests take hours on two cores, while a random sample of a few hundred estimates the killed
    share to a few points (mutant sampling, as in Zhang et al., ICSE 2013)."""
    # the commit of the tree the copy is made from: edits committed while mutmut runs must not be cited
    measured_commit = commit()
    folder = prepare(module, tests)
    start = time.perf_counter()
    children = ["--max-children", str(max_children)] if max_children else []
    chosen: list[str] = []
    population = None
    if sample:
        # mutmut makes every mutant and maps the tests before refusing a name that matches none; then it lists them
        mutmut(folder, "run", *children, "no-such-mutant", log="mutmut-generate.log")
        names = re.findall(r"^\s+(\S+): ", mutmut(folder, "results", "--all", "true", log="mutmut-generated.log"), flags=re.M)
        population = len(names)
        chosen = sorted(random.Random(module).sample(sorted(names), min(sample, population)))
    mutmut(folder, "run", *children, *chosen, log="mutmut-run.log")
    listed = mutmut(folder, "results", "--all", "true", log="mutmut-results.log")
    statuses = dict(re.findall(r"^\s+(\S+): (.+)$", listed, flags=re.M))
    if chosen:
        statuses = {name: statuses[name] for name in chosen}
    result = {"module": module, "tests": tests, "counts": dict(Counter(statuses.values())), "seconds": time.perf_counter() - start,
              "survived": sorted(name for name, status in statuses.items() if status not in ("killed", "timeout")),
              "commit": measured_commit, "sampled_from": population}
    (folder / "result.json").write_text(json.dumps(result, indent=1))
    return result


def last_results() -> list[dict]:
    """Each module's latest run, in MODULES order (a run of some modules keeps the others' rows)."""
    found = []
    for module in MODULES:
        path = WORK / module.replace("/", "__").removesuffix(".py") / "result.json"
        if path.exists():
            found.append(json.loads(path.read_text()))
    return found


def commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    # the report itself is rewritten after every module: it does not make the next module's tree dirty
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *COPIED, f":(exclude){REPORT.relative_to(REPO)}"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return sha + ("-dirty" if dirty else "")


def write_report(results: list[dict]) -> None:
    lines = [
        "# Mutation testing of the core modules",
        "",
        f"mutmut {importlib.metadata.version('mutmut')}, written by `make mutation` "
        "(tests/mutation/run.py). Each module is mutated on its own, in a copy of the tree at the commit beside it "
        "(a tree with uncommitted changes is marked dirty), and tested with the files named beside it; "
        "a mutant is killed when one of them fails (a timeout counts as killed). Surviving mutants are discussed in "
        "README.md, Testing.",
        "",
        "| module | tests | commit | mutants | killed | survived | killed % [95% CI of a sample] | minutes |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        counts = r["counts"]
        total = sum(counts.values())
        killed = counts.get("killed", 0) + counts.get("timeout", 0)
        share = f"{100 * killed / total:.1f}" if total else "n/a"
        mutants = str(total)
        if r.get("sampled_from"):
            # a sample estimates the module's killed share: Clopper-Pearson interval of the binomial proportion
            low, high = stats.binomtest(killed, total).proportion_ci(0.95, method="exact")
            share += f" [{100 * low:.1f}, {100 * high:.1f}]"
            mutants = f"{total} sampled of {r['sampled_from']}"
        lines.append(f"| `{r['module']}` | {', '.join(Path(t).name for t in r['tests'])} | {r['commit']} | {mutants} | {killed} | {total - killed} | "
                     f"{share} | {r['seconds'] / 60:.1f} |")
    measured = {r["module"] for r in results}
    for module in MODULES:
        if module not in measured:
            lines.append(f"| `{module}` | {', '.join(Path(t).name for t in MODULES[module])} | | not measured yet | | | | |")
    lines += ["", f"Target: at least {TARGET:.0%} killed per module.", ""]
    for r in results:
        if r["survived"]:
            lines += [f"## Not killed in `{r['module']}`", ""]
            other = set(r["counts"]) - {"killed", "timeout", "survived"}
            lines += [f"- `{name}`" for name in r["survived"]]
            if other:
                lines += ["", "Statuses other than survived: " + ", ".join(f"{s} {r['counts'][s]}" for s in sorted(other))]
            lines.append("")
    REPORT.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="modules to run (default: all of MODULES)")
    parser.add_argument("--max-children", type=int, default=None, help="mutants tested at once (default: mutmut's, the CPU count)")
    parser.add_argument("--report", action="store_true", help="only rewrite the report from the last runs' folders")
    parser.add_argument("--sample", type=int, default=None,
                        help=f"test this many randomly drawn mutants per module, 0 = all (default: {SAMPLED} for those, all for the rest)")
    args = parser.parse_args(argv)
    chosen = args.only or list(MODULES)
    unknown = set(chosen) - set(MODULES)
    if unknown:
        parser.error(f"not a mutation module: {sorted(unknown)}; one of {sorted(MODULES)}")
    for module in [] if args.report else chosen:  # in the order given: the quick ones first when time is short
        print(f"mutation: {module} against {', '.join(MODULES[module])} ...", flush=True)
        sample = SAMPLED.get(module) if args.sample is None else args.sample
        result = run_module(module, MODULES[module], args.max_children, sample or None)
        total = sum(result["counts"].values())
        print(f"mutation: {module}: {result['counts']} of {total} in {result['seconds'] / 60:.1f} min", flush=True)
    results = last_results()
    write_report(results)
    print(f"mutation: wrote {REPORT.relative_to(REPO)}")
    short = [r["module"] for r in results if sum(r["counts"].values()) and
             (r["counts"].get("killed", 0) + r["counts"].get("timeout", 0)) / sum(r["counts"].values()) < TARGET]
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
