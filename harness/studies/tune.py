"""`attnbench tune`: one Optuna study per (task, variant), on validation data only.

The search space is the variant's own (`AttentionConfig.suggest`), optionally with the task's optimiser
knobs (`--tune-optimizer`: lr, weight_decay around the task's values). The first trial of every study
is the variant's default configuration, so a study always says how much tuning bought over the
defaults. Trials train with TUNE_SEED, which no suite uses: the tuned configuration is then re-run on
the suite's seeds (`bench --params tuned`) for the reported test numbers, never tested on the seed that
chose it.

Storage is embedded SQLite under the runs folder unless a URL is given (PostgreSQL on a cluster, or
`journal:<file>` on a shared filesystem). Several `tune` processes on one storage share a study: each
stops once the study's finished (complete or pruned) and running trials make up its budget, so that together
they finish exactly that many. With an RDB storage,
trials send heartbeats: a trial whose process was killed is marked failed after the grace period and
retried once by the next process (Optuna's RetryFailedTrialCallback).

Data-parallel (`--strategy ddp --devices N`), every trial is one DDP run: rank 0 alone opens the study,
samples the trial and broadcasts the resulting run spec; the other ranks train what they receive until
rank 0 says the study is done. Pruning is decided on rank 0 and broadcast by optuna-integration's
callback, which in DDP needs an RDB storage (SQLite or PostgreSQL, not a journal file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from modules.attention import attention_entry, resolve_config
from modules.lit.attention_terms import DivergedError
from modules.tasks import get_task

from harness.plan.spec import RunSpec, make_spec
from harness.plan.tuned import runs_params_dir, study_budget, tuned_path
from harness.results.store import runs_dir, write_atomically
from harness.run import distributed
from harness.run.distributed import SINGLE, Distribution
from harness.run.runner import fit_for_validation

TUNE_SEED = 9973
"""Seed of every tuning trial: outside the seeds suites run (0, 1, 2, ...)."""
HEARTBEAT_S = 60
GRACE_S = 180
VALIDATION_ATTR = "validation"
"""User attribute holding every validation metric of a trial's best epoch."""
DEFAULTS_ATTR = "defaults"
"""User attribute of the trial that trains the variant's default configuration."""
SURPLUS_ATTR = "surplus"
"""User attribute of a trial that found the budget already taken by other processes' trials (failed, untrained)."""
OWNER_ATTR = "attnbench_process"
"""The "host:pid" of the process that runs a trial (_fail_dead_trials)."""


class BudgetReached(Exception):
    """The study's budget is taken by other processes' finished and running trials."""


class DuplicateDefaults(Exception):
    """Another trial of the study already trains the defaults (processes that found the study empty at once each
    enqueued them)."""


def default_storage(runs: str | None = None) -> str:
    path = runs_dir(runs) / "optuna.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def open_storage(url: str, *, heartbeat_s: int | None = None, grace_s: int | None = None):
    """An Optuna storage for a URL; RDB storages get heartbeats (ATTNBENCH_TUNE_HEARTBEAT_S, _GRACE_S or
    the defaults here) so that a killed worker's trial is failed and retried."""
    heartbeat_s = heartbeat_s or int(os.environ.get("ATTNBENCH_TUNE_HEARTBEAT_S", HEARTBEAT_S))
    grace_s = grace_s or int(os.environ.get("ATTNBENCH_TUNE_GRACE_S", GRACE_S))
    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    if url.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    from sqlalchemy.exc import IntegrityError, OperationalError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats: experimental since 2.8
                return RDBStorage(url, heartbeat_interval=heartbeat_s, grace_period=grace_s,
                                  heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))
        except (IntegrityError, OperationalError):
            # Processes creating a fresh storage's schema at once collide ("table studies already exists",
            # or both inserting its version row; seen with SQLite); the losers find it complete on a retry.
            if attempt == 2:
                raise
            time.sleep(0.5)


def study_name(task: str, variant: str, params: Mapping[str, Any], tune_optimizer: bool) -> str:
    """Deterministic: the same task, variant, task parameters and search space share one study."""
    identity = {"params": dict(params), "variant_version": attention_entry(variant).version, "optimizer": tune_optimizer}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{task}/{variant}/{digest}"


