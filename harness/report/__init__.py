"""Reporting: a Plan and the records its runs left -> the leaderboards, the claims page and the dose-response page.

Enters: a `Plan` (harness.plan) and the `RecordStore` (harness.results).
Leaves: leaderboards/<suite>.md, .csv and .html (leaderboard.py writes them); claims.md, claims.html and
dose-response.md (`leaderboard --claims`).

- board.py: the board model (per task and variant over every machine's records: ranks, cells, each row's
  Comparison with softmax in its table's Holm family; costs per hardware class; a reproducibility line for keys run
  more than once; the per-run CSV rows), from which the Markdown (markdown.py), the HTML page (html_page.py) and
  the CSV (csv_table.render_csv) are rendered.
- loading.py: plans, records and evidence records (evidence.py: what a run's mechanism is read from) loaded in one
  place for the claims and dose-response pages.
- claims_schema.py (the claims file, typed), claims.py (measuring), verdicts.py (the verdict rules, pure),
  mechanism_test.py (the declared paired test and its null), claims_model.py (ClaimRow, ClaimsBoard) and
  claims_page.py (the page's text); dose_response.py (the λ dose-response page, model and text).
- stats.py: means, confidence intervals, the paired t-test and exact Wilcoxon p-values and Holm's correction.
- format.py: how a time and a p-value are shown, everywhere."""
