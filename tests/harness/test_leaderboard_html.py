import copy
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scipy import stats

from harness.report.html_page import render_html

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = REPO / "tests" / "artifacts" / "leaderboard.png"
EVIL = "<script>alert(1)</script>-evil"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _metric(values, seeds, vs_baseline=None):
    n = len(values)
    mean = statistics.fmean(values) if values else None
    std = half = None
    if n >= 2:
        std = statistics.stdev(values)
        half = stats.t.ppf(0.975, n - 1) * std / n ** 0.5
    return {"values": values, "seeds": seeds, "n": n, "mean": mean, "std": std,
            "ci_low": None if half is None else mean - half, "ci_high": None if half is None else mean + half,
            "vs_baseline": vs_baseline}


def _versus(diff, p, p_holm, mark=None, n_pairs=3):
    return {"diff": diff, "n_pairs": n_pairs, "p": p, "p_holm": p_holm, "mark": mark}


def _row(variant, rank, metrics, *, n=3, planned=3, failed=0, missing=0, errors=(), time_per_epoch=0.05, parameters=1000):
    ok = n > 0
    return {
        "variant": variant, "rank": rank, "planned": planned, "n": n, "failed": failed, "pruned": 0, "missing": missing,
        "other_hardware": 0, "errors": list(errors), "metrics": metrics,
        "cost": {"epochs": 300.0 if ok else None, "time_per_epoch_s": time_per_epoch if ok else None,
                 "total_time_s": time_per_epoch * 300 if ok else None, "gpu_hours": None,
                 "peak_memory_mb": 900.0 + rank * 10 if ok else None, "parameters": parameters if ok else None},
    }


def synthetic_board() -> dict:
    """Two tasks, four variants: one significant mark, one failed run, one variant never run, a hostile label."""
    seeds = [0, 1, 2]
    cora_rows = [
        _row("sparsemax", 1, {"test/acc": _metric([0.84, 0.845, 0.85], seeds, _versus(0.02, 0.004, 0.008, "better")),
                              "test/macro_f1": _metric([0.82, 0.83, 0.83], seeds, _versus(0.01, 0.05, 0.1))},
             time_per_epoch=0.065, parameters=92382),
        _row("softmax", 2, {"test/acc": _metric([0.82, 0.825, 0.83], seeds), "test/macro_f1": _metric([0.81, 0.82, 0.82], seeds)},
             time_per_epoch=0.052, parameters=92373),
        _row(EVIL, 3, {"test/acc": _metric([0.80, 0.82], [0, 1], _versus(-0.015, 0.3, 0.3, n_pairs=2)),
                       "test/macro_f1": _metric([0.79, 0.80], [0, 1], _versus(-0.02, 0.2, 0.3, n_pairs=2))},
             n=2, failed=1, errors=["FloatingPointError: loss is nan at epoch 12"], time_per_epoch=0.248, parameters=92670),
        _row("bam-weibull (tuned)", None, {}, n=0, missing=3),
    ]
    loss_rows = [
        _row("softmax", 1, {"test/loss": _metric([0.51, 0.52, 0.50], seeds)}, time_per_epoch=0.9, parameters=5000),
        _row(EVIL, 2, {"test/loss": _metric([0.53, 0.55, 0.52], seeds, _versus(0.023, 0.12, 0.24))}, time_per_epoch=1.4, parameters=5100),
        _row("sparsemax", 3, {"test/loss": _metric([0.61], [0], None)}, n=1, missing=2, time_per_epoch=12.5, parameters=5200),
    ]
    task_common = {"commits": ["05c94003198f"], "finished_range": ["2026-11-20", "2026-11-22"], "baseline": "softmax"}
    return {
        "suite": "html-test",
        "description": "A synthetic board: <b>not</b> from real records.",
        "seeds": seeds,
        "planned": 21,
        "recorded": 16,
        "status_counts": {"ok": 15, "failed": 1, "pruned": 0, "missing": 5},
        "commits": ["05c94003198f", "a75344ab808d"],
        "finished_range": ["2026-11-20", "2026-11-22"],
        "skipped_tasks": {"pubmed": "no data at ../shared/data/planetoid/PubMed"},
        "alpha": 0.05,
        "test": "paired t-test over seeds, Holm-corrected across the variants of a task",
        "groups": [{
            "hardware": "CPU AMD EPYC (1 thread/run)", "accelerator": "cpu", "device": "AMD EPYC", "device_count": 0,
            "torch": ["2.14.1+cpu"], "commits": ["05c94003198f", "a75344ab808d"], "finished_range": ["2026-11-20", "2026-11-22"],
            "tasks": [
                {"task": "cora", "primary": "test/acc", "higher_is_better": True,
                 "metrics": [{"name": "test/acc", "higher_is_better": True, "percent": True},
                             {"name": "test/macro_f1", "higher_is_better": True, "percent": True}],
                 **task_common, "rows": cora_rows,
                 "tuning": {"bam-weibull (tuned)": {"trials": {"complete": 7, "pruned": 13}, "seconds": 1380.0}}},
                {"task": "toy-regression", "primary": "test/loss", "higher_is_better": False,
                 "metrics": [{"name": "test/loss", "higher_is_better": False, "percent": False}],
                 **task_common, "rows": loss_rows, "tuning": {}},
            ],
            "overall": [
                {"variant": "softmax", "mean_rank": 1.5, "tasks_covered": 2, "tasks_total": 2, "better": 0, "worse": 0},
                {"variant": "sparsemax", "mean_rank": 2.0, "tasks_covered": 2, "tasks_total": 2, "better": 1, "worse": 0},
                {"variant": EVIL, "mean_rank": 2.5, "tasks_covered": 2, "tasks_total": 2, "better": 0, "worse": 0},
                {"variant": "bam-weibull (tuned)", "mean_rank": None, "tasks_covered": 0, "tasks_total": 2, "better": 0, "worse": 0},
            ],
        }],
    }


