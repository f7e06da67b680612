"""A board row is one variant at one keyed version: records of an edited plugin's old code (or of a built-in
before its version was bumped) are reported as superseded and never counted as seeds of the new code."""

import csv
import dataclasses
import textwrap

import pytest

from harness.cli import main
from harness.plan.spec import make_spec
from harness.results.store import RecordStore

from .test_board import BASE, record

PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass

    from modules.attention import AttentionConfig, AttentionKernel, AttentionResult, register_attention


    @dataclass(frozen=True)
    class TemperedConfig(AttentionConfig):
        temperature: float = 0.5


    @register_attention("tempered-edit-test")
    class TemperedSoftmax(AttentionKernel):
        Config = TemperedConfig
        softmax_limit = {"temperature": 1.0}

        def normalize(self, logits, groups, *, q=None, k=None):
            return AttentionResult(groups.softmax(logits / self.config.temperature))
''')
NAME = "tempered-edit-test"


@pytest.fixture
def plugin(tmp_path):
    from modules.attention.registry import ATTENTIONS
    from modules.registry import load_plugin_file, source_digest

    path = tmp_path / "my_variant.py"
    path.write_text(PLUGIN)
    load_plugin_file(path)
    source_digest.cache_clear()
    yield path
    ATTENTIONS.unregister(NAME)
    source_digest.cache_clear()


def _edit(path):
    """The plugin author changes the maths and re-runs without bumping `version`."""
    from modules.registry import source_digest

    path.write_text(path.read_text().replace("logits / self.config.temperature", "logits / (2 * self.config.temperature)"))
    source_digest.cache_clear()


def test_an_edited_plugin_re_run_over_the_same_seeds_counts_only_its_current_version(plugin, tmp_path, capsys):
    from modules.attention import attention_entry

    store = RecordStore(tmp_path / "runs")
    old = attention_entry(NAME).version
    for seed in range(3):
        store.write(record(make_spec("cora", "softmax", seed), {"test/acc": BASE[seed]}))
        store.write(record(make_spec("cora", NAME, seed), {"test/acc": BASE[seed] + 0.05}, finished="2026-01-02T10:00:00+00:00"))
    _edit(plugin)
    new = attention_entry(NAME).version
    assert new != old and new.startswith("1+source.")
    for seed in range(3):
        store.write(record(make_spec("cora", NAME, seed), {"test/acc": BASE[seed] - 0.01}, finished="2026-01-03T10:00:00+00:00"))

    assert main(["leaderboard", "--runs-dir", str(tmp_path / "runs")]) == 0
    md = (tmp_path / "runs" / "leaderboard.md").read_text()
    table = md.split("\n### cora", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| ") and f"`{NAME}`" in line)
    assert "| 3/3 |" in row  # not 6/6: the old code's seeds 0-2 are not seeds of the new code
    assert f"3 records of an earlier version of `{NAME}`, not counted" in md
    assert f"version `{old}`; the table counts version `{new}`" in md
    assert f"`{NAME}` {new}" in md  # the table's versions footnote
    rows = list(csv.DictReader((tmp_path / "runs" / "leaderboard.csv").open()))
    mine = [r for r in rows if r["variant"] == NAME]
    assert sorted((r["version"], r["status"]) for r in mine) == sorted([(old, "superseded")] * 3 + [(new, "ok")] * 3)

    capsys.readouterr()
    assert main(["describe", NAME, "--plugin", str(plugin)]) == 0
    assert f"version {new})" in capsys.readouterr().out


def test_a_built_in_s_records_before_its_version_bump_are_superseded_too(tmp_path):
    from harness.report.board import build_board
    from harness.report.records_plan import plan_from_records

    store = RecordStore(tmp_path / "runs")
    for seed in range(3):
        store.write(record(make_spec("cora", "softmax", seed), {"test/acc": BASE[seed]}, finished="2026-01-03T10:00:00+00:00"))
        spec = make_spec("cora", "entmax", seed)
        store.write(record(spec, {"test/acc": BASE[seed]}, finished="2026-01-03T10:00:00+00:00"))
        older = dataclasses.replace(spec, variant_version="0")  # what entmax's records said before its last bump
        store.write(record(older, {"test/acc": BASE[seed] + 0.2}, finished="2026-01-01T10:00:00+00:00"))
    the_plan, _ = plan_from_records(store, "leaderboard")
    loaded = store.load(s.key for s in the_plan.specs)
    board = build_board(the_plan.suite, the_plan, loaded.records)
    rows = {row["variant"]: row for row in board["groups"][0]["tasks"][0]["rows"]}
    assert rows["entmax"]["n"] == 3 and rows["entmax"]["metrics"]["test/acc"]["mean"] == pytest.approx(sum(BASE[:3]) / 3)
    assert board["superseded"] == [{"table": the_plan.specs[0].task, "of": "variant", "name": "entmax", "version": "0",
                                    "current": spec.variant_version, "records": 3}]
    assert board["planned"] == 6