@dataclass
class TuneResult:
    task: str
    variant: str
    study: str
    monitor: str
    higher_is_better: bool
    best_value: float
    default_value: float | None
    best_metrics: dict[str, float]
    default_metrics: dict[str, float]
    attention: dict[str, Any]
    params: dict[str, Any]
    trials: dict[str, int]
    seconds: float
    task_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The task parameters every trial trained with (their epoch budget is part of the study's budget)."""
    storage: str = ""
    """The Optuna storage URL holding the study."""


def variant_knobs(variant: str) -> list[str]:
    """The option names the variant's search space suggests (modules.attention.registry.search_space_options)."""
    from modules.attention.registry import search_space_options

    return search_space_options(variant)


def require_a_search_space(variant: str, tune_optimizer: bool) -> None:
    """Refuse a study whose every trial would train the same configuration."""
    if not tune_optimizer and not variant_knobs(variant):
        raise ValueError(f"variant {variant!r} has no options of its own to tune (its Config.suggest searches nothing), so "
                         "every trial would train the same configuration; add --tune-optimizer to tune the task's lr and "
                         "weight_decay, or tune a variant with options (`attnbench describe VARIANT`)")


def distinct(value: float, earlier: list[float], least: int = 4) -> str:
    """`value` with `least` decimals, or as many more as it takes to read differently from every earlier trial's
    different value: three α that all read val/loss=1.9448 look like one result printed three times."""
    for digits in range(least, 17):
        text = f"{value:.{digits}f}"
        if all(other == value or f"{other:.{digits}f}" != text for other in earlier):
            return text
    return repr(value)


def dashboard_command(storage: str) -> str:
    """How to open a storage with optuna-dashboard (a journal file is opened by its path)."""
    target = storage.removeprefix("journal:") if storage.startswith("journal:") else storage
    return f"optuna-dashboard {target}"


def _suggest_task_knobs(trial, base: Mapping[str, Any]) -> dict[str, Any]:
    knobs = {}
    if base.get("lr"):
        knobs["lr"] = trial.suggest_float("task.lr", base["lr"] / 3, base["lr"] * 3, log=True)
    if "weight_decay" in base:
        knobs["weight_decay"] = trial.suggest_float("task.weight_decay", 1e-6, 0.1, log=True)
    return knobs


def tune(task: str, variant: str, *, trials: int, params: Mapping[str, Any] | None = None, storage: str | None = None,
         timeout: float | None = None, tune_optimizer: bool = False, runs: str | None = None, data_root: str | None = None,
         cache_dir: str | None = None, sampler_seed: int = 0, distribution: Distribution = SINGLE, log=print,
         precision: str = "32") -> TuneResult | None:
    """Bring the (task, variant) study to `trials` finished trials and return its best configuration; None on
    DDP ranks other than 0 (which only train what rank 0 sends) and when the study has no completed trial yet
    because the rest of its budget runs in other processes (the last of them returns and exports the best)."""
    if distribution.is_distributed and distributed.global_rank() != 0:
        _follow_rank_zero(distribution, data_root, cache_dir)
        return None
    import optuna
    from optuna.trial import TrialState

    if trials < 1:
        raise ValueError("--trials must be at least 1")
    task_def = get_task(task)
    resolved = dataclasses.asdict(task_def.params(params))
    resolve_config(variant)  # an unknown variant fails here, with the closest names
    require_a_search_space(variant, tune_optimizer)
    name = study_name(task, variant, resolved, tune_optimizer)
    if precision != "32":  # its own study; fp32 studies keep the names they had before runs had a precision
        name += f"/{precision}"
    direction = "maximize" if task_def.monitor.higher_is_better else "minimize"
    storage = storage or default_storage(runs)
    log(f"attnbench tune: study {name} is stored in {storage}; watch it with `{dashboard_command(storage)}` "
        "(pip install optuna-dashboard)")
    study = optuna.create_study(
        study_name=name,
        storage=open_storage(storage),
        load_if_exists=True,
        direction=direction,
        sampler=optuna.samplers.TPESampler(seed=sampler_seed),
        # Pruning compares a trial's validation curve with the median of earlier trials at the same epoch;
        # the first trials and epochs run unpruned so that the median means something.
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=max(1, resolved.get("max_epochs", 10) // 5)),
    )
    _fail_dead_trials(study, log)
    if study.trials:
        # A resumed study (a killed or earlier `tune`): a sampler seeded as the first process's would draw that
        # process's random start-up configurations again and train them twice; seeded by the trials already
        # stored, it goes on drawing new ones, still reproducibly. (A fresh study keeps `sampler_seed` itself.)
        study.sampler = optuna.samplers.TPESampler(seed=sampler_seed + len(study.trials))
    if not study.trials:
        # Trial 0 trains the defaults as they are (some are None = "the variant decides", which no search
        # range holds), so it suggests nothing; TPE models each parameter from the trials that have it.
        study.enqueue_trial({}, user_attrs={DEFAULTS_ATTR: True})

    def finished() -> int:
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))

    def budget_taken(before: int | None = None) -> bool:
        """Finished and running trials (numbered below `before`, if given) already make up the budget. Several
        processes share a study: stopping only once `trials` have finished would let each of them start one
        more trial and overshoot; a trial of a killed process is first failed (its heartbeat stopped), so that
        it does not hold a place in the budget."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # a no-op without heartbeats (journal files)
        taken = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
        return sum(1 for t in taken if before is None or t.number < before) >= trials

    seen: dict[str, list[float]] = {}  # each metric's values in this process's trials, for `distinct`
    duplicates: list[int] = []  # this process's trials that found the defaults already taken (DuplicateDefaults)

    def objective(trial) -> float:
        if budget_taken(before=trial.number):
            # Two processes asked for a trial at the same moment and the other one got the last place: this
            # trial ends at once, marked as surplus (failed, never trained), and this process stops.
            trial.set_user_attr(SURPLUS_ATTR, True)
            study.stop()
            raise BudgetReached(f"study {name} already has {trials} finished or running trials")
        if trial.user_attrs.get(DEFAULTS_ATTR) and _defaults_taken(study, trial.number):
            # Processes that found the study empty at the same moment each enqueued the defaults: the later copy ends
            # at once (failed, never trained, marked surplus, so it holds no place in the budget) and this process
            # goes on to a new configuration
            trial.set_user_attr(SURPLUS_ATTR, True)
            duplicates.append(trial.number)
            raise DuplicateDefaults(f"an earlier trial of study {name} trains the defaults")
        trial.set_user_attr(OWNER_ATTR, _owner())  # what a restarted tune on this host recognises as dead
        if trial.user_attrs.get(DEFAULTS_ATTR):
            config, overrides = {}, resolved
        else:
            config = attention_entry(variant).cls.Config.suggest(trial)
            overrides = {**resolved, **(_suggest_task_knobs(trial, resolved) if tune_optimizer else {})}
        spec = make_spec(task, {"name": variant, **config}, TUNE_SEED, overrides, extra={"command": "tune", "study": name},
                         precision=precision)
        distributed.broadcast(spec.to_dict())
        value, metrics = fit_for_validation(spec, trial=trial, data_root=data_root, cache_dir=cache_dir, distribution=distribution)
        trial.set_user_attr(VALIDATION_ATTR, metrics)
        shown = ", ".join(f"{k}={distinct(v, seen.setdefault(k, []))}" for k, v in sorted(metrics.items()))
        for k, v in metrics.items():
            seen[k].append(v)
        log(f"attnbench tune: {name} trial {trial.number}: {shown} {config}")
        return value

    def enough(study_, _trial) -> None:
        if budget_taken():
            study_.stop()

    started = time.perf_counter()
    remaining = trials - finished()
    if remaining > 0:
        log(f"attnbench tune: study {name}: {finished()} of {trials} trials finished; running up to {remaining}")
        # Diverged trials (NaN loss) are failures of that configuration, recorded as such; the study goes on.
        try:
            catch = (DivergedError, FloatingPointError, BudgetReached, DuplicateDefaults)
            study.optimize(objective, n_trials=remaining, timeout=timeout, catch=catch, callbacks=[enough])
            # a duplicate of the defaults trained nothing: its place in this process's share goes to a new trial
            while duplicates and not budget_taken():
                extra = len(duplicates)
                duplicates.clear()
                study.optimize(objective, n_trials=extra, timeout=timeout, catch=catch, callbacks=[enough])
        finally:
            distributed.broadcast(None)  # the other DDP ranks stop following (a no-op on one process)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete and study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        log(f"attnbench tune: study {name}: the rest of its budget runs in other processes; the last of them to finish "
            "writes the best parameters")
        return None
    if not complete:
        raise RuntimeError(f"study {name} has no completed trial (all failed or pruned): see `optuna-dashboard` on its storage")
    best = study.best_trial
    attention = {"name": variant, **{k: v for k, v in best.params.items() if not k.startswith("task.")}}
    task_knobs = {k.removeprefix("task."): v for k, v in best.params.items() if k.startswith("task.")}
    default_trial = next((t for t in complete if t.user_attrs.get(DEFAULTS_ATTR)), None)
    counts = {state.name.lower(): len(study.get_trials(deepcopy=False, states=(state,)))
              for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    seconds = sum((t.duration.total_seconds() for t in study.trials if t.duration is not None), 0.0)
    best_metrics = best.user_attrs.get(VALIDATION_ATTR, {})
    default_metrics = default_trial.user_attrs.get(VALIDATION_ATTR, {}) if default_trial else {}
    log(f"attnbench tune: {name}: best trial {best.number}: {best_metrics or best.value}; defaults (trial 0): "
        f"{default_metrics or 'not finished'}; trials {counts}; this call took {time.perf_counter() - started:.0f} s")
    return TuneResult(task, variant, name, task_def.monitor.name, task_def.monitor.higher_is_better, float(best.value),
                      float(default_trial.value) if default_trial else None, best_metrics, default_metrics, attention, task_knobs,
                      counts, seconds, task_params=resolved, storage=storage)


def _defaults_taken(study, number: int) -> bool:
    """Whether a trial numbered below `number` trains the defaults and has not failed (a failed one, its process
    killed, is retried as a trial of its own)."""
    from optuna.trial import TrialState

    return any(t.number < number and t.user_attrs.get(DEFAULTS_ATTR) and not t.user_attrs.get(SURPLUS_ATTR)
               and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
               for t in study.get_trials(deepcopy=False))


def _owner() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _fail_dead_trials(study, log=print) -> list[int]:
    """A `tune` restarted after its process was killed (kill -9, a preempted or requeued job): the trial that
    process was running is still RUNNING in the storage, and heartbeats fail it only after their grace period
    (GRACE_S); until then it holds a place in the budget and is retried by no one. A RUNNING trial whose owner
    (OWNER_ATTR: host and pid, set when it started) ran on this host in a process that no longer exists is failed
    now, and retried once as the heartbeat would (RetryHeartbeatStaleTrialCallback enqueues a copy with the same
    parameters): the killed trial counts as FAIL, its retry once, so it is never counted twice. Its state change is
    atomic in the storage: of two processes restarting at once, one fails and retries it, the other sees it failed.
    Trials of other hosts (or with live processes) are left to the heartbeats. Returns the failed trials' numbers."""
    import socket

    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    here = socket.gethostname()
    storage = study._storage
    retry = getattr(storage, "get_heartbeat_stale_trial_callback", lambda: None)()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        host, _, pid = str(trial.user_attrs.get(OWNER_ATTR, "")).rpartition(":")
        if host != here or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:  # another restarted process failed it first
            continue
        failed.append(trial.number)
        if retry is not None:
            retry(study, storage.get_trial(trial._trial_id))
        log(f"attnbench tune: trial {trial.number} was running in process {pid}, which is gone (killed): failed, "
            f"{'and retried once with the same parameters' if retry is not None else 'not retried (no RDB storage)'}")
    return failed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _follow_rank_zero(distribution: Distribution, data_root: str | None, cache_dir: str | None) -> None:
    """A DDP rank other than 0: train each run spec rank 0 broadcasts, until it broadcasts None."""
    from optuna import TrialPruned

    while (message := distributed.broadcast(None)) is not None:
        try:
            fit_for_validation(RunSpec.from_dict(message), data_root=data_root, cache_dir=cache_dir, distribution=distribution,
                               follow_pruning=True)
        except (TrialPruned, Exception):  # noqa: BLE001 - rank 0 records what became of the trial (its own copy of
            pass                          # the error); this rank only keeps in step until rank 0 says stop


