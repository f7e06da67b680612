"""A board is never lost by accident: a board with fewer finished records is not written over without
--force, a selection without runs is an error, and an unreadable record is named and counted apart."""


from harness.cli import main
from harness.plan.planner import plan
from harness.plan.suite import load_suite
from harness.results.store import RecordStore

from .test_board import BASE, record, shifted

SUITE = """\
name: safety
description: a small suite for the board-safety tests
tasks: [cora]
variants: [softmax, gmm]
seeds: 3
"""


def store_with_records(tmp_path, skip=()):
    suite_file = tmp_path / "safety.yaml"
    suite_file.write_text(SUITE)
    the_plan = plan(load_suite(str(suite_file)))
    store = RecordStore(tmp_path / "runs")
    accuracy = {"softmax": BASE, "gmm": shifted([0.01, 0.02, 0.015, 0.0, 0.0])}
    for spec in the_plan.specs:
        if (spec.display, spec.seed) not in skip:
            store.write(record(spec, {"test/acc": accuracy[spec.display][spec.seed]}))
    return str(suite_file), the_plan, store


def board_files(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_leaderboard_refuses_to_write_fewer_finished_records(tmp_path, capsys):
    suite, the_plan, _ = store_with_records(tmp_path)
    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    before = board_files(out)
    assert before["safety.md"].decode().count("ok 6") == 1
    capsys.readouterr()

    empty = tmp_path / "empty"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(empty), "--out", str(out), "--allow-empty"]) == 2
    err = capsys.readouterr().err
    assert "it has 6 finished records" in err and "give only 0 of 6" in err and "--force" in err and "--runs-dir leaderboards" in err
    assert board_files(out) == before

    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(empty), "--out", str(out), "--allow-empty", "--force"]) == 0
    assert "missing 6" in (out / "safety.md").read_text()


def test_more_or_equal_records_overwrite_without_force(tmp_path):
    suite, _, store = store_with_records(tmp_path, skip={("gmm", 2)})
    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert "ok 5" in (out / "safety.md").read_text()
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    _, _, _ = store_with_records(tmp_path)  # the sixth record arrives
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert "ok 6" in (out / "safety.md").read_text()


def test_skip_unrecorded_leaves_the_board_and_says_so(tmp_path, capsys):
    suite, _, _ = store_with_records(tmp_path)
    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    before = board_files(out)
    capsys.readouterr()
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "empty"), "--out", str(out), "--skip-unrecorded"]) == 0
    stdout = capsys.readouterr().out
    assert stdout.count("\n") == 1 and "no record of its runs" in stdout and "board left as it is" in stdout
    assert board_files(out) == before


