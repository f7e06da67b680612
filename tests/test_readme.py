"""The README's promises: two set-up commands first, and its example plugin really works."""

import re
from pathlib import Path

import torch

from modules.attention import ATTENTIONS, DenseGroups, build_attention
from modules.registry import load_plugin_file

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_opens_with_the_two_setup_commands():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make bench", "make test"]


def test_readme_example_plugin_registers_and_reduces_to_softmax(tmp_path):
    code = re.search(r"```python\n# my_variant.py\n(.*?)```", README.read_text(), re.S).group(1)
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
