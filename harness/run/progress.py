"""What a process says about its runs while they train: a seed batch's epoch lines and which checkpoint a run
resumes from. Beside both the lone runner and the seed batch (which imports the runner), so that either can say it.

Where the lines go is the caller's choice, set for a block of code (`progress_lines`): `run --seeds` prints every
epoch; bench's workers print a batch's line at most every `every_s` seconds into the bench's own log (a spawned
worker writes to the coordinator's standard output, each line flushed whole). Outside such a block a resume is
still printed, since a run that silently continues from epoch 51 reads as a run that restarted."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Sequence

_progress_out: contextvars.ContextVar[tuple[Callable[[str], None], float] | None] = contextvars.ContextVar("run_progress", default=None)


def _print(line: str) -> None:
    print(line, flush=True)


@contextlib.contextmanager
def progress_lines(out: Callable[[str], None] = _print, every_s: float = 0.0):
    """Within it, a seed batch reports its epochs through `out`: every epoch (`run --seeds`, whose user otherwise
    waits for the first seed to stop in silence), or at most one line per `every_s` seconds (bench's workers,
    whose runs also report one line each as they end, and whose batches would otherwise be silent for minutes)."""
    token = _progress_out.set((out, every_s))
    try:
        yield
    finally:
        _progress_out.reset(token)


def batch_progress() -> tuple[Callable[[str], None], float] | None:
    """(out, every_s) of the enclosing progress_lines; None outside one (a seed batch then prints no epoch lines)."""
    return _progress_out.get()


def say(line: str) -> None:
    """A line about this process's runs (a resume): through progress_lines' `out` where it is set, else printed."""
    found = _progress_out.get()
    (found[0] if found else _print)(line)


def resume_line(specs: Sequence, epoch: int, path) -> str:
    """"attnbench: resuming cora x bam-weibull seed 1 from its checkpoint at epoch 51 (<file>)": which runs continue,
    from which file, after how many epochs (their progress counts on from there; their record's fit_time_s counts
    the whole fit, fit_time_this_process_s this process's part). `specs`: RunSpecs of one configuration."""
    seeds = [s.seed for s in specs]
    which = f"seed {seeds[0]} from its checkpoint" if len(seeds) == 1 else \
        f"seeds {', '.join(map(str, seeds))} from their seed batch's checkpoint"
    return f"attnbench: resuming {specs[0].task} x {specs[0].display} {which} at epoch {epoch} ({getattr(path, 'name', path)})"
