"""Every built-in variant's source is recorded under its version (modules/attention/source_versions.json), so
that editing a variant without bumping its `version`, which is all its run keys hold, fails here with the fix."""

from modules.attention.source_versions import COMMAND, current, load_table, problems, update


def test_every_built_in_variant_s_source_is_recorded_under_its_current_version():
    found = problems(load_table(), current())
    assert not found, "\n".join(found)


def test_a_recorded_version_never_stands_for_two_sources_unless_declared_unchanged():
    table = load_table()
    assert len({(r["variant"], r["version"], r["source"]) for r in table}) == len(table)
    assert {r["variant"] for r in current()} <= {r["variant"] for r in table}


def _rows(version="2", source="aaa"):
    return [{"variant": "bam-weibull", "version": version, "source": source, "file": "modules/attention/variants/bam.py"}]


def test_an_edit_without_a_version_bump_is_refused_with_what_to_do():
    table = [{k: v for k, v in r.items() if k != "file"} for r in _rows()]
    edited = _rows(source="bbb")
    [problem] = problems(table, edited)
    assert "source of bam-weibull (modules/attention/variants/bam.py) changed" in problem
    assert "bump its class's `version`" in problem and COMMAND in problem
    rows, refused = update(table, edited, unchanged=set())
    assert rows == table and refused == [problem]
    rows, refused = update(table, edited, unchanged={"bam-weibull"})  # declared: same results, new source
    assert not refused and {r["source"] for r in rows} == {"aaa", "bbb"}

    bumped = _rows(version="3", source="bbb")
    [problem] = problems(table, bumped)
    assert "version 3 is not in" in problem
    rows, refused = update(table, bumped, unchanged=set())
    assert not refused and not problems(rows, bumped) and len(rows) == 2
