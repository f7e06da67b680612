"""The `attnbench` command: parses arguments and hands each verb to the stage that does it.

Each handler imports what it needs when it runs (torch, Lightning, the registries), so that `--help` and a
mistyped flag answer at once."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any, Sequence

import yaml


def parse_sets(pairs: Sequence[str]) -> tuple[dict, dict]:
    """--set key=value (task parameter) or attention.key=value (variant config); values parse as YAML, and
    planning checks them against the fields' types (so "5e-5", a string to YAML 1.1, becomes a float there)."""
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


def _data_parallel(parser: argparse.ArgumentParser) -> None:
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


def _precision(parser: argparse.ArgumentParser) -> None:
    from harness.plan import PRECISIONS

    parser.add_argument("--precision", choices=PRECISIONS, default="32",
                        help="Lightning Trainer precision (default: 32); part of the run key and of the hardware group, "
                             "so runs in different precisions are never ranked together")


def _logger(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--logger", choices=["csv", "tensorboard"], default=None,
                        help="also log every run through Lightning's CSVLogger or TensorBoardLogger, under <runs-dir>/logs "
                             "(tensorboard needs the `tensorboard` extra); the record keeps its learning curves either way")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py", help="import a plugin file that registers variants or tasks (repeatable)")
    parser.add_argument("--data-root", default=None, help="local data folder (default: $ATTNBENCH_DATA, else ../shared/data beside "
                        "the checkout when it holds planetoid/, as make finds it; none = download when online)")
    parser.add_argument("--runs-dir", default=None, help="where run records live (default: $ATTNBENCH_RUNS or ./runs)")
    parser.add_argument("--cache-dir", default=None, help="where processed data is cached (default: $ATTNBENCH_CACHE or the user cache dir)")


