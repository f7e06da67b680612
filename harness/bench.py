"""`attnbench bench`: the whole flow for one suite. Plan it once, skip finished runs, run the rest (local
workers or a submitit job array), then render the leaderboard from the same plan."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from harness.plan.planner import Plan, plan, seed_batches
from harness.plan.spec import RunSpec
from harness.plan.suite import load_suite
from harness.provenance import git_commit
from harness.report.board import is_fraction_metric
from harness.report.format import format_duration
from harness.report.leaderboard import EmptySelection, write_boards
from harness.report.summary import results_table
from harness.results.checkpoints import Checkpoints
from harness.results.record import Status
from harness.results.store import RecordStore, runs_dir
from harness.run.job_array import SubmititOptions, submit_runs
from harness.run.worker_pool import LocalExecutor, WorkerOptions, log


COMMITTED_RECORDS = Path(__file__).resolve().parents[1] / "leaderboards"
"""The committed store (leaderboards/records/), whose records the committed boards are made from."""


def compare_with_committed(the_plan, store: RecordStore, committed: Path) -> str | None:
    """Per variant, how this bench's records of the planned keys compare with the committed records of the same keys:
    how many give the identical primary metric, the largest difference, and the hardware classes on each side.
    Same CPU class: expect identical (CPU runs are deterministic); another class: last-bit differences, which some
    variants' training amplifies (docs/design/identity-and-execution.md, "Reproducibility across CPUs"). None when there is nothing to compare."""
    if not (committed / "records").is_dir() or store.root.resolve() == (committed / "records").resolve():
        return None
    theirs = RecordStore.__new__(RecordStore)  # read-only: RecordStore() would make the folder
    theirs.root = committed / "records"
    rows: dict[str, dict[str, Any]] = {}
    for spec in the_plan.specs:
        mine, committed_record = store.read(spec.key), theirs.read(spec.key)
        if mine is None or committed_record is None or mine.status is not Status.OK or committed_record.status is not Status.OK:
            continue
        metric = next(iter(committed_record.metrics), None)
        u = (mine.metrics.get(metric) or {}).get("value") if metric else None
        v = (committed_record.metrics.get(metric) or {}).get("value") if metric else None
        if u is None or v is None:
            continue
        row = rows.setdefault(spec.display, {"metric": metric, "keys": 0, "identical": 0, "max": 0.0, "mine": set(), "theirs": set()})
        row["keys"] += 1
        row["identical"] += float(u) == float(v)
        row["max"] = max(row["max"], abs(float(u) - float(v)))
        row["mine"].add(mine.hardware_label or "unknown hardware")
        row["theirs"].add(committed_record.hardware_label or "unknown hardware")
    if not rows:
        return None
    lines = [f"attnbench: your records against the committed ones ({committed / 'records'}), primary metric of the same keys:"]
    for name, row in sorted(rows.items()):
        scale = 100.0 if is_fraction_metric(row["metric"]) else 1.0
        lines.append(f"  {name:<22} {row['metric']}: identical in {row['identical']} of {row['keys']}, max |Δ| {row['max'] * scale:.3g}"
                     f"{' points' if scale == 100.0 else ''}  (yours: {', '.join(sorted(row['mine']))}; committed: {', '.join(sorted(row['theirs']))})")
    lines.append("  `attnbench results compare <runs> leaderboards` compares every metric; docs/design/identity-and-execution.md: \"Reproducibility across CPUs\"")
    return "\n".join(lines)


