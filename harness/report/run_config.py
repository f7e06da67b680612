"""What `run --dry-run` (`--print-config`) prints: a planned run's resolved configuration and whether its key
already finished, read from the store without creating it. In the report floor: it reads both a plan's spec
and the records."""

from __future__ import annotations


from harness.plan.describe import task_sites


def resolved_run(spec, runs: str | None, force: bool = False) -> str:
    """What `run --dry-run` prints, as YAML: the run, its key and whether it already finished, the task's
    parameters and the attention config as given and as each of the task's sites resolves it (per-host
    defaults filled in by AttentionConfig.for_site). Reads the store without creating it."""
    import yaml

    from modules.attention import attention_entry
    from modules.tasks import get_task

    from harness.results.record import Status
    from harness.results.store import runs_dir

    path = runs_dir(runs) / "records" / f"{spec.key}.json"
    if not path.is_file():
        status = "not run yet: `run` runs it"
    else:
        from harness.results.store import UnreadableRecord

        try:
            record = _read_record(path)
        except UnreadableRecord as exc:
            record, status = None, f"its record is unreadable ({exc}): `run` runs it again"
        if record is not None:
            if record.status is Status.OK:
                status = f"finished ({path}): " + ("`run` reports it; --force runs it again" if not force else "--force runs it again")
            else:
                status = f"{record.status.value} ({path}): `run` runs it again"
    entry = attention_entry(spec.variant)
    options = {k: v for k, v in spec.attention.items() if k != "name"}
    config = entry.cls.Config(**options)
    per_site = {label: config.for_site(site).to_dict() for label, site in task_sites(get_task(spec.task)).items()}
    body = {
        "run": {"task": spec.task, "variant": spec.variant, "seed": spec.seed, "precision": spec.precision},
        "key": spec.key,
        "status": status,
        "versions": {"task": spec.task_version, "variant": spec.variant_version},
        "task parameters": dict(spec.params),
        "attention (as configured; None = the host decides)": options,
        "attention at each site of the task (per-host defaults filled in)": per_site,
    }
    return yaml.safe_dump(body, sort_keys=False, allow_unicode=True)


def _read_record(path):
    import json

    from harness.results.record import Record
    from harness.results.store import UnreadableRecord

    try:
        return Record.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise UnreadableRecord(path, exc) from exc