class VersionAction(argparse.Action):
    """--version: attnbench, torch and Lightning from the installed metadata (no import), and the commit."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the versions and the git commit, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from harness.provenance import version_line

        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description="Benchmark attention variants on the same tasks, seeds and budgets.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list variants, tasks and suites")
    p.add_argument("what", nargs="?", choices=["variants", "tasks", "suites", "all"], default="all")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py")

    p = sub.add_parser("describe", help="every parameter of a task or variant: type, range, default (per host) and source")
    p.add_argument("name", help="a task or variant name (see `attnbench list`)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py")

    p = sub.add_parser("check", help="run the attention contract (softmax limit, padding invariance, bf16 autocast, "
                       "gradients, dense = segment) on the variants a plugin file registers; exit 1 on a failure")
    p.add_argument("file", metavar="FILE.py", help="a plugin file that registers attention variants")
    p.add_argument("--variant", action="append", default=None, metavar="NAME", help="only these of the file's variants (repeatable)")

    p = sub.add_parser("run", help="run one task with one variant and seed, and record it")
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
    _precision(p)
    _logger(p)
    _data_parallel(p)
    _common(p)

    p = sub.add_parser("bench", help="run a suite (skipping finished runs) and write its leaderboard")
    p.add_argument("--suite", default="quick", help="built-in suite name or a suite .yaml path (default: quick)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per GPU, else one per CPU core)")
    p.add_argument("--devices", dest="bench_devices", type=int, default=None, help=argparse.SUPPRESS)  # renamed: see RENAMED
    p.add_argument("--workers-per-gpu", type=int, default=1, metavar="K",
                   help="K workers share each GPU (small launch-bound runs such as Cora; default: 1)")
    p.add_argument("--retry-failed", action="store_true", help="run failed runs again instead of keeping their records")
    p.add_argument("--variants", default=None, metavar="PATTERN", help="only variants matching these comma-separated globs, e.g. 'softmax,bam-*'")
    p.add_argument("--leaderboard-dir", default=None,
                   help="where the board of your runs goes (default: <runs-dir>/leaderboard; the committed boards in leaderboards/ "
                        "change only through `make leaderboard`, from the committed records)")
    p.add_argument("--params", choices=["default", "tuned"], default="default",
                   help="tuned: also run each variant with its tuned parameters (from --params-dir), as its own row")
    p.add_argument("--params-dir", default="leaderboards/params")
    p.add_argument("--dry-run", action="store_true", help="print the plan (every run, finished/failed/pending, estimated time) and exit; writes nothing")
    p.add_argument("--force", action="store_true", help="write the leaderboard even if it has fewer finished records than the board on disk")
    p.add_argument("--no-seed-batch", dest="seed_batch", action="store_false",
                   help="run every seed in its own run (default: the seeds of one configuration train as one seed-batched "
                        "model where the task allows, split over the workers)")
    _precision(p)
    _logger(p)
    add_launcher_arguments(p)
    _common(p)

    p = sub.add_parser("tune", help="tune a variant's own knobs on a task's validation data with Optuna (or every pair of a suite)")
    p.add_argument("task", nargs="?", help="task name (or use --suite)")
    p.add_argument("variant", nargs="?", help="variant name (or use --suite)")
    p.add_argument("--suite", default=None, help="tune every (task, variant) pair of this suite, each with the same budget")
    p.add_argument("--trials", type=int, default=20, help="finished trials per study (default: 20)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///<runs-dir>/optuna.db; "
                   "postgresql://... on a cluster, journal:<file> on a shared filesystem)")
    p.add_argument("--timeout", type=float, default=None, help="stop starting trials after this many seconds")
    p.add_argument("--tune-optimizer", action="store_true", help="also tune the task's lr and weight_decay")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="task parameter held fixed while tuning")
    p.add_argument("--promote", action="store_true",
                   help="after tuning, copy the result from <runs-dir>/params/ to --params-dir (the committed parameters); "
                        "refused when the one there was tuned with a larger budget, unless --force")
    p.add_argument("--force", action="store_true", help="with --promote: replace a result tuned with a larger budget")
    p.add_argument("--params-dir", default="leaderboards/params",
                   help="where --promote copies the best parameters (default: leaderboards/params); tune itself writes "
                        "only <runs-dir>/params/<task>/<variant>.yaml, beside its study")
    p.add_argument("--dry-run", action="store_true", help="print the studies (finished trials of --trials, estimated time) and exit; writes nothing")
    _precision(p)
    _logger(p)
    _data_parallel(p)
    _common(p)

    p = sub.add_parser("perf", help="forward+backward time of every variant relative to softmax (dense and graph)")
    p.add_argument("--variants", default=None, metavar="PATTERN", help="only variants matching this glob")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to time the kernels (default: cpu)")
    p.add_argument("--seed-batch", type=int, default=None, metavar="S",
                   help="instead: seeds/s of S seeds trained as one seed batch vs one lone run, per variant on Cora, and the peak-memory ratio")
    p.add_argument("--epochs", type=int, default=20, help="with --seed-batch: epochs per seed (default: 20)")
    _common(p)

    p = sub.add_parser("scaling", help="run a suite with 1, 2, ... workers in one command and print the speed-up")
    p.add_argument("--suite", default="quick")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts, the first is the baseline (default: 1,2)")
    p.add_argument("--variants", default=None, metavar="PATTERN", help="only variants matching these comma-separated globs")
    p.add_argument("--seeds", dest="seed_counts", default=None, metavar="N[,M...]",
                   help="run this many seeds instead of the suite's; several (e.g. 1,20) run the suite once per count and "
                        "print each count's wall time against the first's, same workers")
    p.add_argument("--no-seed-batch", dest="seed_batch", action="store_false",
                   help="run every seed alone, as bench --no-seed-batch (default: seeds of one configuration as seed batches)")
    _common(p)

    p = sub.add_parser("probe", help="probe a pretrained model's attention (fenchel: Fig. 4 of the Fenchel-duality paper on all-MiniLM-L6-v2)")
    p.add_argument("which", choices=["fenchel"])
    p.add_argument("--dataset", choices=["sst2", "rte"], default="sst2", help="GLUE dev set whose first examples are probed (default: sst2; rte pairs are ~3x longer and take ~8x the time)")
    p.add_argument("--sentences", type=int, default=64, help="how many dev examples (default: 64)")
    p.add_argument("--max-length", type=int, default=128, help="tokens per example, after truncation (default: 128)")
    p.add_argument("--out", default="leaderboards/probes", help="folder for fenchel-minilm.{md,csv,png}")
    p.add_argument("--data-root", default=None, help="local data folder holding glue/ (default: $ATTNBENCH_DATA)")

    p = sub.add_parser("leaderboard", help="regenerate a suite's leaderboard from its records, or a board of whatever --runs-dir holds")
    p.add_argument("--suite", nargs="+", default=None, metavar="SUITE",
                   help="one or more suites (one process for all: `make leaderboard` renders every board in one go); "
                        "without it: every record of --runs-dir, one table per task and parameter set, as <out>/leaderboard.*")
    p.add_argument("--out", default=None, help="where the boards go (default: leaderboards with --suite, else the runs folder)")
    p.add_argument("--allow-empty", action="store_true",
                   help="write a board of missing runs when the records hold no run of the suite (default: refuse, exit 2)")
    p.add_argument("--params", choices=["default", "tuned"], default="default", help="tuned: list tuned rows next to the defaults")
    p.add_argument("--params-dir", default="leaderboards/params")
    p.add_argument("--force", action="store_true", help="overwrite the board even if it has more finished records than the records give")
    p.add_argument("--skip-unrecorded", action="store_true",
                   help="leave the board as it is, with a note, when the records hold no run of the suite (`make leaderboard` on a fresh clone)")
    p.add_argument("--claims", action="store_true",
                   help="also write claims.{md,html} to --out: the papers' claims (harness/claims.yaml) against the same records")
    _common(p)

    p = sub.add_parser("claims", help="print the claims board (harness/claims.yaml against the records) as Markdown; writes nothing")
    p.add_argument("--claims-file", default=None, help="a claims file other than harness/claims.yaml")
    _common(p)

    p = sub.add_parser("results", help="move run records between stores: export to a JSON-lines file, import (merge) them, compare two")
    verbs = p.add_subparsers(dest="results_command", required=True)
    q = verbs.add_parser("export", help="every record of --runs-dir as one JSON-lines file, sorted by key")
    q.add_argument("out", metavar="OUT.jsonl")
    q.add_argument("--runs-dir", default=None, help="the store to export (default: $ATTNBENCH_RUNS or runs)")
    q = verbs.add_parser("import", help="merge records into a store: identical ones deduplicated, other finished executions of a key kept "
                                        "beside it, genuine conflicts (another spec, finished vs failed) kept as conflicts")
    q.add_argument("sources", nargs="+", metavar="FILE.jsonl|DIR",
                   help="files from `results export`, runs folders (or their records/ folders), or folders of runs folders (a SLURM job array's output)")
    q.add_argument("--into", default=None, help="the store to merge into (default: $ATTNBENCH_RUNS or runs; the committed records: leaderboards)")
    q = verbs.add_parser("compare", help="per task and metric: how many keys two stores (or exports) share, how many agree exactly, the largest difference; "
                                         "exit 0 when every shared value is identical, 3 when some differ, 4 when they share no finished key, 1 on an unreadable record")
    q.add_argument("a", metavar="A", help="a store (runs folder) or an export file")
    q.add_argument("b", metavar="B", help="a store (runs folder) or an export file")
    q = verbs.add_parser("retract", help="set aside records that a fix showed wrong (made by a since-fixed code path): kept with the reason in "
                                         "records/retracted/, never shown or imported again; the key runs again, or its next execution takes its place")
    q.add_argument("keys", nargs="*", metavar="KEY", help="run keys to retract (or select them with the options below)")
    q.add_argument("--because", required=True, metavar="TEXT", help="why these records are wrong, and which commit fixed it")
    q.add_argument("--made-at", metavar="COMMIT", help="select the records made at this commit (a prefix of Record.commit)")
    q.add_argument("--suite", dest="retract_suite", metavar="NAME", help="select the records planned by this suite")
    q.add_argument("--seed-batched", action="store_true", help="select only records trained in a seed batch")
    q.add_argument("--dry-run", action="store_true", help="list what would be retracted; change nothing")
    q.add_argument("--runs-dir", default=None, help="the store (default: $ATTNBENCH_RUNS or runs; the committed records: leaderboards)")
    return parser


def cmd_list(args) -> int:
    from harness.plan.describe import print_list

    print_list(args.what)
    if not args.plugin:
        from harness.plan import catalogue

        catalogue.refresh()
    return 0


@contextlib.contextmanager
def _values_from_flags(task: str | None = None, variant: str | None = None):
    """A ConfigError raised while planning `run`/`tune` is about a --set value: say so in its message, and
    for an unknown key point to the key it probably meant (harness/plan/describe.py's set_key_hint)."""
    from modules.validation import ConfigError

    try:
        yield
    except ConfigError as exc:
        is_attention = exc.owner.startswith("attention")
        located = exc.at(f"from --set {'attention.' if is_attention else ''}{exc.key}")
        if exc.known and task and variant:
            import dataclasses

            from modules.attention import attention_entry
            from modules.tasks import get_task

            from harness.plan.describe import set_key_hint

            hint = set_key_hint(exc.key, exc.value, is_attention=is_attention,
                                task_fields=[f.name for f in dataclasses.fields(get_task(task).Params)],
                                variant_fields=[f.name for f in dataclasses.fields(attention_entry(variant).cls.Config)])
            located.args = (str(located) + hint,)
        raise located from None


def cmd_describe(args) -> int:
    from harness.plan import catalogue
    from harness.plan.describe import describe

    print(describe(args.name))
    if not args.plugin:
        catalogue.refresh()
    return 0


def cmd_check(args) -> int:
    """The contract checks of modules/attention/contract.py, one line per variant and property."""
    from modules.attention import list_attentions
    from modules.attention.registry import ATTENTIONS
    from modules.registry import load_plugin_file

    before = set(list_attentions())
    load_plugin_file(args.file)
    found = sorted(set(list_attentions()) - before)
    try:
        return _check_variants(args, found)
    finally:  # checked, not installed: a caller in the same process (a notebook, the tests) keeps its registry
        for name in found:
            ATTENTIONS.unregister(name)


def _check_variants(args, found: list[str]) -> int:
    from modules.attention.contract import check_variant, format_outcomes

    if not found:
        raise ValueError(f"{args.file} registers no attention variant: decorate an AttentionKernel subclass with "
                         f"@register_attention(\"my-name\") (README: Adding a variant)")
    unknown = sorted(set(args.variant or []) - set(found))
    if unknown:
        raise ValueError(f"--variant {', '.join(unknown)}: {args.file} registers {', '.join(found)}")
    failed = 0
    for name in args.variant or found:
        outcomes = check_variant(name)
        print(format_outcomes(outcomes), flush=True)
        failed += sum(o.status == "FAIL" for o in outcomes)
    print(f"attnbench check: {failed} failed propert{'y' if failed == 1 else 'ies'}" if failed else "attnbench check: every property holds")
    return 1 if failed else 0


def _plan_command_line_runs(args, jobs: list[tuple[str, Any, int, dict]], extra: dict[str, Any]):
    """`run` and `tune` plan like `bench` does: names resolved and each task's data checked, once."""
    from harness.plan.planner import plan_runs

    task, attention = jobs[0][:2]
    with _values_from_flags(task, attention if isinstance(attention, str) else attention["name"]):
        the_plan = plan_runs(jobs, args.data_root, extra, precision=args.precision)
    if not args.plugin:
        from harness.plan import catalogue

        catalogue.refresh()
    the_plan.require_data()
    return the_plan


def _start_processes(args):
    """Join or start the DDP processes of `run`/`tune` (a no-op for one process), each with its share of the
    CPU threads; returns (distribution, this process's global rank)."""
    from harness.run.distributed import Distribution, start
    from harness.run.runner import quiet_lightning
    from harness.run.threads import configure_worker_threads

    distribution = Distribution(args.strategy, args.devices, args.num_nodes)
    quiet_lightning()
    configure_worker_threads(distribution.devices)
    return distribution, start(distribution)


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


def cmd_run(args) -> int:
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
    spec = _plan_command_line_runs(args, [(args.task, {"name": args.variant, **attention}, args.seed, params)], {"command": "run"}).specs[0]
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

        distribution, rank = _start_processes(args)
        if rank == 0:
            print(f"attnbench: running {args.task} x {spec.variant} seed={args.seed} (key {spec.key})"
                  f"{f' on {distribution.world_size} DDP processes' if distribution.is_distributed else ''}", flush=True)
        record = execute(spec, data_root=args.data_root, cache_dir=args.cache_dir, verbose=True, distribution=distribution)
        if record is None:  # a DDP rank other than 0: rank 0 tests and writes the record
            return 0
        store.write(record)
    print(json.dumps(record.summary(), indent=1, default=str))
    return 0 if record.status is Status.OK else 1


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


def _run_seeds(args, params, attention) -> int:
    """`run TASK VARIANT --seeds 0-19`: one configuration, many seeds, in this process (a seed batch where the
    task allows), skipping finished seeds; each record is written as its seed ends."""
    from harness.plan.planner import seed_batches
    from harness.results.record import Status
    from harness.results.store import RecordStore
    from harness.run.seed_batch import progress_lines, seed_batch_problem
    from harness.run.worker import RunWorker, WorkerSettings, run_item
    import torch

    if args.strategy != "auto" or args.devices not in (None, 1) or args.num_nodes != 1:
        raise ValueError("--seeds runs in one process; run data-parallel runs one --seed at a time")
    seeds = parse_seeds(args.seed_list)
    jobs = [(args.task, {"name": args.variant, **attention}, seed, params) for seed in seeds]
    specs = _plan_command_line_runs(args, jobs, {"command": "run"}).specs
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
    import yaml

    from harness.report.run_config import resolved_run
    from harness.results.store import runs_dir
    from harness.run.seed_batch import seed_batch_problem

    from harness.report.run_config import _read_record
    from harness.results.store import UnreadableRecord

    def finished(key: str) -> bool:  # as RecordStore.finished, without the folder it makes
        path = runs_dir(args.runs_dir) / "records" / f"{key}.json"
        try:
            return path.is_file() and _read_record(path).is_final(False)
        except UnreadableRecord:
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


def cmd_bench(args) -> int:
    from harness.bench import run_suite
    from harness.run.job_array import options_from_args
    from harness.run.worker_pool import default_workers

    if args.workers_per_gpu < 1:
        raise ValueError(f"--workers-per-gpu must be at least 1, got {args.workers_per_gpu}")
    if args.workers is None:
        args.workers = default_workers(args.workers_per_gpu)
    if args.dry_run:
        return _print_bench_plan(args)
    outcome = run_suite(
        args.suite,
        workers=args.workers,
        runs=args.runs_dir,
        data_root=args.data_root,
        cache_dir=args.cache_dir,
        plugin_files=args.plugin,
        retry_failed=args.retry_failed,
        variant_filter=args.variants,
        leaderboard_dir=args.leaderboard_dir,
        tuned_params_dir=args.params_dir if args.params == "tuned" else None,
        launcher=args.launcher,
        submitit_options=options_from_args(args),
        precision=args.precision,
        force_board=args.force,
        workers_per_gpu=args.workers_per_gpu,
        seed_batch=args.seed_batch,
    )
    if outcome.get("failed_in_selection"):
        print(f"attnbench: {outcome['failed_in_selection']} run(s) of the selection failed (see the leaderboard's errors); exit status 1",
              file=sys.stderr)
        return 1
    return 0


def _print_bench_plan(args) -> int:
    from harness.plan.planner import plan
    from harness.report.preview import format_table, preview_runs, read_records, this_device
    from harness.plan.suite import load_suite
    from harness.results.store import runs_dir

    the_plan = plan(load_suite(args.suite), args.data_root, args.variants,
                    tuned_dir=args.params_dir if args.params == "tuned" else None, precision=args.precision)
    for task_name, why in the_plan.skipped_tasks.items():
        print(f"attnbench: skipping optional task {task_name}: {why}")
    for pair in the_plan.tuned_budget:
        print(f"attnbench: warning: {pair}; its tuned parameters may not carry over to this suite's budget")
    the_plan.require_data()
    if not the_plan.specs:
        raise ValueError(f"suite {the_plan.suite.name}: the selection (--variants {args.variants!r}) has no run")
    rows = preview_runs(the_plan.specs, read_records(runs_dir(args.runs_dir)), this_device(), args.retry_failed)
    print(format_table(rows, args.workers))
    return 0


def _print_tune_plan(args, jobs) -> int:
    """One row per study: its finished trials of --trials, read from the storage only where it exists."""
    from harness.report.preview import PreviewRow, format_table
    from harness.studies.tune import TUNE_SEED

    rows = []
    for task, variant, job_params in jobs:
        name, finished, mean_trial_s = study_progress(task, variant, job_params, args.storage, args.runs_dir, args.tune_optimizer,
                                                      args.precision)
        remaining = max(0, args.trials - finished)
        status = "finished" if remaining == 0 else "pending"
        rows.append(PreviewRow(task, f"{variant} ({finished}/{args.trials} trials)", TUNE_SEED, name, status,
                               mean_trial_s * remaining if mean_trial_s and remaining else None))
    print(format_table(rows, noun="studies"))
    return 0


def study_progress(task: str, variant: str, params, storage: str | None, runs: str | None, tune_optimizer: bool,
                   precision: str = "32"):
    """(study name, finished trials, mean seconds per finished trial or None) without creating anything: a
    default SQLite file or a journal file that is not there yet means a study with no trials."""
    import dataclasses

    from harness.results.store import runs_dir
    from harness.studies.tune import open_storage, study_name
    from modules.tasks import get_task

    name = study_name(task, variant, dataclasses.asdict(get_task(task).params(params)), tune_optimizer)
    name += f"/{precision}" if precision != "32" else ""  # as tune() names it
    if storage is None:
        path = runs_dir(runs) / "optuna.db"
        if not path.is_file():
            return name, 0, None
        storage = f"sqlite:///{path}"
    elif storage.startswith("journal:") and not os.path.isfile(os.path.expanduser(storage.removeprefix("journal:"))):
        return name, 0, None  # opening a journal creates its file
    import optuna
    from optuna.trial import TrialState

    try:
        study = optuna.load_study(study_name=name, storage=open_storage(storage))
    except KeyError:  # no such study in the storage yet
        return name, 0, None
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    seconds = [t.duration.total_seconds() for t in done if t.duration is not None]
    return name, len(done), (sum(seconds) / len(seconds) if seconds else None)


def cmd_tune(args) -> int:
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.plan.tuned import promote, runs_params_dir
    from harness.results.store import runs_dir
    from harness.studies.tune import TUNE_SEED, export, require_a_search_space, tune, variant_knobs

    params, attention = parse_sets(args.set)
    if attention:
        raise ValueError("tune searches the variant's own knobs: attention.* cannot be fixed with --set")
    if args.force and not args.promote:
        raise ValueError("--force only applies with --promote (replace promoted parameters tuned with a larger budget)")
    if args.suite:
        if args.task or args.variant:
            raise ValueError("give either TASK VARIANT or --suite, not both")
        suite_plan = plan(load_suite(args.suite), args.data_root)
        suite_plan.require_data()
        pairs = sorted({(s.task, s.variant, tuple(sorted(s.params.items()))) for s in suite_plan.specs})
        jobs = [(task, variant, {**dict(suite_params), **params}) for task, variant, suite_params in pairs]
        if not args.tune_optimizer:
            knobless = sorted({variant for _, variant, _ in jobs if not variant_knobs(variant)})
            if knobless:
                print(f"attnbench tune: not tuning {', '.join(knobless)}: no options of their own to search "
                      "(--tune-optimizer also searches the task's lr and weight_decay)")
            jobs = [job for job in jobs if job[1] not in knobless]
    elif args.task and args.variant:
        jobs = [(args.task, args.variant, params)]
        _plan_command_line_runs(args, [(args.task, args.variant, TUNE_SEED, params)], {"command": "tune"})
        require_a_search_space(args.variant, args.tune_optimizer)
    else:
        raise ValueError("name a TASK and a VARIANT (attnbench tune cora bam-weibull) or a --suite")
    from modules.tasks import get_task

    with _values_from_flags():
        for task, _, job_params in jobs:
            get_task(task).params(job_params)
    if args.dry_run:
        return _print_tune_plan(args, jobs)
    if args.strategy == "ddp" and args.storage and args.storage.startswith("journal:"):
        raise ValueError("pruning data-parallel trials needs an RDB storage (sqlite:///... or postgresql://...), not a journal file")
    distribution, _ = _start_processes(args)
    written = runs_params_dir(runs_dir(args.runs_dir))
    for task, variant, job_params in jobs:
        result = tune(task, variant, trials=args.trials, params=job_params, storage=args.storage, timeout=args.timeout,
                      tune_optimizer=args.tune_optimizer, runs=args.runs_dir, data_root=args.data_root, cache_dir=args.cache_dir,
                      distribution=distribution, precision=args.precision)
        if result is None:  # a DDP rank other than 0, or the study's last trials run in other processes
            continue
        print(f"attnbench tune: best parameters written to {export(result, written)}")
        if args.promote:
            print(f"attnbench tune: promoted to {promote(task, variant, written, args.params_dir, force=args.force)}")
        else:
            print(f"attnbench tune: `bench --params tuned --params-dir {written}` runs them; "
                  f"`attnbench tune {task} {variant} --promote` (same flags) copies them to {args.params_dir}")
    return 0


def cmd_leaderboard(args) -> int:
    """Exit 2 when a board is refused (it would shrink, or the store holds none of its runs), else 1 when a
    record could not be read (the board still counts it, as `results export` does), else 0."""
    from harness.report.leaderboard import BoardWouldShrink, NothingRecorded, write_leaderboard, write_records_board
    from harness.results.store import runs_dir

    tuned = args.params_dir if args.params == "tuned" else None
    refused = 0
    written = []
    # RecordStore makes its folder; a refused board must leave none behind, or the next `results compare` on a
    # mistyped folder finds an empty store there instead of saying it does not exist
    no_store = not (runs_dir(args.runs_dir) / "records").is_dir()
    if args.suite is None and not args.claims:  # --claims alone renders only the claims page
        if tuned:
            raise ValueError("--params tuned lists a suite's tuned rows: name the --suite (a board of records shows the tuned runs it holds anyway)")
        if no_store:
            print(f"attnbench: error: {runs_dir(args.runs_dir) / 'records'} does not exist; no board written. Point --runs-dir "
                  f"at a folder with records/ (the committed records: --runs-dir leaderboards)", file=sys.stderr)
            return 2
        try:
            written.append(write_records_board(runs=args.runs_dir, out_dir=args.out, data_root=args.data_root, force=args.force))
        except (BoardWouldShrink, NothingRecorded) as exc:
            print(f"attnbench: error: {exc}", file=sys.stderr)
            refused += 1
    for suite in args.suite or []:
        if no_store and not args.allow_empty:
            if args.skip_unrecorded:
                print(f"attnbench leaderboard: {suite}: no record of its runs in {runs_dir(args.runs_dir) / 'records'}; board left as it is")
            else:
                print(f"attnbench: error: {runs_dir(args.runs_dir) / 'records'} does not exist, so it holds no record of suite {suite}; "
                      f"no board written. Point --runs-dir at the folder its runs went to (the committed records: --runs-dir "
                      f"leaderboards), or pass --allow-empty to write a board of missing runs", file=sys.stderr)
                refused += 1
            continue
        # One suite's refusal does not stop the others: each board is written or kept on its own merits.
        try:
            paths = write_leaderboard(suite, runs=args.runs_dir, out_dir=args.out or "leaderboards", data_root=args.data_root,
                                      tuned_params_dir=tuned, force=args.force, skip_unrecorded=args.skip_unrecorded,
                                      allow_empty=args.allow_empty, snapshot=not args.plugin)
        except (BoardWouldShrink, NothingRecorded) as exc:
            print(f"attnbench: error: {exc}", file=sys.stderr)
            refused += 1
            continue
        if not paths:
            print(f"attnbench leaderboard: {suite}: no record of its runs in {runs_dir(args.runs_dir) / 'records'}; board left as it is")
        written.append(paths)
    for paths in written:
        for path in paths:
            print(path)
    if args.claims:
        from harness.report.leaderboard import write_claims_board

        for path in write_claims_board(args.runs_dir, args.out or "leaderboards", args.data_root):
            print(path)
    if refused:
        return 2
    unreadable = {key for paths in written for key in getattr(paths, "unreadable", {})}
    if unreadable:
        print(f"attnbench leaderboard: error: {len(unreadable)} unreadable record(s) in {runs_dir(args.runs_dir) / 'records'} "
              f"(counted on the boards); repair or delete them and re-run; exit status 1", file=sys.stderr)
        return 1
    return 0


def cmd_claims(args) -> int:
    from harness.report.claims import CLAIMS_FILE, build_claims_board, load_claims, render_claims_markdown

    board = build_claims_board(load_claims(args.claims_file or CLAIMS_FILE), args.runs_dir, args.data_root)
    print(render_claims_markdown(board), end="")
    return 0


def cmd_results(args) -> int:
    """Exit 1 when a record could not be read (the rest is still exported or imported), else 0; `compare` has its own
    codes (see `_compare_results`)."""
    from harness.results.exchange import export_records, import_records
    from harness.results.store import RecordStore

    if args.results_command == "compare":
        return _compare_results(args)
    if args.results_command == "retract":
        return _retract_results(args)
    if args.results_command == "export":
        transfer = export_records(RecordStore(args.runs_dir), args.out)
        summary = f"exported {transfer.counts['record']} record(s)" + (
            f" and {transfer.counts['conflicting copy']} conflicting cop(ies)" if transfer.counts["conflicting copy"] else "")
        if transfer.counts["other execution"]:
            summary += f", {transfer.counts['other execution']} other execution(s) of their keys"
        print(f"attnbench results: {summary} to {args.out}")
    else:
        store = RecordStore(args.into)
        transfer = import_records(args.sources, store)
        print(f"attnbench results: into {store.root}: {transfer.counts['added']} added, {transfer.counts['same']} already there, "
              f"{transfer.counts['execution']} other execution(s), {transfer.counts['conflict']} conflict(s)"
              + (f", {transfer.counts['retracted']} retracted before (not imported: see {store.retracted_dir})" if transfer.counts["retracted"] else "")
              + (f"; other executions of a key kept in {store.executions_dir} (the boards rank one per key and report how the copies agree)"
                 if transfer.counts["execution"] else "")
              + (f"; conflicts kept in {store.conflicts_dir} (the boards show them)" if transfer.counts["conflict"] else ""))
    for problem in transfer.problems:
        print(f"attnbench results: error: unreadable record {problem}", file=sys.stderr)
    return 1 if transfer.problems else 0


def _retract_results(args) -> int:
    """Exit 2 when nothing is selected (a selector that matches nothing is more likely a typo than a wish)."""
    from harness.results.store import RecordStore, runs_dir

    if not (runs_dir(args.runs_dir) / "records").is_dir():
        print(f"attnbench: error: {runs_dir(args.runs_dir) / 'records'} does not exist; point --runs-dir at a store", file=sys.stderr)
        return 2
    if not (args.keys or args.made_at or args.retract_suite or args.seed_batched):
        print("attnbench: error: results retract needs KEYs or a selector (--made-at, --suite, --seed-batched)", file=sys.stderr)
        return 2
    store = RecordStore(args.runs_dir)
    chosen = []
    for record in store:
        spec = record.spec or {}
        if ((not args.keys or record.key in args.keys)
                and (not args.made_at or (record.commit or "").startswith(args.made_at))
                and (not args.retract_suite or (spec.get("extra") or {}).get("suite") == args.retract_suite)
                and (not args.seed_batched or (record.execution or {}).get("seed_batch"))):
            chosen.append(record)
    unknown = set(args.keys) - {path.stem for path in store.root.glob("*.json")}
    if unknown:
        print(f"attnbench: error: no record of {', '.join(sorted(unknown))} in {store.root}", file=sys.stderr)
        return 2
    if not chosen:
        print(f"attnbench: error: no record in {store.root} matches the selection; nothing retracted", file=sys.stderr)
        return 2
    for record in chosen:
        spec = record.spec or {}
        what = f"{record.key} {spec.get('task')} {spec.get('label') or spec.get('variant')} seed {spec.get('seed')} (commit {(record.commit or '?')[:12]})"
        if args.dry_run:
            print(f"would retract {what}")
            continue
        successor = store.retract(record.key, args.because)
        print(f"retracted {what}; " + (f"its execution finished {successor.finished} takes its place" if successor else "the key runs again on the next bench"))
    return 0


def _compare_results(args) -> int:
    """0: every value the two sources share is identical; 3: some differ (the table says where and by how much);
    4: they share no key finished on both sides, so nothing was compared; 1: a record could not be read."""
    from harness.results.exchange import compare_sources

    agreements, counts, transfer = compare_sources(args.a, args.b)
    print(f"attnbench results compare: {counts['shared_ok']} key(s) finished in both; {counts['only_a']} only in {args.a}, {counts['only_b']} only in {args.b}")
    if agreements:
        print(f"{'task':<24} {'metric':<28} {'shared':>6} {'identical':>9} {'max |Δ|':>12}")
        for a in agreements:
            print(f"{a.task:<24} {a.metric:<28} {a.shared:>6} {a.identical:>9} {a.max_abs_diff:>12.6g}")
    for problem in transfer.problems:
        print(f"attnbench results: error: unreadable record {problem}", file=sys.stderr)
    if transfer.problems:
        return 1
    if not counts["shared_ok"]:
        return 4
    return 0 if all(a.identical == a.shared for a in agreements) else 3


def cmd_perf(args) -> int:
    from harness.studies.perf import measure

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.seed_batch is not None:
        from harness.studies.seed_batch_perf import measure_seed_batch

        if args.seed_batch < 1 or args.epochs < 1:
            raise ValueError("--seed-batch and --epochs take positive integers, e.g. --seed-batch 20 --epochs 20")
        rows = measure_seed_batch(args.variants, args.seed_batch, args.epochs, args.data_root, args.cache_dir)
        return 1 if any(row["failed"] for row in rows) else 0
    measure(args.variants, args.repeats, data_root=args.data_root, cache_dir=args.cache_dir, device=args.device)
    return 0


def cmd_scaling(args) -> int:
    from harness.studies.scaling import measure_scaling

    counts = [int(n) for n in args.workers.split(",")]  # checked by check_counts
    seeds = None if args.seed_counts is None else [int(n) for n in args.seed_counts.split(",")]  # checked by check_counts
    measure_scaling(args.suite, counts, variant_filter=args.variants, seeds=seeds, seed_batch=args.seed_batch,
                    data_root=args.data_root, cache_dir=args.cache_dir)
    return 0


def cmd_probe(args) -> int:
    from harness.studies.probe import run_fenchel_probe

    run_fenchel_probe(dataset=args.dataset, sentences=args.sentences, max_length=args.max_length, out_dir=args.out,
                      data_root=args.data_root)
    return 0


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
        return Machine.here().worker_problem(args.workers, getattr(args, "workers_per_gpu", None) or 1)
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
        return next(filter(None, (Machine.here().worker_problem(n) for n in counts)), None)
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


def answer_from_catalogue(args) -> int | None:
    """`list`, `describe` and a mistyped name or --set value of `run`/`tune`, answered from the cached
    catalogue (harness/plan/catalogue.py) without importing torch; None: the command goes the full way."""
    if getattr(args, "suite", None) and args.command in ("bench", "leaderboard", "scaling", "tune"):
        from harness.plan.suite import SuiteError, suite_path

        try:
            for name in args.suite if isinstance(args.suite, list) else [args.suite]:
                suite_path(name)
        except SuiteError as exc:
            print(f"attnbench: error: {exc}", file=sys.stderr)
            return 2
    if getattr(args, "plugin", None) or args.command not in ("list", "describe", "run", "tune"):
        return None
    from harness.plan import catalogue

    known = catalogue.load()
    if known is None:
        return None
    if args.command == "list":
        print("".join(known["list"][what] for what in (("variants", "tasks", "suites") if args.what == "all" else (args.what,))), end="")
        return 0
    if args.command == "describe":
        if args.name in known["describe"]:
            print(known["describe"][args.name])
            return 0
        from harness.plan.describe import unknown_task_or_variant

        print(f"attnbench: error: {unknown_task_or_variant(args.name, [*known['tasks'], *known['variants']])}", file=sys.stderr)
        return 2
    if args.task is None or args.variant is None:
        return None
    try:
        params, attention = parse_sets(args.set)
    except ValueError:
        return None  # the full path words it
    problem = catalogue.check_run(known, args.task, args.variant, params, attention)
    if problem:
        print(f"attnbench: error: {problem}", file=sys.stderr)
        return 2
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run_command(argv)
    except BrokenPipeError:
        # `attnbench describe ... | head`: the reader has gone, which is not an error worth a traceback. Python
        # would report the failed flush of the buffered rest at exit, so stdout is pointed at devnull first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by a closed pipe


def run_command(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_counts(args)
    if problem:
        print(f"attnbench: error: {problem}", file=sys.stderr)
        return 2
    answered = answer_from_catalogue(args)
    if answered is not None:
        return answered
    # After parsing: `--help` and a usage error need none of this. SuiteError and LauncherError are ValueErrors.
    from datamodules.paths import MissingDataError
    from modules.registry import DuplicateNameError, PluginError, UnknownNameError, load_plugin_file

    try:
        for plugin in getattr(args, "plugin", []):
            load_plugin_file(plugin)
        if getattr(args, "logger", None):
            from harness.results.store import runs_dir
            from harness.run.runner import use_logger

            use_logger(args.logger, runs_dir(getattr(args, "runs_dir", None)) / "logs")
        from datamodules.paths import DATA_ENV, data_root_problem, default_data_root

        problem = None
        if getattr(args, "data_root", None):
            args.data_root = os.path.abspath(args.data_root)
            problem = data_root_problem(args.data_root, "--data-root")
        elif hasattr(args, "data_root"):
            args.data_root = default_data_root()
            problem = data_root_problem(args.data_root, f"${DATA_ENV}")
        if problem:
            raise MissingDataError(problem)
        handler = {"list": cmd_list, "describe": cmd_describe, "check": cmd_check, "run": cmd_run, "bench": cmd_bench, "leaderboard": cmd_leaderboard, "claims": cmd_claims, "results": cmd_results, "perf": cmd_perf,
                   "probe": cmd_probe, "tune": cmd_tune,
                   "scaling": cmd_scaling}[args.command]
        return handler(args)
    except (UnknownNameError, DuplicateNameError, PluginError, MissingDataError, ValueError) as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnbench: interrupted; finished runs are recorded, re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