def test_bench_with_a_selection_that_matches_nothing_is_an_error(tmp_path, capsys):
    suite, _, _ = store_with_records(tmp_path)
    out = tmp_path / "boards"
    code = main(["bench", "--suite", suite, "--variants", "nomatch*", "--runs-dir", str(tmp_path / "runs"), "--leaderboard-dir", str(out),
                 "--workers", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'nomatch*' matches none of its variants (softmax, gmm)" in err
    assert not out.exists()
    assert main(["bench", "--suite", suite, "--variants", "nomatch*", "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 2


def test_an_unreadable_record_is_named_and_counted_apart_from_missing(tmp_path, capsys):
    suite, the_plan, store = store_with_records(tmp_path)
    broken = next(s for s in the_plan.specs if s.display == "gmm" and s.seed == 1)
    text = store.path(broken.key).read_text()
    store.path(broken.key).write_text(text[: len(text) // 2])  # a disk that filled up mid-write
    out = tmp_path / "boards"
    # written, and exit 1 as `results export` does: a script must see that a record needs repair
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"records/{broken.key}.json: JSONDecodeError" in err and "1 unreadable record(s)" in err
    md = (out / "safety.md").read_text()
    assert "- Records: 5 of 6 planned runs (ok 5, failed 0, pruned 0, missing 0, unreadable 1)" in md
    assert f"Unreadable record (not counted as missing; repair the file or delete it and re-run): records/{broken.key}.json: JSONDecodeError" in md
    html = (out / "safety.html").read_text()
    assert "1 unreadable" in html and f"records/{broken.key}.json" in html
    rows = [line.split(",") for line in (out / "safety.csv").read_text().splitlines()]
    status = {row[0]: row[rows[0].index("status")] for row in rows[1:]}
    assert status[broken.key] == "unreadable" and list(status.values()).count("ok") == 5


def test_a_board_without_problems_has_no_problem_counts(tmp_path):
    suite, _, _ = store_with_records(tmp_path)
    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    md = (out / "safety.md").read_text()
    assert "(ok 6, failed 0, pruned 0, missing 0);" in md
    assert "unreadable" not in md and "onflict" not in md


def test_several_suites_in_one_call_each_written_or_refused_on_its_own(tmp_path, capsys):
    suite, _, _ = store_with_records(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text(SUITE.replace("name: safety", "name: other"))
    out = tmp_path / "boards"
    assert main(["leaderboard", "--suite", suite, str(other), "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["other.csv", "other.html", "other.md", "safety.csv", "safety.html", "safety.md"]
    kept = (out / "safety.md").read_bytes()
    (out / "other.csv").unlink()  # no board on disk for `other`: nothing to protect
    capsys.readouterr()
    assert main(["leaderboard", "--suite", suite, str(other), "--runs-dir", str(tmp_path / "empty"), "--out", str(out), "--allow-empty"]) == 2
    err = capsys.readouterr().err
    assert err.count("not overwriting") == 1 and "safety.csv" in err
    assert (out / "safety.md").read_bytes() == kept and "missing 6" in (out / "other.md").read_text()


def test_tuned_rows_sharing_the_default_runs_do_not_inflate_the_count_on_disk(tmp_path):
    import yaml

    from harness.report.leaderboard import finished_on_board, write_leaderboard

    from .test_leaderboard import synthetic

    params = tmp_path / "params" / "cora"
    params.mkdir(parents=True)
    # tuned parameters equal to the defaults: the tuned row's runs are the default row's runs (same keys)
    (params / "softmax.yaml").write_text(yaml.safe_dump({"task": "cora", "variant": "softmax", "attention": {"name": "softmax"}, "params": {}}))
    suite_path, found = synthetic(tmp_path, tuned_dir=params.parent)
    store = RecordStore(tmp_path / "runs")
    for r in found:
        store.write(r)
    out = tmp_path / "lb"
    write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=out, tuned_params_dir=params.parent)
    keys = [line.split(",")[0] for line in (out / "synthetic.csv").read_text().splitlines()[1:]]
    assert len(keys) > len(set(keys)), "the tuned softmax row lists the default row's keys again"
    assert finished_on_board(out / "synthetic.csv") == len({r["key"] for r in found}) == 39  # ok, failed and pruned, each key once
    before = (out / "synthetic.csv").read_bytes()
    write_leaderboard(suite_path, runs=str(tmp_path / "runs"), out_dir=out, tuned_params_dir=params.parent)  # same records: not refused
    assert (out / "synthetic.csv").read_bytes() == before


def test_a_store_without_a_record_of_the_suite_is_refused_naming_the_folder(tmp_path, capsys):
    suite, _, _ = store_with_records(tmp_path)
    out = tmp_path / "boards"
    empty = tmp_path / "empty"
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(empty), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # a folder that is not there says so (and is not created: a mistyped --runs-dir must not become an empty store)
    assert f"{empty / 'records'} does not exist, so it holds no record of suite" in err and "--allow-empty" in err
    assert not (empty / "records").exists()
    assert not out.exists()
    # --allow-empty: the board of missing runs, as before this refusal existed
    assert main(["leaderboard", "--suite", suite, "--runs-dir", str(empty), "--out", str(out), "--allow-empty"]) == 0
    assert "missing 6" in (out / "safety.md").read_text()