class Progress:
    """One line per finished run with the overall count, elapsed time and an ETA.

    The ETA counts work items, not runs: the seeds of a seed batch train together and end within moments of each
    other (as its first seed ends, the batch is about done), so after a batch's first seed a per-run rate said the
    suite would take about as many batch times as it has runs left (72 runs as 24 batches of 3 on 2 workers: 71
    batch times where 11 were left). The time left is the items not yet started at the mean item time (from item
    start to its last seed's end; to its first seed's while no item has ended) plus what the running items still
    need, shared by the workers, and never less than the longest running item's rest. `started` (LocalExecutor's
    on_start) says when each item began; without it (a job array) items are the runs and the rate is per run."""

    def __init__(self, total: int, workers: int, items: Sequence[Sequence[RunSpec]] = ()):
        self.total, self.workers, self.done, self.failed = total, workers, 0, 0
        self.start = time.perf_counter()
        self.run_seconds: list[float] = []
        self.items_left = len(items) or total
        self.running: dict[int, dict[str, Any]] = {}  # id -> {"start", "keys" still running, "first": s to its first end}
        self.item_of: dict[str, int] = {}
        self.item_seconds: list[float] = []  # items ended: start to last seed
        self.first_seconds: list[float] = []  # items with an ended seed: start to first seed
        self._next_item = 0

    def started(self, specs: Sequence[RunSpec]) -> None:
        """A worker took this item (its specs). A retried item's rest (after a device failure) is no new item: its
        specs leave the entry they had, which ends uncounted."""
        if any(s.key in self.item_of for s in specs):
            for spec in specs:
                old = self.running.get(self.item_of[spec.key])
                if old is not None:
                    old["keys"].discard(spec.key)
            self.running = {index: item for index, item in self.running.items() if item["keys"]}
        else:
            self.items_left = max(0, self.items_left - 1)
        index = self._next_item = self._next_item + 1
        self.running[index] = {"start": time.perf_counter(), "keys": {s.key for s in specs}, "first": None}
        for spec in specs:
            self.item_of[spec.key] = index

    def eta(self, now: float) -> float:
        known = self.item_seconds or self.first_seconds
        if not known:  # nothing ended yet but this run: the per-run rate
            return (now - self.start) / max(self.done, 1) * (self.total - self.done)
        per_item = statistics.fmean(known)
        rests = [max(0.0, per_item - (now - item["start"])) if item["first"] is None else 0.0 for item in self.running.values()]
        work = self.items_left * per_item + sum(rests)
        return max(work / max(1, self.workers), max(rests, default=0.0))

    def __call__(self, spec: RunSpec, summary: dict[str, Any]) -> None:
        now = time.perf_counter()
        self.done += 1
        status = summary.get("status", Status.FAILED)
        self.failed += status != Status.OK
        self.run_seconds.append(summary.get("wall_time_s") or 0.0)
        index = self.item_of.get(spec.key)
        if index is None:  # no item announced (a job array's runs): each run is its own item
            self.items_left = max(0, self.items_left - 1)
            self.item_seconds.append(summary.get("wall_time_s") or 0.0)
        elif index in self.running:
            item = self.running[index]
            if item["first"] is None:
                item["first"] = now - item["start"]
                self.first_seconds.append(item["first"])
            item["keys"].discard(spec.key)
            if not item["keys"]:
                self.item_seconds.append(now - item["start"])
                del self.running[index]
        elapsed = now - self.start
        eta = self.eta(now) if self.done < self.total else 0.0
        if status == Status.OK:
            primary = next(iter(summary["metrics"].items()), None)
            result = f"{primary[0]}={primary[1]['value']:.4f}" if primary else ""
            result += f" ({summary.get('epochs')} epochs)"
        else:
            result = (summary.get("error") or "failed")[:160]
        width = len(str(self.total))
        log(
            f"[{self.done:>{width}}/{self.total}] {status:<6} {spec.task:<10} {spec.display:<16} seed={spec.seed:<3} "
            f"{result}  {format_duration(summary.get('wall_time_s'))}  | elapsed {format_duration(elapsed)}, ETA {format_duration(eta)}"
        )


def with_recorded_rows(selection: Plan, whole: Plan, store: RecordStore) -> Plan:
    """The board's plan for a bench of some rows (--variants): the selection, plus every other row of the suite
    that has records in this store. A bench of one row into a runs folder that holds others (re-running a board's
    rows one by one) keeps them on its board; a board of the selection alone would have fewer finished records
    than the one there, which write_boards refuses, and the bench failed after every run had finished."""
    selected = {s.key for s in selection.specs}
    recorded = set(store.read_many({s.key for s in whole.specs} - selected))
    rows = {(s.task, s.display) for s in whole.specs if s.key in recorded}
    return dataclasses.replace(whole, specs=[s for s in whole.specs if s.key in selected or (s.task, s.display) in rows])


