"""A suite's declared seed history checked against its records' finish times (harness/report/seed_history.py,
issue 51 item 4)."""

from pathlib import Path
from types import SimpleNamespace

from harness.report.seed_history import contradicted, growths, seed_history_lines, what_records_show


def suite(after_first_seeds=True, at="2026-11-24T20:00:00+00:00"):
    return SimpleNamespace(seed_history=(
        {"seeds": 2, "declared": "2026-11-24", "why": "declared first"},
        {"task": "citeseer", "seeds": 4, "declared": "2026-11-24", "commit": "abc1234", "at": at,
         "after_first_seeds": after_first_seeds, "why": "after every row's first 2 seeds had finished"},
    ))


def spec(task, label, seed):
    return SimpleNamespace(task=task, display=label, seed=seed, key=f"{task}-{label}-{seed}")


SPECS = [spec(task, label, seed) for task in ("cora", "citeseer") for label in ("softmax", "align-ct") for seed in range(4 if task == "citeseer" else 2)]


def records(finished):
    """citeseer's records with the given finish times per (label, seed); every other record long before."""
    found = {}
    for s in SPECS:
        when = finished.get((s.display, s.seed), "2026-11-24T10:00:00+00:00") if s.task == "citeseer" else "2026-11-20T00:00:00+00:00"
        found[s.key] = SimpleNamespace(finished=when)
    return found


def test_a_growth_the_records_contradict_is_flagged_with_what_they_show():
    """align-ct's first two CiteSeer seeds finished after the growth: the declaration's "after every row's first
    seeds had finished" does not hold, and the page says so beside the counts."""
    late = {("align-ct", 0): "2026-11-24T21:00:00+00:00", ("align-ct", 1): "2026-11-25T08:00:00+00:00"}
    [growth] = growths(suite())
    assert (growth.task, growth.before, growth.after, growth.label) == ("citeseer", 2, 4, "abc1234, 2026-11-24 20:00 UTC")
    shown = what_records_show(growth, SPECS, records(late))
    assert shown == {"rows": 2, "complete": ["softmax"], "none": ["align-ct"], "partial": {}}
    assert contradicted(growth, shown)
    [line] = seed_history_lines(suite(), SPECS, records(late))
    assert "1 of the 2 rows planned now had all 2 first seeds finished" in line and "`align-ct`" in line
    assert "the records contradict it" in line


def test_a_growth_the_records_bear_out_is_not_flagged():
    [line] = seed_history_lines(suite(), SPECS, records({}))
    assert "2 of the 2 rows planned now had all 2 first seeds finished" in line and "contradict" not in line
    # an entry that asserts nothing is never contradicted, whatever the records show
    late = {("align-ct", 0): "2026-11-25T00:00:00+00:00"}
    [line] = seed_history_lines(suite(after_first_seeds=False), SPECS, records(late))
    assert "`align-ct` 1 of them" in line and "contradict" not in line


def test_without_a_time_the_growth_is_the_end_of_its_declared_day():
    [growth] = growths(suite(at=None))
    assert growth.at.isoformat() == "2026-11-24T23:59:59+00:00" and growth.label == "abc1234, declared 2026-11-24"


def test_the_committed_paper_gat_history_is_checked_against_its_records(shared_data):
    """The committed records contradict paper-gat's declaration (issue 51): rows without CiteSeer records then."""
    from harness.plan.planner import plan
    from harness.plan.suite import load_suite
    from harness.results.store import RecordStore

    the_plan = plan(load_suite("paper-gat"), str(shared_data))
    store = RecordStore(Path(__file__).resolve().parents[2] / "leaderboards")
    loaded = store.load(s.key for s in the_plan.specs)
    [line] = seed_history_lines(the_plan.suite, the_plan.specs, loaded.records)
    assert line.startswith("`citeseer` grew from 20 to 36 seeds (0460c41, 2026-11-24 20:24 UTC)")
    assert "`entmax`" in line and "the records contradict it" in line
