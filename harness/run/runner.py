"""One run: seed -> datamodule + LightningModule -> fit (early stopping, best weights) -> test -> record."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import math
import os
import platform
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Mapping

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar

from datamodules.paths import is_environment_fault
from modules.attention.kernel import attention_paths
from modules.tasks import get_task

from harness.plan.spec import RunSpec
from harness.provenance import git_commit
from harness.results.record import Record, utc_now
from harness.run import distributed
from harness.run.callbacks import AtomicCheckpointIO, EpochTimer, FollowRankZeroPruning, History, KeepBestAndStop, ResumableRun, live_progress
from harness.run.distributed import SINGLE, Distribution
from harness.run.progress import resume_line, say


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(distribution: Distribution = SINGLE, precision: str = "32") -> dict[str, Any]:
    """What a run ran on; the label is the board's hardware class (quality is ranked across classes, cost is
    shown per class and never mixed), so a data-parallel run's label names its process count, and a run in a
    precision other than fp32 its precision (labels of fp32 runs stay as they were before runs had a precision)."""
    ddp = f", DDP {distribution.num_nodes} node(s)" if distribution.num_nodes > 1 else ", DDP" if distribution.is_distributed else ""
    ddp += f", {precision}" if precision != "32" else ""
    if torch.cuda.is_available():
        count = distribution.world_size
        return {
            "accelerator": "gpu",
            "device": torch.cuda.get_device_name(0),
            "device_count": count,
            "cpu": cpu_model(),
            "label": f"{count}x {torch.cuda.get_device_name(0)}{ddp}",
            "precision": precision,
        }
    threads = torch.get_num_threads()
    per = f"{distribution.world_size} processes x {threads} thread{'s' if threads > 1 else ''}" if distribution.is_distributed \
        else f"{threads} thread{'s' if threads > 1 else ''}/run"
    return {
        "accelerator": "cpu",
        "device": cpu_model(),
        "device_count": 0,
        "cpu": cpu_model(),
        "threads": threads,
        "label": f"CPU {cpu_model()} ({per}{ddp})",
        "precision": precision,
    }


def versions() -> dict[str, str]:
    import lightning
    import torch_geometric
    import torchmetrics

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "torch_geometric": torch_geometric.__version__,
        "torchmetrics": torchmetrics.__version__,
        # From the installed metadata: importing transformers costs seconds that graph runs do not need.
        "transformers": importlib.metadata.version("transformers"),
    }


class PeakMemory:
    """Peak memory of this run alone: GPU max allocated, or on CPU the process's peak RSS (VmHWM), which
    Linux lets us reset per run through /proc/self/clear_refs so that a long-lived worker does not
    report the peak of an earlier, larger run."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass

    def peak_mb(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        peak = process_memory_mb("VmHWM")
        if peak is not None:
            return peak
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_memory_mb(field: str = "VmRSS") -> float | None:
    """A memory line of /proc/self/status in MB (VmRSS now, VmHWM the peak); None where Linux's /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


DEVICE_FAILURE_MARKERS = (
    "CUDA out of memory", "out of memory", "CUDA error", "device-side assert", "illegal memory access",
    "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error", "NCCL error", "unspecified launch failure", "ECC error",
)
"""Messages of failures that belong to the device, not to the run: an OOM depends on what else holds the GPU
and on the batch a run drew; after a device-side assert the CUDA context is corrupt and fails every later
call in that process."""


def is_device_failure(exc: BaseException) -> bool:
    """An out-of-memory or CUDA error (anywhere in the exception's chain): the run is retryable and the
    worker process that saw it must end (its CUDA context may be unusable)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
        if isinstance(exc, (RuntimeError, MemoryError)) and any(m in str(exc) for m in DEVICE_FAILURE_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def release_device_memory() -> None:
    """Between runs of a long-lived worker: drop the last run's cached blocks and peak statistics, so the
    next run starts with the GPU's memory free and `peak_memory_mb` is its own."""
    import gc

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")
    warnings.filterwarnings("ignore", category=FutureWarning)


LOGGERS = ("csv", "tensorboard")
LOGGER_ENV, LOG_DIR_ENV = "ATTNBENCH_LOGGER", "ATTNBENCH_LOG_DIR"
"""`--logger` reaches every run through the environment: bench's worker processes and SLURM tasks inherit it,
so no launcher has to carry it."""


def use_logger(kind: str | None, log_dir: str | Path) -> None:
    """`--logger csv|tensorboard`: every run this process (or its workers) starts logs through Lightning's
    CSVLogger or TensorBoardLogger under `log_dir`/<task>/<label>/seed<seed>-<key>. Checked now, so that a
    missing tensorboard stops the command before anything runs."""
    if not kind:
        return
    if kind not in LOGGERS:
        raise ValueError(f"--logger {kind!r}: expected one of {', '.join(LOGGERS)}")
    if kind == "tensorboard" and not (importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")):
        raise ValueError("--logger tensorboard needs the tensorboard package: pip install 'attnbench[tensorboard]' "
                         "(or pip install tensorboard), or use --logger csv")
    os.environ[LOGGER_ENV] = kind
    os.environ[LOG_DIR_ENV] = str(Path(log_dir).resolve())


def experiment_logger(spec: RunSpec):
    """The Lightning logger `use_logger` chose for this run, or False (no logger: the record is the result)."""
    kind = os.environ.get(LOGGER_ENV)
    if not kind:
        return False
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    cls = {"csv": CSVLogger, "tensorboard": TensorBoardLogger}[kind]
    return cls(os.environ.get(LOG_DIR_ENV) or "logs", name=f"{spec.task}/{spec.display}", version=f"seed{spec.seed}-{spec.key}")


def execute(spec: RunSpec, *, data_root: str | None = None, cache_dir: str | None = None, commit: str | None = None,
            verbose: bool = False, distribution: Distribution = SINGLE, execution: Mapping[str, Any] | None = None,
            checkpoints=None) -> Record | None:
    """Run one spec and return its record. Never raises for a failing run: failures are data. `execution` says how
    it was launched (metadata for `Record.execution`); a data-parallel run adds its world size.

    With `checkpoints` (harness/results/checkpoints.py Checkpoints), the run saves its training state at their
    interval and, when a trusted checkpoint of its key is there, resumes from it (`Record.execution` then says
    from which epoch); the caller removes the checkpoint once it has written the record.

    Data-parallel (`distribution`), every rank trains and only global rank 0 tests (on one device, so each
    test example counts once) and returns the record; the other ranks return None."""
    quiet_lightning()
    release_device_memory()
    t0 = time.perf_counter()
    memory = PeakMemory()
    memory.reset()
    context = run_context(spec, commit, distribution)
    timer = EpochTimer()
    history = History()
    resumable = ckpt_path = module = None
    outcome: dict[str, Any]
    try:
        task = get_task(spec.task)
        if checkpoints is not None and not checkpoints.off:
            from harness.results import checkpoints as cp

            path = checkpoints.run_path(spec.key)
            # data-parallel, rank 0 alone judges (and may discard) the checkpoint: another rank reading it meanwhile
            # could decide otherwise, and ranks that disagree on resuming train different epochs and hang
            ckpt = cp.load_trusted(path, keys=[spec.key], commit=context["commit"], kind="run", world_size=distribution.world_size) \
                if distributed.global_rank() == 0 else None
            resumable = ResumableRun(str(path), checkpoints.interval,
                                     lambda epoch, resumes: cp.metadata("run", [spec.key], context["commit"], epoch, resumes,
                                                                        world_size=distribution.world_size))
        trainer, datamodule, module, best = _prepare(spec, data_root, cache_dir,
                                                     [timer, history, *([resumable] if resumable else []),
                                                      *(live_progress(task.monitor.name) if verbose else [])], distribution)
        if resumable is not None:
            resume = ckpt is not None and _fits(ckpt, module, path)
            if resume:
                say(resume_line([spec], int(ckpt["attnbench"]["epoch"]), path))
            ckpt = None
            if distributed.broadcast(resume):  # every rank loads the file rank 0 trusted
                ckpt_path = str(path)
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        if distribution.is_distributed:
            is_rank_zero = trainer.is_global_zero
            distributed.leave()
            if not is_rank_zero:
                return None
            trainer = L.Trainer(accelerator="auto", devices=1, precision=spec.precision, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)
        outcome = test_outcome(task, spec, trainer, module, datamodule, best.best_epoch, best.best_value,
                               rule=best.rule.description, best_step=best.best_step)
    except Exception as exc:  # noqa: BLE001 - any failure of one run is recorded, the suite goes on
        if distributed.global_rank() != 0:
            return None
        outcome = dict(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=8)[-4000:])
        if is_device_failure(exc) or is_environment_fault(exc):
            # Not the run's own failure (the device, or data, weights or network the machine lacks): the next
            # bench retries it (on a fresh worker: see worker.py).
            outcome["retryable"] = True
    measured = dict(
        epochs=timer.epochs,
        time_per_epoch_s=timer.mean_epoch_s,
        fit_time_s=timer.total_s,
        **fit_in_this_process(timer, resumable),
        wall_time_s=time.perf_counter() - t0,
        peak_memory_mb=memory.peak_mb(),
        history=history.compact(),
        finished=utc_now(),
        # which attention path (sdpa / flex / eager) ran: metadata, so the key and the results stay as they were
        execution=execution_metadata({**(execution or {}), **resumed_metadata(resumable), **attention_paths(module)}, distribution),
        **context,
    )
    if "error" in outcome:
        return Record.failed(spec, **outcome, **measured)
    # The mechanism diagnostics' last train and validation values beside the test pass's test/attn/*.
    outcome["diagnostics"] = {**history.final_diagnostics(), **outcome["diagnostics"]}
    return Record.ok(spec, **outcome, **measured)


def resumed_metadata(resumable: ResumableRun | None) -> dict[str, Any]:
    """`Record.execution`'s note of a resumed run: the epoch its last process started from (the epochs its checkpoint
    held) and how many times it was resumed. Metadata, never the key: it is the same experiment."""
    if resumable is None or resumable.resumed_from is None:
        return {}
    return {"resumed_from_epoch": resumable.resumed_from, "resumes": resumable.resumes}


def fit_in_this_process(timer: EpochTimer, resumable: ResumableRun | None) -> dict[str, float]:
    """{"fit_time_this_process_s": ...} for a run resumed from a checkpoint, whose fit_time_s counts the epochs the
    checkpoint held too while its wall_time_s is this process's; {} for a fit that all ran here."""
    return {"fit_time_this_process_s": timer.this_process_s} if resumed_metadata(resumable) else {}


def _fits(ckpt: Mapping[str, Any], module, path: Path) -> bool:
    """Whether a checkpoint's model state has this module's parameter names and shapes; if not (a change the code
    identity did not catch) it is discarded and the run starts afresh, rather than failing in Lightning's restore."""
    from harness.results.checkpoints import discard

    mine = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in (ckpt.get("state_dict") or {}).items()}
    if mine != theirs or not all(k in ckpt for k in ("optimizer_states", "loops", "callbacks")):
        discard(Path(path), "does not match this run's model")
        return False
    return True


def test_outcome(task, spec: RunSpec, trainer: L.Trainer, module, datamodule, best_epoch: int | None,
                 best_value: float | None, rule: str | None = None, best_step: int | None = None) -> dict[str, Any]:
    """Test a trained module and return the record's result fields (lone runs and seed batches alike); `rule`
    describes the early-stopping rule that chose the best epoch. The test pass also measures the mechanism
    diagnostics at these weights (`test/diag/<name>`, what the mechanism rules read), with the loss weights of the
    kept epoch (`best_step`: its last optimiser step; a graph's epoch is one step)."""
    if best_epoch is not None:
        module.evaluated_at = (best_epoch if best_step is None else best_step, best_epoch)
    tested = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    metrics = {}
    for metric in task.metrics:
        if metric.name not in tested:
            raise KeyError(f"task {spec.task} declares metric {metric.name!r} but the module logged {sorted(tested)}")
        metrics[metric.name] = {"value": float(tested[metric.name]), "higher_is_better": metric.higher_is_better}
    bad = [name for name, m in metrics.items() if not math.isfinite(m["value"])]
    if bad:
        raise FloatingPointError(f"test metrics {bad} are not finite")
    return dict(
        metrics=metrics,
        diagnostics={k: float(v) for k, v in tested.items() if k.startswith(("test/attn/", "test/diag/"))},
        best_epoch=best_epoch,
        best_monitor={"name": task.monitor.name, "value": best_value, **({"rule": rule} if rule else {})},
        parameters=sum(p.numel() for p in module.parameters()),
    )


def execution_metadata(execution: Mapping[str, Any] | None, distribution: Distribution = SINGLE) -> dict[str, Any] | None:
    """A run's `Record.execution`: how it was launched, and its world size when data-parallel; None when nothing
    says (a record without it ran alone, one seed per process)."""
    described = {**(execution or {}), **({"world_size": distribution.world_size} if distribution.is_distributed else {})}
    return described or None


def run_context(spec: RunSpec, commit: str | None, distribution: Distribution = SINGLE) -> dict[str, Any]:
    """The record's fields that say where and with what a run ran."""
    return {
        "started": utc_now(),
        "commit": commit or git_commit(),
        "versions": versions(),
        "hardware": hardware(distribution, spec.precision),
        "distributed": distribution.describe() if distribution.is_distributed else None,
    }


def _prepare(spec: RunSpec, data_root: str | None, cache_dir: str | None, callbacks: list, distribution: Distribution = SINGLE):
    """The seeded trainer, datamodule, module and best-epoch keeper of a run (shared by runs and tuning)."""
    task = get_task(spec.task)
    params = task.Params(**spec.params)
    L.seed_everything(spec.seed, workers=True, verbose=False)
    datamodule, module = task.build(params, spec.attention, data_root=data_root, cache_dir=cache_dir)
    logger = experiment_logger(spec)
    best = KeepBestAndStop(task.stopping_rule(params), task.monitor)
    trainer = L.Trainer(
        max_epochs=params.max_epochs,
        accelerator="auto",
        # mid-run checkpoints (ResumableRun) are written atomically and loaded with weights_only=True
        plugins=[AtomicCheckpointIO.make()],
        precision=spec.precision,
        **distribution.trainer_kwargs(),
        logger=logger,
        # a logger sees every step (full-batch graph tasks have one per epoch); without one nothing is logged
        **({"log_every_n_steps": 1} if logger else {}),
        enable_checkpointing=False,
        enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),  # `run` on a terminal: live_progress
        enable_model_summary=False,
        num_sanity_val_steps=0,
        # KeepBestAndStop first: it raises when the monitored metric was never logged, before any
        # other callback (a pruner) reads it.
        callbacks=[best, *callbacks],
    )
    return trainer, datamodule, module, best


def fit_for_validation(spec: RunSpec, *, trial=None, data_root: str | None = None, cache_dir: str | None = None,
                       distribution: Distribution = SINGLE, follow_pruning: bool = False) -> tuple[float, dict[str, float]]:
    """Train a spec and return the best validation value of its task's monitor, with every validation
    metric at that epoch; no test set is touched.
    With an Optuna `trial`, each epoch's value is reported to it and unpromising trials are pruned.
    Data-parallel, rank 0 holds the trial and the other ranks pass `follow_pruning`, so that they stop
    where rank 0's pruner stops."""
    quiet_lightning()
    callbacks = []
    pruner = None
    if trial is not None:
        from optuna_integration import PyTorchLightningPruningCallback

        pruner = PyTorchLightningPruningCallback(trial, monitor=get_task(spec.task).monitor.name)
        callbacks.append(pruner)
    elif follow_pruning:
        callbacks.append(FollowRankZeroPruning())
    trainer, datamodule, module, best = _prepare(spec, data_root, cache_dir, callbacks, distribution)
    trainer.fit(module, datamodule=datamodule)
    if pruner is not None and distribution.is_distributed:
        # In DDP the callback stops training and leaves raising TrialPruned to us; it re-reports the values
        # it already reported, which Optuna ignores with a warning per epoch.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The reported value is ignored")
            pruner.check_pruned()
    if best.best_value is None:
        raise FloatingPointError(f"{spec.task} x {spec.variant}: the monitored validation metric was never finite")
    return best.best_value, best.best_metrics