def run_suite(
    suite_name: str,
    *,
    workers: int,
    runs: str | None = None,
    data_root: str | None = None,
    cache_dir: str | None = None,
    plugin_files: Sequence[str] = (),
    retry_failed: bool = False,
    variant_filter: str | None = None,
    leaderboard_dir: str | Path | None = None,
    tuned_params_dir: str | Path | None = None,
    launcher: str = "workers",
    submitit_options: SubmititOptions | None = None,
    precision: str = "32",
    force_board: bool = False,
    workers_per_gpu: int = 1,
    seed_batch: bool = True,
) -> dict[str, int]:
    """launcher "workers": processes on this machine; "slurm"/"local": a submitit job array (needs
    `submitit_options`, see harness/run/job_array.py). Planning and the data check are the same for all.
    The board goes to `leaderboard_dir`, by default `<runs>/leaderboard/`: beside the records it is made of,
    never over the committed boards (leaderboards/), which change only through `make leaderboard` from the
    committed records; a bench then prints how its records compare with the committed ones."""
    suite = load_suite(suite_name)
    the_plan = plan(suite, data_root, variant_filter, tuned_dir=tuned_params_dir, precision=precision)
    for pair in the_plan.untuned:
        # without --params-dir a suite's `tuned` rows read the committed parameters (leaderboards/params)
        where = tuned_params_dir if tuned_params_dir is not None else "leaderboards/params (the suite's `tuned` rows)"
        log(f"attnbench: {pair} has no tuned parameters in {where} (run `attnbench tune ... --promote`); only its default row runs")
    for pair in the_plan.tuned_budget:
        log(f"attnbench: warning: {pair}; its tuned parameters may not carry over to this suite's budget")
    for pair in the_plan.tuned_as_defaults:
        log(f"attnbench: {pair}: its tuned parameters are its defaults; no separate (tuned) row")
    for task_name, why in the_plan.skipped_tasks.items():
        log(f"attnbench: skipping optional task {task_name}: {why}")
    the_plan.require_data()
    if not the_plan.specs:
        raise EmptySelection(f"suite {suite.name}: --variants {variant_filter!r} matches none of its variants "
                             f"({', '.join(v.label or v.name for v in suite.variants)})" if variant_filter else
                             f"suite {suite.name} plans no run (every task skipped?)")
    store = RecordStore(runs)
    todo = [s for s in the_plan.specs if not store.finished(s.key, retry_failed)]
    the_plan.require_checkpoints(s.key for s in todo)
    finished = len(the_plan.specs) - len(todo)
    log(
        f"attnbench: suite {suite.name}: {len(the_plan.specs)} runs "
        f"({len({s.task for s in the_plan.specs})} tasks x {len({s.display for s in the_plan.specs})} variants x {suite.seed_counts()}); "
        f"{finished} already finished, {len(todo)} to run on {f'{workers} worker(s)' if launcher == 'workers' else launcher + ' through submitit'}; "
        f"records in {store.root}"
    )
    resuming = Checkpoints(runs).resumable(s.key for s in todo)
    if resuming:  # docs/design/records.md, "What survives a kill"
        files = sorted({p.name for p in resuming.values()})
        log(f"attnbench: {len(resuming)} of them resume from checkpoint(s) in {store.root.parent / 'checkpoints'}: "
            + ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else ""))
    items = seed_batches(todo, workers, enabled=seed_batch) if todo and launcher == "workers" else []
    progress = Progress(len(todo), workers, items)
    if todo and launcher != "workers":
        outcome = submit_runs(todo, submitit_options or SubmititOptions(launcher=launcher), suite_name=suite.name, runs=runs_dir(runs),
                              data_root=data_root, cache_dir=cache_dir, plugin_files=plugin_files, retry_failed=retry_failed,
                              commit=git_commit(), log=log, format_duration=format_duration)
        if not outcome.waited:
            tuned = f" --params tuned --params-dir {tuned_params_dir}" if tuned_params_dir else ""
            log(f"attnbench: not waiting; once the jobs finish, write the leaderboard with `attnbench leaderboard --suite {suite_name} "
                f"--runs-dir {store.root.parent} --out {leaderboard_dir or store.root.parent / 'leaderboard'}{tuned}`")
            return {"planned": len(the_plan.specs), "ran": 0, "failed": 0, "submitted": len(todo)}
        progress.done, progress.failed = outcome.ran, outcome.failed
        log(f"attnbench: suite {suite.name}: ran {progress.done} runs in {format_duration(time.perf_counter() - progress.start)}, {progress.failed} failed"
            + (f"; shard(s) {outcome.lost_shards} died, their unrecorded runs run on the next bench" if outcome.lost_shards else ""))
    elif todo:
        options = WorkerOptions(
            runs_dir=str(runs_dir(runs)),
            data_root=data_root,
            cache_dir=cache_dir,
            plugin_files=list(plugin_files),
            commit=git_commit(),
            workers=workers,
            workers_per_gpu=workers_per_gpu,
        )
        # Seeds of one configuration train as one seed-batched model where the task allows (harness/run/seed_batch.py);
        # progress still counts seeds, each reported as it ends.
        batches = [item for item in items if len(item) > 1]
        if batches:
            log(f"attnbench: {sum(len(b) for b in batches)} runs as {len(batches)} seed batch(es) of "
                f"{'-'.join(sorted({str(len(b)) for b in batches}, key=int))} seeds (--no-seed-batch runs each seed alone)")
        LocalExecutor(options).run(items, progress, on_start=progress.started)
        log(f"attnbench: suite {suite.name}: ran {progress.done} runs in {format_duration(time.perf_counter() - progress.start)}, {progress.failed} failed")
    # Counted from the store, not from this call's runs: a failure recorded by an earlier bench is still a
    # failure of the selection, and a script checking the exit status must see it.
    selection = store.read_many({s.key for s in the_plan.specs})
    failed_in_selection = sum(1 for r in selection.values() if r.status is Status.FAILED)
    log(f"attnbench: suite {suite.name}: results\n" + results_table(the_plan, selection))
    board_plan = the_plan if not variant_filter else with_recorded_rows(
        the_plan, plan(suite, data_root, None, tuned_dir=tuned_params_dir, precision=precision), store)
    paths = write_boards(board_plan, store, leaderboard_dir or store.root.parent / "leaderboard", force=force_board)
    log("attnbench: leaderboard written to " + ", ".join(str(p) for p in paths))
    comparison = compare_with_committed(the_plan, store, COMMITTED_RECORDS)
    if comparison:
        log(comparison)
    return {"planned": len(the_plan.specs), "ran": progress.done, "failed": progress.failed, "failed_in_selection": failed_in_selection}
