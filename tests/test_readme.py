"""The README is the guide a newcomer reads first: at most 350 lines, opening with the two set-up commands, its
sections in the order of issue 57 (set-up, what it measures, the daily loop, reading a board, GPU and SLURM, your own
Hugging Face model, testing, where everything else is), each pointing at the page in docs/ that says the rest. The
plugin example of the adding-a-variant guide really works. (Every command and link of the README and docs/ is
checked by tests/test_docs_commands.py.)"""

import re
from pathlib import Path

import torch

from modules.attention import ATTENTIONS, DenseGroups, build_attention
from modules.registry import load_plugin_file

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDE = REPO / "docs" / "guides" / "adding-a-variant.md"


def test_readme_opens_with_the_two_setup_commands():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert text.index(first_block.group(0)) < text.index("\n## ")  # the first thing under the title
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands == ["make bench", "make test"]


def test_readme_is_a_short_guide_in_the_issue_s_order():
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings == ["What it measures", "The daily loop", "Reading a board", "On a GPU node, and on a SLURM cluster",
                        "A variant in your own Hugging Face model", "Testing", "Where everything else is"]


def test_readme_answers_a_newcomer_s_questions():
    """Run a suite, add a plugin, tune, read the claims page, run on SLURM: each from the README alone, with the
    page that says more."""
    text = README.read_text()
    for needle in ("attnbench bench --suite", "--plugin my_variant.py", "attnbench tune", "leaderboards/claims.md",
                   "--launcher slurm", "docs/guides/reading-boards.md", "docs/guides/scaling.md", "docs/guides/tuning.md",
                   "docs/guides/adding-a-variant.md", "docs/guides/hugging-face.md", "docs/reference/commands.md"):
        assert needle in text, needle


def test_every_variant_has_its_line_in_the_readme():
    from modules.attention import list_attentions

    table = README.read_text().split("## What it measures", 1)[1].split("## The daily loop", 1)[0]
    for name in list_attentions():
        assert f"`{name}`" in table, name


def test_the_example_plugin_registers_and_reduces_to_softmax(tmp_path):
    code = re.search(r"```python\n# my_variant.py\n(.*?)```", GUIDE.read_text(), re.S).group(1)
    assert code == re.search(r"```python\n# my_variant.py\n(.*?)```", README.read_text(), re.S).group(1)  # one example, two pages
    plugin = tmp_path / "readme_variant.py"
    plugin.write_text(code)
    try:
        load_plugin_file(plugin)
        kernel = build_attention({"name": "tempered", "temperature": 1.0}, num_heads=2, head_dim=4)
        logits = torch.randn(1, 2, 3, 3)
        groups = DenseGroups(None)
        torch.testing.assert_close(kernel.normalize(logits, groups).weights, logits.softmax(-1))
    finally:
        ATTENTIONS.unregister("tempered")
