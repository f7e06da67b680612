"""`attnbench run TASK VARIANT`: one configuration, one seed or several, planned and recorded as `bench` does."""

from __future__ import annotations

import argparse

from harness.commands import run_and_tune
from harness.commands.arguments import add_common, add_data_parallel, add_logger, add_precision, parse_seeds, parse_sets

NAME = "run"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="run one task with one variant and seed, and record it")
    p.add_argument("task")
    p.add_argument("variant")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", dest="seed_list", default=None, metavar="A-B|A,B,...",
                   help="several seeds of this configuration, e.g. 0-19: one seed-batched model where the task allows "
                        "(see `describe TASK`), else one after another; finished seeds are skipped")
    p.add_argument("--no-seed-batch", dest="seed_batch", action="store_false", help="with --seeds: run each seed alone")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="task parameter, or attention.KEY=VALUE for the variant")
    p.add_argument("--force", action="store_true", help="run again even if a record for this exact run exists")
    p.add_argument("--params", choices=["default", "tuned"], default="default",
                   help="tuned: run the variant with its tuned parameters from --params-dir, as `bench --params tuned` "
                        "does (--set values still win)")
    p.add_argument("--params-dir", default="leaderboards/params",
                   help="where --params tuned reads them (default: leaderboards/params; your own: <runs-dir>/params)")
    p.add_argument("--dry-run", "--print-config", dest="dry_run", action="store_true",
                   help="print the resolved configuration (task parameters, the attention config at each of the task's "
                        "sites, the key, whether it already finished) and exit; writes nothing")
    add_precision(p)
    add_logger(p)
    add_data_parallel(p)
    add_common(p)
    return p


def main(args) -> int:
    import json

    from harness.results.record import Status
    from harness.results.store import RecordStore

    params, attention = parse_sets(args.set)
    if args.params == "tuned":
        params, attention = _tuned_values(args, params, attention)
    if args.seed_list is not None:
        return _run_seeds(args, params, attention)
    if not args.plugin and not args.force and not args.dry_run:
        finished = _finished_without_planning(args, params, attention)
        if finished is not None:
            print(json.dumps(finished.summary(), indent=1, default=str))
            return 0
    jobs = [(args.task, {"name": args.variant, **attention}, args.seed, params)]
    spec = run_and_tune.plan_command_line_runs(args, jobs, {"command": "run"}).specs[0]
    if args.dry_run:
        from harness.report.run_config import resolved_run

        print(resolved_run(spec, args.runs_dir, args.force), end="")
        return 0
    if not args.plugin:
        from harness.plan import catalogue

        catalogue.remember_run_key(args.task, args.variant, args.seed, params, attention, args.precision, spec.key)
    store = RecordStore(args.runs_dir)
    existing = store.read(spec.key)
    if existing is not None and existing.status is Status.OK and not args.force:
        print(f"attnbench: run {spec.key} already finished ({store.path(spec.key)}); --force runs it again")
        record = existing
    else:
        from harness.run.runner import execute

        distribution, rank = run_and_tune.start_processes(args)
        if rank == 0:
            print(f"attnbench: running {args.task} x {spec.variant} seed={args.seed} (key {spec.key})"
                  f"{f' on {distribution.world_size} DDP processes' if distribution.is_distributed else ''}", flush=True)
        from harness.results.checkpoints import Checkpoints

        # a killed `run` resumes from its last checkpoint, as bench's workers do (docs/design/records.md, "What survives a kill")
        checkpoints = Checkpoints(args.runs_dir)
        record = execute(spec, data_root=args.data_root, cache_dir=args.cache_dir, verbose=True, distribution=distribution,
                         checkpoints=checkpoints)
        if record is None:  # a DDP rank other than 0: rank 0 tests and writes the record
            return 0
        store.write(record)
        if not record.retryable:
            checkpoints.remove_run(spec.key)
    print(json.dumps(record.summary(), indent=1, default=str))
    return 0 if record.status is Status.OK else 1


def _finished_without_planning(args, params: dict, attention: dict):
    """The finished (ok) record of this command line when the key it resolved to last time is known and
    recorded (harness/plan/catalogue.py), so that a re-run answers without importing torch; else None.
    Creates nothing: the runs folder is opened only when the record is there."""
    from harness.plan import catalogue
    from harness.results.record import Status
    from harness.results.store import RecordStore, runs_dir

    key = catalogue.known_run_key(args.task, args.variant, args.seed, params, attention, args.precision)
    if key is None or not (runs_dir(args.runs_dir) / "records" / f"{key}.json").is_file():
        return None
    store = RecordStore(args.runs_dir)
    existing = store.read(key)
    if existing is None or existing.status is not Status.OK:
        return None
    print(f"attnbench: run {key} already finished ({store.path(key)}); --force runs it again")
    return existing