@pytest.fixture(scope="module")
def board() -> dict:
    return synthetic_board()


@pytest.fixture(scope="module")
def page(board, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("leaderboard") / "html-test.html"
    path.write_text(render_html(board), encoding="utf-8")
    return path


def test_same_board_gives_identical_bytes_even_in_another_process(board, page, tmp_path):
    board_json = tmp_path / "board.json"
    board_json.write_text(json.dumps(board))
    assert render_html(json.loads(board_json.read_text())) == page.read_text(encoding="utf-8")
    # A fresh interpreter with another hash seed: catches per-process salts (matplotlib's SVG ids, set order).
    other = tmp_path / "other.html"
    code = ("import json, sys; from harness.report.html_page import render_html; "
            "open(sys.argv[2], 'w', encoding='utf-8').write(render_html(json.load(open(sys.argv[1]))))")
    subprocess.run([sys.executable, "-c", code, str(board_json), str(other)], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"})
    assert other.read_bytes() == page.read_bytes()


def test_rendering_does_not_change_the_board(board):
    before = copy.deepcopy(board)
    render_html(board)
    assert board == before


def test_page_references_nothing_outside_itself(page):
    text = page.read_text(encoding="utf-8")
    references = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", text, flags=re.I)
    assert references, "the inline SVG plots should reference their own markers"
    assert all(ref.startswith("#") for ref in references), [r for r in references if not r.startswith("#")]
    assert "//cdn" not in text and "@import" not in text and "url(http" not in text
    # The only absolute URLs left are XML namespace names, which browsers never fetch.
    for match in re.finditer(r"https?://", text):
        assert re.search(r'xmlns(?::\w+)?="$', text[max(0, match.start() - 20):match.start()]), text[match.start() - 40:match.end() + 40]


def test_text_is_escaped_everywhere(page):
    text = page.read_text(encoding="utf-8")
    assert EVIL not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;-evil" in text
    assert text.count("<script") == 1  # the page's own sorting script
    assert "<b>not</b>" not in text and "&lt;b&gt;not&lt;/b&gt;" in text


def test_page_shows_the_header_marks_failures_and_missing_rows(page):
    text = page.read_text(encoding="utf-8")
    assert "16 of 21 planned runs (15 ok, 1 failed, 0 pruned, 5 missing)" in text
    assert "generated by attnbench leaderboard, do not edit" in text
    assert "paired t-test over seeds vs softmax, Holm-corrected" in text.split('<details class="legend"')[1]  # the legend, after the tables
    assert "<code>pubmed</code> skipped" in text
    assert "CPU AMD EPYC (1 thread/run) <small>(torch 2.14.1+cpu)</small>" in text
    assert text.count("<table") == 3  # overall + one per task
    marks = re.findall(r'<span class="mark (\w+)" title="([^"]*)">', text)
    assert marks == [("better", "better than softmax: Holm p = 0.008")]
    assert "FloatingPointError: loss is nan at epoch 12" in text
    assert "84.5 ± 0.5 <span" in text  # sparsemax's acc in %
    assert "2/3" in text and "0/3" in text
    assert "12.5 s" in text and "0.0650 s" in text
    assert text.count('<svg class="plot"') == 4
    assert len(set(re.findall(r'\bid="([^"]+)"', text))) == len(re.findall(r'\bid="([^"]+)"', text)), "duplicate ids"


def _column(table, index: int) -> list[str]:
    return [cell.strip() for cell in table.locator(f"tbody tr td:nth-child({index})").all_inner_texts()]


def test_page_in_headless_chromium(board, page):
    if not CHROMIUM.exists():
        pytest.skip(f"Debian Chromium not found at {CHROMIUM}: run `make browser` (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed: pip install -e '.[dev]'")
    started = time.perf_counter()
    errors, requests, dialogs = [], [], []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            tab.on("console", lambda message: message.type == "error" and errors.append(f"console: {message.text}"))
            tab.on("pageerror", lambda error: errors.append(f"page: {error}"))
            tab.on("request", lambda request: requests.append(request.url))
            tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            tab.goto(page.as_uri(), wait_until="load")

            assert tab.locator("table").count() == 3
            assert tab.locator("table.task").count() == 2
            cora = tab.locator("table.task").first
            assert _column(cora, 2) == [row["variant"] for row in board["groups"][0]["tasks"][0]["rows"]]
            assert _column(cora, 1) == ["1", "2", "3", "—"]

            params = cora.locator("thead th", has_text="params")
            params.click()
            assert _column(cora, 2) == ["softmax", "sparsemax", EVIL, "bam-weibull (tuned)"]  # 92,373 < 92,382 < 92,670, none last
            params.click()
            assert _column(cora, 2) == [EVIL, "sparsemax", "softmax", "bam-weibull (tuned)"]  # reversed, none still last
            assert params.get_attribute("aria-sort") == "descending"

            plot = tab.locator("svg.plot").first
            plot.scroll_into_view_if_needed()
            assert plot.is_visible()
            box = plot.bounding_box()
            assert box and box["width"] > 100 and box["height"] > 50
            assert tab.locator("svg.plot").count() == 4

            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert dialogs == []  # the hostile label did not run
    assert requests == [page.as_uri()]
    print(f"chromium check: {time.perf_counter() - started:.2f} s")


# ---- axes that fit what the tables can resolve (issue 39) ----------------------------------------------------


def _figures(text: str) -> list[dict]:
    """Each plot with a value axis: its stated limits and the limits read back from its SVG (tick labels and their
    positions give the scale; the axes' background patch gives the ends)."""
    found = []
    for match in re.finditer(r'<figure data-metric="([^"]+)" data-value-axis="(x|y)" data-value-min="([^"]+)" '
                             r'data-value-max="([^"]+)">(.*?)</figure>', text, flags=re.S):
        metric, axis, low, high, svg = match.groups()
        ticks = []
        for tick in re.finditer(rf'id="plot\d+-{axis}tick_\d+">(.*?)</text>', svg, flags=re.S):
            position = float(re.search(rf'\b{axis}="([-\d.]+)"', tick.group(1)).group(1))
            ticks.append((float(tick.group(1).rsplit(">", 1)[1].replace("−", "-")), position))
        (v0, p0), (v1, p1) = ticks[0], ticks[-1]
        patch = re.search(r'id="plot\d+-patch_2">\s*<path d="([^"]+)"', svg).group(1)
        coordinates = [float(n) for n in re.findall(r"[-\d.]+", patch)]
        ends = sorted(coordinates[0 if axis == "x" else 1::2])
        to_value = lambda pixel: v0 + (pixel - p0) * (v1 - v0) / (p1 - p0)
        drawn = sorted([to_value(ends[0]), to_value(ends[-1])])
        found.append({"metric": metric, "axis": axis, "low": float(low), "high": float(high), "drawn": drawn,
                      "ticks": [value for value, _ in ticks]})
    return found


def _two_seed_board(tmp_path, accuracies):
    from tests.harness.test_board import records_for, suite_and_plan
    from harness.report.board import build_board

    suite, the_plan = suite_and_plan(tmp_path, list(accuracies), seeds=len(next(iter(accuracies.values()))))
    padded = {name: values + [None] * (5 - len(values)) for name, values in accuracies.items()}
    return build_board(suite, the_plan, records_for(the_plan, padded))


def test_a_two_seed_board_has_no_interval_outside_the_metric_and_its_axes_fit_them(tmp_path):
    """Two seeds of an accuracy gave [-131.5, 200.2] and a bar axis from -150 to 200."""
    board = _two_seed_board(tmp_path, {"softmax": [0.213, 0.475], "gmm": [0.30, 0.31], "fenchel": [0.33, 0.36]})
    (cora,) = board["groups"][0]["tasks"]
    intervals = [(r["metrics"]["test/acc"]["ci_low"] * 100, r["metrics"]["test/acc"]["ci_high"] * 100) for r in cora["rows"]]
    assert all(0.0 <= low <= high <= 100.0 for low, high in intervals)
    text = render_html(board)
    assert "[0.0, 100.0]<span title=\"clipped to the values test/acc can take\">†</span>" in text
    assert '<p class="clipped">†: this 95% Student-t interval' in text
    figures = _figures(text)
    assert [f["axis"] for f in figures] == ["x", "y"]
    for figure in figures:
        assert 0.0 <= figure["low"] and figure["high"] <= 100.0, figure
        assert figure["drawn"] == pytest.approx([figure["low"], figure["high"]], abs=1e-3)  # the SVG draws what the page states
        assert all(figure["low"] - 1e-9 <= tick <= figure["high"] + 1e-9 for tick in figure["ticks"])
    bar = figures[0]
    assert all(bar["low"] <= low and high <= bar["high"] for low, high in intervals)


def test_a_gap_below_the_resolution_never_fills_the_plot(tmp_path):
    """A scatter's y-axis ran 34.30-34.35: a 0.05-point gap blown up to full height."""
    from tests.harness.test_board import BASE, records_for, shifted, suite_and_plan
    from harness.report.board import build_board

    suite, the_plan = suite_and_plan(tmp_path, ["softmax", "gmm"])
    board = build_board(suite, the_plan, records_for(the_plan, {"softmax": BASE, "gmm": shifted([0.0105, -0.0095, 0.0005, -0.0095, 0.0105])}))
    (cora,) = board["groups"][0]["tasks"]
    means = [r["metrics"]["test/acc"]["mean"] * 100 for r in cora["rows"]]
    assert abs(means[0] - means[1]) == pytest.approx(0.05)
    resolution = cora["resolution"]["difference"] * 100
    assert resolution > 0.05
    for figure in _figures(render_html(board)):
        assert figure["high"] - figure["low"] >= 2 * resolution
        assert figure["drawn"][1] - figure["drawn"][0] >= 2 * resolution - 1e-6


def test_a_table_without_a_resolution_still_gets_a_fixed_least_span(tmp_path):
    board = _two_seed_board(tmp_path, {"softmax": [0.3430, 0.3430], "gmm": [0.3435, 0.3435]})  # no spread, no resolution
    assert (board["groups"][0]["tasks"][0]["resolution"] or {}).get("difference") is None
    for figure in _figures(render_html(board)):
        assert figure["high"] - figure["low"] >= 1.0


# ---- the claims page -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claims_pages(tmp_path_factory):
    from tests.conftest import SHARED_DATA
    from tests.fixtures.render_boards import render_claims

    root = Path(os.environ.get("ATTNBENCH_DATA") or SHARED_DATA)
    if not (root / "planetoid").is_dir():
        pytest.skip(f"no local data at {root}: the claims fixture plans paper-gat")
    out = tmp_path_factory.mktemp("claims")
    render_claims(out, out / "runs", root)
    return (out / "claims.md").read_text(encoding="utf-8"), out / "claims.html"


def test_the_claims_page_opens_with_the_markdowns_summary_and_folds_the_claims_not_run_here(claims_pages):
    markdown, page = claims_pages
    text = page.read_text(encoding="utf-8")
    counts = re.search(r"Verdicts: [^.\n]*\.", markdown).group(0)
    finding, summary = re.findall(r'<p class="finding summary">(.*?)</p>', text)[:2]
    assert finding.startswith("<strong>Finding.</strong> Of the ")  # the page opens with its finding (issue 51)
    assert re.sub(r"</?strong>", "", summary).endswith(counts)
    body = text.split("<body>", 1)[1]
    assert body.index('class="finding summary"') < body.index("<section")
    # every "not run here" row is inside a <details> of its paper, every other row outside
    for section in re.findall(r"<section.*?</section>", body, flags=re.S):
        folded = "".join(re.findall(r"<details.*?</details>", section, flags=re.S))
        shown = re.sub(r"<details.*?</details>", "", section, flags=re.S)
        assert 'class="verdict-not-run-here"' not in shown
        assert folded.count("<tr><td") == folded.count('class="verdict-not-run-here"')
    assert text.count('class="verdict-not-run-here"') == markdown.count("not run here (why") > 0


def test_the_claims_verdict_column_is_visible_at_1400_px(claims_pages):
    if not CHROMIUM.exists():
        pytest.skip(f"Debian Chromium not found at {CHROMIUM}: run `make browser` (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed: pip install -e '.[dev]'")
    _, page = claims_pages
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 900})
            tab.goto(page.as_uri(), wait_until="load")
            headers = tab.locator("table.claims thead th", has_text="verdict")
            visible = [headers.nth(i) for i in range(headers.count()) if headers.nth(i).is_visible()]
            assert visible, "no measured claims table is shown"
            for header in visible:
                box = header.bounding_box()
                assert box["x"] + box["width"] <= 1400, box
            assert tab.locator("details.not-run").count() >= 1
            assert not tab.locator("details.not-run table").first.is_visible()  # folded until opened
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(SCREENSHOT.with_name("claims.png")))
        finally:
            browser.close()
