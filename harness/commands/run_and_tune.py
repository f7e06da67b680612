"""What `run` and `tune` share: both plan one task x variant from the command line as `bench` plans a suite,
word a bad --set value the same way, and start the same data-parallel processes.

`run` and `tune` call these through this module (run_and_tune.plan_command_line_runs), so that a test can
replace one here and know neither verb goes the full way."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def values_from_flags(task: str | None = None, variant: str | None = None):
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


def plan_command_line_runs(args, jobs: list[tuple[str, str | dict, int, dict]], extra: dict):
    """`run` and `tune` plan like `bench` does: names resolved and each task's data checked, once."""
    from harness.plan.planner import plan_runs

    task, attention = jobs[0][:2]
    with values_from_flags(task, attention if isinstance(attention, str) else attention["name"]):
        the_plan = plan_runs(jobs, args.data_root, extra, precision=args.precision)
    if not args.plugin:
        from harness.plan import catalogue

        catalogue.refresh()
    the_plan.require_data()
    if not getattr(args, "dry_run", False):
        the_plan.require_checkpoints()
    elif the_plan.checkpoint_report():
        # a dry run trains nothing: it says what a real one would refuse with and goes on
        print(f"attnbench: without its checkpoint a real run is refused before anything runs:\n{the_plan.checkpoint_report()}",
              file=sys.stderr)
    return the_plan


def start_processes(args):
    """Join or start the DDP processes of `run`/`tune` (a no-op for one process), each with its share of the
    CPU threads; returns (distribution, this process's global rank)."""
    from harness.run.distributed import Distribution, start
    from harness.run.runner import quiet_lightning
    from harness.run.threads import configure_worker_threads

    distribution = Distribution(args.strategy, args.devices, args.num_nodes)
    quiet_lightning()
    configure_worker_threads(distribution.devices)
    return distribution, start(distribution)
