"""Reporting: a Plan and the records its runs left -> the leaderboards.

Enters: a `Plan` (harness.plan) and the `RecordStore` (harness.results).
Leaves: leaderboards/<suite>.md, .csv and .html (leaderboard.py writes them).

- board.py: the board model (per task and variant over every machine's records: ranks, cells; costs per
  hardware class; a reproducibility line for keys run more than once), from which the
  Markdown (markdown.py) and the HTML page (html_page.py) are rendered; csv_table.py flattens the records.
- stats.py: means, confidence intervals, the paired t-test p-values and Holm's correction.
- format.py: how a time and a p-value are shown, everywhere."""
