import textwrap

import pytest

from harness.plan.planner import plan
from harness.plan.suite import SuiteError, list_suites, load_suite


def write(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_builtin_suites_load_and_plan(shared_data):
    assert {"quick", "paper-gat"} <= set(list_suites())
    quick = plan(load_suite("quick"), str(shared_data))
    assert {s.task for s in quick.specs} == {"cora", "citeseer"}
    assert len({s.key for s in quick.specs}) == len(quick.specs) == 2 * len(load_suite("quick").variants) * 3
    assert all(s.params["max_epochs"] == 300 for s in quick.specs)


def test_optional_task_without_data_is_skipped_with_reason(shared_data):
    paper = plan(load_suite("paper-gat"), str(shared_data))
    assert "pubmed" in paper.skipped_tasks and "ind.pubmed" in paper.skipped_tasks["pubmed"]
    assert "Boards list pubmed as skipped until its files are there" in paper.skipped_tasks["pubmed"]
    assert {s.task for s in paper.specs} == {"cora", "citeseer"}
    seeds = {task: {s.seed for s in paper.specs if s.task == task} for task in ("cora", "citeseer")}
    assert seeds == {"cora": set(range(20)), "citeseer": set(range(36))}  # CiteSeer's own seeds: its wider spread


def test_paper_gat_trains_as_the_gat_paper_with_pubmeds_own_hyper_parameters():
    from modules.tasks import get_task

    suite = load_suite("paper-gat")
    assert suite.params == {"max_epochs": 100000, "patience": 100}
    pubmed = get_task("pubmed").params(suite.params)
    assert (pubmed.out_heads, pubmed.lr, pubmed.weight_decay, pubmed.max_epochs) == (8, 0.01, 0.001, 100000)
    cora = get_task("cora").params(suite.params)
    assert (cora.out_heads, cora.lr, cora.weight_decay, cora.heads, cora.hidden) == (1, 0.005, 5e-4, 8, 8)


def test_keys_depend_on_content_not_on_order(tmp_path):
    a = plan(load_suite(write(tmp_path, "tasks: [cora]\nvariants: [softmax]\nseeds: [0, 1]\n", "a.yaml")))
    b = plan(load_suite(write(tmp_path, "tasks: [cora]\nvariants: [softmax]\nseeds: [1, 0]\n", "b.yaml")))
    assert {s.key for s in a.specs} == {s.key for s in b.specs}
    c = plan(load_suite(write(tmp_path, "tasks: [cora]\nvariants: [softmax]\nseeds: [0]\nparams: {lr: 0.01}\n", "c.yaml")))
    assert c.specs[0].key not in {s.key for s in a.specs}


def test_a_task_with_its_own_seeds_plans_them_and_keeps_the_other_keys(tmp_path):
    """A noisier task gets more seeds; the runs both tasks share keep their keys (and so their records)."""
    common = plan(load_suite(write(tmp_path, "tasks: [cora, citeseer]\nvariants: [softmax]\nseeds: 2\n", "a.yaml")))
    suite = load_suite(write(tmp_path, "tasks: [cora, {name: citeseer, seeds: 4}]\nvariants: [softmax]\nseeds: 2\n", "b.yaml"))
    more = plan(suite)
    assert sorted((s.task, s.seed) for s in more.specs) == [("citeseer", 0), ("citeseer", 1), ("citeseer", 2), ("citeseer", 3),
                                                            ("cora", 0), ("cora", 1)]
    assert {s.key for s in common.specs} < {s.key for s in more.specs}
    assert suite.seed_counts() == "2 seeds (citeseer 4)" and suite.all_seeds() == (0, 1, 2, 3)


@pytest.mark.parametrize(
    "text, message",
    [
        ("tasks: [cora\n", "not valid YAML"),
        ("- just a list\n", "must be a mapping"),
        ("tasks: [cora]\nvariants: all\n", "missing 'seeds'"),
        ("tasks: [cora]\nvariants: all\nseeds: 0\n", "seeds must be a positive integer"),
        ("tasks: [cora]\nvariants: all\nseeds: 1\ncolour: red\n", "unknown key"),
        ("tasks: [coraa]\nvariants: all\nseeds: 1\n", "Did you mean 'cora'"),
        ("tasks: [cora]\nvariants: [softmaxx]\nseeds: 1\n", "Did you mean 'softmax'"),
        ("tasks: [cora]\nvariants: [{name: softmax, alpha: 2}]\nseeds: 1\n", "has no option"),
        ("tasks: [{name: cora, params: {learning_rate: 1}}]\nvariants: all\nseeds: 1\n", "has no parameter"),
        ("tasks: [cora]\nvariants: [softmax, softmax]\nseeds: 1\n", "more than once"),
        ("tasks: [cora]\nvariants: [{name: entmax, attention.alpha: 1.2, attention: {alpha: 1.3}}]\nseeds: 1\n", "given twice"),
        ("tasks: [cora]\nvariants: [{name: entmax, attention: 1.2}]\nseeds: 1\n", "must be a mapping of option"),
        ("tasks: [{name: cora, seeds: -2}]\nvariants: all\nseeds: 1\n", "tasks\\[0\\]: seeds must be a positive integer"),
    ],
)
def test_malformed_suites_name_the_problem(tmp_path, text, message):
    with pytest.raises(SuiteError, match=message) as info:
        load_suite(write(tmp_path, text))
    assert "s.yaml" in str(info.value)


def test_a_variant_option_is_spelled_in_a_suite_as_on_the_command_line(tmp_path):
    """`attention.alpha: 1.2` (as `--set` and `describe` spell it), a nested `attention:` block and the older
    flat `alpha: 1.2` are one configuration, with one key."""
    spellings = ["{name: entmax, attention.alpha: 1.2}", "{name: entmax, attention: {alpha: 1.2}}", "{name: entmax, alpha: 1.2}"]
    keys = []
    for i, entry in enumerate(spellings):
        suite = load_suite(write(tmp_path, f"tasks: [cora]\nvariants: [{entry}]\nseeds: [0]\n", f"v{i}.yaml"))
        assert suite.variants[0].config == {"alpha": 1.2}
        [spec] = plan(suite).specs
        assert spec.attention["alpha"] == 1.2
        keys.append(spec.key)
    assert len(set(keys)) == 1
    default = plan(load_suite(write(tmp_path, "tasks: [cora]\nvariants: [entmax]\nseeds: [0]\n", "d.yaml"))).specs[0]
    assert default.key != keys[0]


def test_unknown_suite_name_suggests():
    with pytest.raises(SuiteError, match="Did you mean 'quick'"):
        load_suite("quik")


def test_variant_filter_takes_comma_separated_globs():
    specs = plan(load_suite("quick"), variant_filter="softmax, bam-*").specs
    assert {s.variant for s in specs} == {"softmax", "bam-weibull", "bam-lognormal"}


def test_a_suites_own_params_decide_whether_its_data_is_there(shared_data, tmp_path, capsys):
    """vl-paper points coco-captions at a Karpathy split file and vqa at vqa2/: neither is here, and the
    bench must stop before any run instead of recording every run as failed."""
    from harness.cli import main

    code = main(["bench", "--suite", "vl-paper", "--data-root", str(shared_data), "--runs-dir", str(tmp_path / "runs"),
                 "--leaderboard-dir", str(tmp_path / "lb")])
    assert code == 2
    assert "dataset_coco.json" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "records").exists() or not any((tmp_path / "runs" / "records").iterdir())


def test_all_among_the_variants_adds_rows_to_every_registered_variant(tmp_path):
    """`all` as an item: every registered variant at its defaults (minus exclude_variants), plus labelled rows
    of a variant at other settings, each with its own keys; the default rows' keys are those of `variants: all`."""
    from modules.attention import list_attentions

    text = "tasks: [cora]\nvariants: [all, {name: align-ct, label: align-ct-l01, attention.weight: 0.01}]\nexclude_variants: [gmm]\nseeds: [0]\n"
    suite = load_suite(write(tmp_path, text, "mixed.yaml"))
    expected = [n for n in list_attentions() if n != "gmm"]
    assert [v.label or v.name for v in suite.variants] == [*expected, "align-ct-l01"]
    mixed = {s.display: s.key for s in plan(suite).specs}
    alone = {s.display: s.key for s in plan(load_suite(write(tmp_path, "tasks: [cora]\nvariants: all\nexclude_variants: [gmm]\nseeds: [0]\n", "all.yaml"))).specs}
    assert {label: key for label, key in mixed.items() if label != "align-ct-l01"} == alone
    assert mixed["align-ct-l01"] not in alone.values()
    assert {s.attention["weight"] for s in plan(suite).specs if s.display == "align-ct-l01"} == {0.01}
