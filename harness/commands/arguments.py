"""What several verbs' command lines share: the argument groups (common, precision, logger, data parallel,
launcher), the parsing of --set and --seeds, and the checks that answer a bad count before anything heavy loads.

Imported by every verb's `add_parser`, so whatever `--help` needs and no more: YAML and the machine's
description load inside the functions that use them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def parse_sets(pairs: Sequence[str]) -> tuple[dict, dict]:
    """--set key=value (task parameter) or attention.key=value (variant config); values parse as YAML, and
    planning checks them against the fields' types (so "5e-5", a string to YAML 1.1, becomes a float there)."""
    import yaml

    params, attention = {}, {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set {pair!r}: write key=value, e.g. --set max_epochs=200 or --set attention.alpha=0.5")
        key, raw = pair.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if key.startswith("attention."):
            attention[key.removeprefix("attention.")] = value
        else:
            params[key] = value
    return params, attention


def parse_seeds(text: str) -> list[int]:
    """'0-19' or '0,3,5' or '0-4,9' -> the seeds, in order, each once."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            first, last = int(first), int(last or first)
            if last < first:
                raise ValueError(f"--seeds {text!r}: the range {part.strip()} ends before it starts; write {last}-{first}")
            seeds.extend(range(first, last + 1))
    except ValueError as exc:
        if str(exc).startswith("--seeds"):
            raise
        raise ValueError(f"--seeds {text!r}: expected a range or list of seeds such as 0-19 or 0,3,5") from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds {text!r}: expected non-negative seeds such as 0-19")
    return list(dict.fromkeys(seeds))


def add_data_parallel(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data parallel (one run over several devices or processes)")
    group.add_argument("--strategy", choices=["auto", "ddp"], default="auto",
                       help="ddp: Lightning DistributedDataParallel over --devices processes (gloo on CPU, NCCL on GPUs)")
    group.add_argument("--devices", type=int, default=1, help="processes per node with --strategy ddp (GPUs, or CPU processes)")
    group.add_argument("--num-nodes", type=int, default=1, help="nodes with --strategy ddp (start every rank with srun)")


LAUNCHERS = ("workers", "local", "slurm")
"""`--launcher` choices; harness/run/job_array.py runs the submitit ones."""


def add_launcher_arguments(parser) -> None:
    parser.add_argument("--launcher", choices=LAUNCHERS, default="workers",
                        help="workers: processes on this machine (default); slurm: a SLURM job array through submitit; "
                             "local: the same through submitit's local executor")
    parser.add_argument("--shards", type=int, default=None,
                        help="array tasks the runs are dealt into (default: min(runs, 64) on slurm, min(runs, GPUs or cores) locally)")
    parser.add_argument("--no-wait", action="store_true", help="submit the array and exit (print the job ids); "
                        "`attnbench leaderboard` later")
    parser.add_argument("--submitit-folder", default=None, help="submitit's pickles and logs, %%j = job id (default: <runs-dir>/submitit/%%j)")
    parser.add_argument("--slurm-partition", default=None)
    parser.add_argument("--slurm-time-min", type=int, default=None, help="time limit per array task (default: 240); a task that hits it is requeued and resumes")
    parser.add_argument("--slurm-gpus-per-task", type=int, default=None, help="GPUs per array task, 0 = CPU (default: 1 on slurm)")
    parser.add_argument("--slurm-cpus-per-task", type=int, default=None)
    parser.add_argument("--slurm-array-parallelism", type=int, default=None, help="at most this many array tasks at once")
    parser.add_argument("--slurm-account", default=None)


def add_precision(parser: argparse.ArgumentParser) -> None:
    from harness.plan import PRECISIONS

    parser.add_argument("--precision", choices=PRECISIONS, default="32",
                        help="Lightning Trainer precision (default: 32); part of the run key and of the hardware group, "
                             "so runs in different precisions are never ranked together")


def add_logger(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--logger", choices=["csv", "tensorboard"], default=None,
                        help="also log every run through Lightning's CSVLogger or TensorBoardLogger, under <runs-dir>/logs "
                             "(tensorboard needs the `tensorboard` extra); the record keeps its learning curves either way")


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py", help="import a plugin file that registers variants or tasks (repeatable)")
    parser.add_argument("--data-root", default=None, help="local data folder (default: $ATTNBENCH_DATA, else ../shared/data beside "
                        "the checkout when it holds planetoid/, as make finds it; none = download when online)")
    parser.add_argument("--runs-dir", default=None, help="where run records live (default: $ATTNBENCH_RUNS or ./runs)")
    parser.add_argument("--cache-dir", default=None, help="where processed data is cached (default: $ATTNBENCH_CACHE or the user cache dir)")


RENAMED = {
    "bench_devices": "bench --devices N is now --workers N (N independent runs at once, each on one device); "
                     "--devices N means one data-parallel run over N devices (run/tune --strategy ddp --devices N)",
}
"""Old spellings, refused with the new one, so that one flag has one meaning in every subcommand."""


def check_counts(args) -> str | None:
    """Integer flags whose range argparse does not know, counts this machine cannot give (workers, DDP
    devices, against its cores and GPUs) and tune's storage URL: the one-line message, or None when they
    are fine. Before the catalogue and the registries, so that none of these waits for torch."""
    for dest, message in RENAMED.items():
        if getattr(args, dest, None) is not None:
            return message
    if getattr(args, "seed_list", None) is not None:
        try:
            parse_seeds(args.seed_list)
        except ValueError as exc:
            return str(exc)
    bounds = {"seed": 0, "seeds": 1, "trials": 1, "repeats": 1, "shards": 1, "num_nodes": 1, "threads": 1}
    for name, least in bounds.items():
        value = getattr(args, name, None)
        if value is not None and value < least:
            return f"--{name.replace('_', '-')} {value}: expected an integer >= {least} (from the command line)"
    from harness.plan.machine import Machine

    if args.command == "bench" and args.workers is not None and args.launcher == "workers":
        machine = Machine.here()
        # without --workers-per-gpu the plan's tasks set the share (commands/bench.py checks again then); here only
        # what no share could allow is refused, before torch loads: more workers per GPU than CPU cores per GPU
        per_gpu = getattr(args, "workers_per_gpu", None) or (max(1, machine.cores // machine.gpus) if machine.gpus else 1)
        return machine.worker_problem(args.workers, per_gpu)
    if args.command == "scaling":
        try:
            counts = [int(n) for n in args.workers.split(",")]
        except ValueError:
            return f"--workers takes comma-separated integers, e.g. 1,2; got {args.workers!r}"
        if args.seed_counts is not None:
            try:
                seeds = [int(n) for n in args.seed_counts.split(",")]
            except ValueError:
                return f"--seeds takes comma-separated integers, e.g. 1,20; got {args.seed_counts!r}"
            if min(seeds) < 1:
                return f"--seeds {args.seed_counts}: every seed count must be at least 1"
        from harness.plan.machine import gpu_sharing

        machine = Machine.here()
        # on a GPU node a count above the GPUs measures workers sharing each GPU (1, 2, 4 per GPU)
        return next(filter(None, (machine.worker_problem(n, gpu_sharing(n, machine.gpus)) for n in counts)), None)
    if args.command in ("run", "tune"):
        problem = Machine.here().ddp_problem(args.devices, args.strategy)
        if problem or args.command == "run" or args.storage is None:
            return problem
        from harness.studies.storage import StorageError, check_storage

        try:
            check_storage(args.storage)
        except StorageError as exc:
            return str(exc)
    return None


SUITE_COMMANDS = ("bench", "leaderboard", "scaling", "tune")
"""The verbs whose --suite names a suite file (leaderboard's takes several)."""


def early_problem(args) -> str | None:
    """What can be refused from files alone, before the verb imports torch, Lightning and the registries (about 6 s
    of CPU): a suite file that is not valid YAML or has an unknown or missing key (harness/plan/suite.py
    read_suite_file), and a built-in task whose data files are absent from the data root
    (early_data_problem, below). The message is the one the full check gives; None: the verb checks the rest itself."""
    from harness.plan.suite import SuiteError, read_suite_file, suite_path

    suites = getattr(args, "suite", None) if args.command in SUITE_COMMANDS else None
    for name in (suites if isinstance(suites, list) else [suites] if suites else []):
        try:
            data = read_suite_file(suite_path(name))
        except SuiteError as exc:
            return str(exc)
        if args.command == "bench" and not getattr(args, "plugin", None):
            # the plan refuses a suite whose required (not `optional`) tasks lack data with these same messages
            entries = [{"name": t} if isinstance(t, str) else t for t in (data["tasks"] if isinstance(data["tasks"], list) else [data["tasks"]])]
            missing = [early_data_problem(str(t["name"]), getattr(args, "data_root", None)) for t in entries if not t.get("optional")]
            if any(missing):
                return "\n".join(dict.fromkeys(m for m in missing if m))
    if args.command in ("run", "tune") and getattr(args, "task", None) and not getattr(args, "plugin", None):
        return early_data_problem(args.task, getattr(args, "data_root", None))
    return None


PLANETOID_FOLDERS = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
"""datamodules/planetoid.py's NAMES and RAW_PARTS, here without its torch and PyG imports (a test checks they agree)."""


def early_data_problem(task: str, root: str | Path | None) -> str | None:
    """The files a built-in task needs that are absent from the data root `root`, read from the task's name alone
    (glue-<name>, shift-<source>-<target>, cora/citeseer/pubmed), without importing torch or the task registry: the
    command line asks it before the heavy imports, so that `attnbench run glue-mnli softmax` without MNLI's files is
    answered at once. None when the files are there, when no data root is set (loaders may download), or for any
    other task: the full check (Task.data_problem, checksums included) still runs when the run is planned."""
    if root is None:
        return None
    if task.startswith("glue-"):
        from datamodules import glue

        return glue.data_problem(task.removeprefix("glue-"), root) if task.removeprefix("glue-") in glue.GLUE_TASKS else None
    if task.startswith("shift-"):
        from datamodules import reviews

        domains = task.removeprefix("shift-").split("-")
        if len(domains) == 2 and all(d in reviews.DOMAINS for d in domains) and domains[0] != domains[1]:
            return reviews.data_problem(domains[0], domains[1], root)
        return None
    if task in PLANETOID_FOLDERS:
        base = Path(root).expanduser()
        folder = PLANETOID_FOLDERS[task]
        candidates = [base / "planetoid" / folder / "raw", base / folder / "raw"]
        raw = next((c for c in candidates if c.is_dir()), None)
        if raw is None:  # no folder at all: the loader's own check says where a copy under another name lacks what
            return None
        missing = [f"ind.{task}.{part}" for part in PLANETOID_PARTS if not (raw / f"ind.{task}.{part}").is_file()]
        if missing:
            return (f"{folder}: missing {', '.join(missing)} in {raw}. Put the eight Planetoid files ind.{task}.{{"
                    f"{','.join(PLANETOID_PARTS)}}} (github.com/kimiyoung/planetoid, data/) there, or point at a data root that "
                    f"has them (--data-root or ATTNBENCH_DATA)")
    return None