def _tuned_values(args, params: dict, attention: dict) -> tuple[dict, dict]:
    """`run --params tuned`: the promoted (or --params-dir's) best options and task parameters of this task and
    variant, under the command line's own --set values."""
    from harness.plan.tuned import load_tuned

    tuned = load_tuned(args.task, args.variant, args.params_dir)
    if tuned is None:
        from harness.studies.tune import variant_knobs

        if not variant_knobs(args.variant):  # `tune` refuses it, so no hint may send the user there
            raise ValueError(f"{args.variant} has no options of its own, so it has no tuned parameters; leave out --params tuned")
        raise ValueError(f"no tuned parameters of {args.task} x {args.variant} in {args.params_dir}: run `attnbench tune "
                         f"{args.task} {args.variant}` (its result is in <runs-dir>/params: --params-dir runs/params, or --promote it)")
    print(f"attnbench: tuned parameters from {args.params_dir}: "
          + ", ".join(f"attention.{k}={v}" for k, v in sorted(tuned["attention"].items()))
          + "".join(f", {k}={v}" for k, v in sorted((tuned.get("params") or {}).items())), flush=True)
    return {**(tuned.get("params") or {}), **params}, {**tuned["attention"], **attention}


def _run_seeds(args, params, attention) -> int:
    """`run TASK VARIANT --seeds 0-19`: one configuration, many seeds, in this process (a seed batch where the
    task allows), skipping finished seeds; each record is written as its seed ends."""
    import json

    from harness.plan.planner import seed_batches
    from harness.results.record import Status
    from harness.results.store import RecordStore
    from harness.run.progress import progress_lines
    from harness.run.seed_batch import seed_batch_problem
    from harness.run.worker import RunWorker, WorkerSettings, run_item
    import torch

    if args.strategy != "auto" or args.devices not in (None, 1) or args.num_nodes != 1:
        raise ValueError("--seeds runs in one process; run data-parallel runs one --seed at a time")
    seeds = parse_seeds(args.seed_list)
    jobs = [(args.task, {"name": args.variant, **attention}, seed, params) for seed in seeds]
    specs = run_and_tune.plan_command_line_runs(args, jobs, {"command": "run"}).specs
    if args.dry_run:
        return _print_seeds_config(args, specs)
    store = RecordStore(args.runs_dir)
    todo = [s for s in specs if args.force or not store.finished(s.key)]
    why = seed_batch_problem(specs[0])
    how = "each alone" if not args.seed_batch or why or len(todo) < 2 else "as one seed batch"
    print(f"attnbench: {args.task} x {specs[0].variant} seeds {args.seed_list}: {len(specs) - len(todo)} finished, {len(todo)} to run {how}"
          + (f" ({why})" if why and args.seed_batch else ""), flush=True)
    # Plugins are loaded already (by this command's own parsing); threads stay as this process has them.
    worker = RunWorker(WorkerSettings(str(store.root.parent), args.data_root, args.cache_dir, (), threads=torch.get_num_threads(),
                                      execution={"launcher": "run"}))
    failed = 0
    with progress_lines():
        for item in seed_batches(todo, 1, enabled=args.seed_batch):
            # one line per seed, which its summary alone does not name
            for record in run_item(worker, [s.to_dict() for s in item],
                                   lambda r: print(json.dumps({"seed": (r.spec or {}).get("seed"), **r.summary()}, default=str), flush=True)):
                failed += record.status is not Status.OK
    return 1 if failed else 0


def _print_seeds_config(args, specs) -> int:
    """`run --seeds ... --dry-run`: the first seed's resolved configuration (every seed shares it but the seed),
    then each seed's key and status, as one YAML document; reads the store without creating it."""
    import json

    import yaml

    from harness.report.run_config import resolved_run
    from harness.results.record import Record
    from harness.results.store import runs_dir
    from harness.run.seed_batch import seed_batch_problem

    def finished(key: str) -> bool:  # as RecordStore.finished, without the folder it makes
        path = runs_dir(args.runs_dir) / "records" / f"{key}.json"
        try:
            return path.is_file() and Record.from_dict(json.loads(path.read_text())).is_final(False)
        except (ValueError, TypeError):  # an unreadable record (JSON and decoding errors are ValueErrors) is not finished
            return False

    status = {s.seed: "finished" if not args.force and finished(s.key) else "to run" for s in specs}
    todo = sum(1 for value in status.values() if value == "to run")
    why = seed_batch_problem(specs[0])
    how = "each alone" if not args.seed_batch or why or todo < 2 else "as one seed batch"
    print(resolved_run(specs[0], args.runs_dir, args.force), end="")
    print(yaml.safe_dump({"seeds": {s.seed: {"key": s.key, "status": status[s.seed]} for s in specs},
                          "would run": f"{todo} of {len(specs)} seeds {how}" + (f" ({why})" if why and args.seed_batch else "")},
                         sort_keys=False), end="")
    return 0