def export(result: TuneResult, root: str | Path | None = None) -> Path:
    """Write the best configuration beside its study, in the runs folder (`root`; default <runs-dir>/params),
    by atomic rename; `bench --params tuned --params-dir` reads it from there, and `tune --promote` copies it
    to the committed leaderboards/params/ (harness/plan/tuned.py)."""
    path = tuned_path(result.task, result.variant, root if root is not None else runs_params_dir(runs_dir(None)))
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "task": result.task,
        "variant": result.variant,
        "attention": result.attention,
        "params": result.params,
        "validation": {"metric": result.monitor, "best": result.best_value, "defaults": result.default_value,
                       "best_metrics": result.best_metrics, "default_metrics": result.default_metrics},
        "budget": study_budget(result.trials.get("complete", 0) + result.trials.get("pruned", 0), result.task_params),
        "tuning": {"study": result.study, "trials": result.trials, "seconds": round(result.seconds, 1), "seed": TUNE_SEED},
        "study_storage": result.storage,
        "trained_with": result.task_params,
    }
    # a temp file of its own: processes sharing a study each export the best at their end, and one fixed temp
    # name let one process's rename take away the file another was about to rename (FileNotFoundError)
    return write_atomically(path, lambda fh: fh.write(yaml.safe_dump(body, sort_keys=False).encode()))
