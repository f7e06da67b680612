"""`attnbench leaderboard --runs-dir DIR` without --suite: a board of whatever records DIR holds, one table
per task and parameter set, needing neither a suite nor the plugins the records name."""

import csv
import dataclasses

from harness.cli import main
from harness.plan.spec import make_spec
from harness.results.store import RecordStore

from .test_board import BASE, record, shifted


def _own_runs(tmp_path):
    """What a researcher's runs folder holds after a few `attnbench run`s: cora at the default budget (softmax and
    entmax at two α, 3 seeds each), cora at max_epochs=5 (softmax, 1 seed), and 3 seeds of a plugin variant
    whose file is not loaded now."""
    store = RecordStore(tmp_path / "runs")
    written = {}
    for seed in range(3):
        for attention, accuracy in (("softmax", BASE), ({"name": "entmax", "alpha": 1.2}, shifted([0.05] * 5)),
                                    ({"name": "entmax", "alpha": 1.8}, shifted([-0.05] * 5))):
            spec = make_spec("cora", attention, seed)
            written[(spec.display, spec.attention.get("alpha"), seed)] = store.write(record(spec, {"test/acc": accuracy[seed]}))
        softmax = make_spec("cora", "softmax", seed)
        plugin = dataclasses.replace(softmax, variant="my-attention", label="my-attention", variant_version="1",
                                     attention={"name": "my-attention", "temperature": 2.0})
        store.write(record(plugin, {"test/acc": BASE[seed] + 0.01}))
    short = make_spec("cora", "softmax", 0, {"max_epochs": 5})
    store.write(record(short, {"test/acc": 0.5}))
    return store, written


def _table_rows(markdown, heading):
    section = markdown.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    return {line.split("|")[2].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]}


def test_a_runs_folder_without_a_suite_renders_one_table_per_task_and_parameter_set(tmp_path, capsys):
    store, _ = _own_runs(tmp_path)
    assert main(["leaderboard", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr()
    md = (tmp_path / "runs" / "leaderboard.md").read_text()
    assert "- Records: 13 of 13 planned runs" in md
    full = _table_rows(md, "cora (max_epochs=1000)")
    assert set(full) == {"`softmax`", "`entmax (alpha=1.2)`", "`entmax (alpha=1.8)`", "`my-attention`"}
    assert full["`entmax (alpha=1.2)`"][0] == "1" and full["`entmax (alpha=1.8)`"][0] == "4"
    assert _table_rows(md, "cora (max_epochs=5)").keys() == {"`softmax`"}
    # the one-seed table is not ranked: the user is told why
    assert "table cora (max_epochs=5)" in out.err and "fewer than the 3 a rank needs" in out.err
    assert "table cora (max_epochs=1000)" not in out.err
    rows = list(csv.DictReader((tmp_path / "runs" / "leaderboard.csv").open()))
    keys = {row["key"] for row in rows if row["status"] == "ok"}
    assert keys == {path.stem for path in store.root.glob("*.json")}  # the records' own keys


def test_an_unreadable_record_is_counted_and_exits_1(tmp_path, capsys):
    _, written = _own_runs(tmp_path)
    victim = written[("softmax", None, 1)]
    victim.write_text(victim.read_text()[:50])
    assert main(["leaderboard", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "boards")]) == 1
    err = capsys.readouterr().err
    assert f"records/{victim.name}: JSONDecodeError" in err and "1 unreadable record(s)" in err
    md = (tmp_path / "boards" / "leaderboard.md").read_text()
    assert "- Records: 12 of 12 planned runs" in md and "unreadable 1" in md and victim.name in md


def test_an_empty_runs_folder_is_refused_naming_it(tmp_path, capsys):
    assert main(["leaderboard", "--runs-dir", str(tmp_path / "nothing")]) == 2
    assert f"{tmp_path / 'nothing' / 'records'} does not exist; no board written" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()
    (tmp_path / "empty" / "records").mkdir(parents=True)
    assert main(["leaderboard", "--runs-dir", str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty' / 'records'} holds no record" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "leaderboard.md").exists()


COMMITTED_SAMPLE = (
    "00fe5d934815ad30642a", "01257bf50a38dd032470", "012ecd3eca8ad7d5d735", "016969467c8bfba6db2d", "02149ba271c0c4be3ee0",
    "0268abf469dc528f104b", "026df3571d7f4f87ca3e", "028620b396f0207490f2", "02872bae7441ee6fc40f", "02c2e9b8b650bb1ad255",
    "02d236a6b027020b605f", "02e606e389ecaa23d584", "02ee4446cae93633a905", "03119375799c592d9ff3", "03495bb576d548f9a4d9",
    "03803db90d7a7025d5e2", "038251fc672f0f3b60a7", "0386cc39cfb7ddd8d80c", "03ce90b614153d3f3749", "03ef60ea2f18d3539734",
    "0455e8f7dbdaaf8c0409", "049a5d71dc595aa9dd97", "04b62468eaab98b841ff", "04dc1118afccdcec90e6", "054a86d55b7175127d2b",
    "0552bd383b7c81fbcdba", "0592811c4d04946d4028", "059a055e5405919ae1e8", "05a9acab893e60a9e55e", "05c7da0d38f6d8c42326",
    "05e299953d08162ec7c5", "0600c8383beafaa4e92a", "065a2e28f09f90f6bfcd", "0677c7f4d30153ddbfd1", "068c77b5f3865adb8840",
    "06e0171dc12852826973", "070eac39982a7971a7c3", "07f30bbbac19ccd6e478", "08281c0a9846008c2435", "085144f3276b890131c7",
)
"""40 committed records (the first 40 by name when the test was written; committed records are never removed, so
the sample stays the same while new ones are added): graph, text, domain-shift and vision-language tasks, five of
them under cora's version 1."""


def test_the_committed_records_render_without_a_suite(tmp_path):
    """Committed records of several tasks, variants and versions at once, as a smoke test of the grouping on
    real specs: it must not raise."""
    from pathlib import Path

    committed = Path(__file__).resolve().parents[2] / "leaderboards" / "records"
    sample = tmp_path / "runs" / "records"
    sample.mkdir(parents=True)
    for key in COMMITTED_SAMPLE:
        (sample / f"{key}.json").write_text((committed / f"{key}.json").read_text())
    assert main(["leaderboard", "--runs-dir", str(tmp_path / "runs")]) == 0
    md = (tmp_path / "runs" / "leaderboard.md").read_text()
    # 5 of these were recorded under cora's version 1: not counted, and said so
    assert "- Records: 35 of 35 planned runs" in md
    assert ("- 5 records of an earlier version of the task, not counted (table cora (max_epochs=300): version `1`; "
            "the table counts version `2`)") in md
