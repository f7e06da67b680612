import sys
import textwrap

import pytest

from modules.attention import ATTENTIONS, AttentionKernel, build_attention, list_attentions, register_attention
from modules.registry import DuplicateNameError, PluginError, UnknownNameError, load_plugin_file
from modules.tasks import get_task


def test_unknown_variant_suggests_closest_name():
    with pytest.raises(UnknownNameError, match="Did you mean 'softmax'"):
        build_attention("sofmax", num_heads=1, head_dim=4)


def test_unknown_task_suggests_closest_name():
    with pytest.raises(UnknownNameError, match="Did you mean 'citeseer'"):
        get_task("citeser")


def test_duplicate_names_are_rejected():
    with pytest.raises(DuplicateNameError, match="already registered"):
        register_attention("softmax")(type("Other", (AttentionKernel,), {}))


def test_unknown_config_option_is_named():
    with pytest.raises(ValueError, match="has no option"):
        build_attention({"name": "softmax", "alpha": 2.0}, num_heads=1, head_dim=4)


def test_plugin_file_registers_a_variant(tmp_path):
    plugin = tmp_path / "my_variant.py"
    plugin.write_text(textwrap.dedent('''
        from modules.attention import AttentionKernel, AttentionResult, register_attention

        @register_attention("test-plugin-file")
        class Tempered(AttentionKernel):
            """Softmax at half temperature."""
            def normalize(self, logits, groups, *, q=None, k=None):
                return AttentionResult(groups.softmax(2 * logits))
    '''))
    try:
        load_plugin_file(plugin)
        load_plugin_file(plugin)  # a second load is a no-op, not a duplicate registration
        assert "test-plugin-file" in list_attentions()
        kernel = build_attention("test-plugin-file", num_heads=2, head_dim=4)
        assert kernel.name == "test-plugin-file"
    finally:
        ATTENTIONS.unregister("test-plugin-file")


def test_broken_plugin_file_is_reported(tmp_path):
    plugin = tmp_path / "broken.py"
    plugin.write_text("import not_a_real_module_anywhere\n")
    with pytest.raises(PluginError, match="failed to import"):
        load_plugin_file(plugin)
    with pytest.raises(PluginError, match="does not exist"):
        load_plugin_file(tmp_path / "absent.py")


def test_entry_point_plugins_are_loaded_lazily(tmp_path, monkeypatch):
    """A real installed distribution (a .dist-info on sys.path) advertising the entry-point group."""
    (tmp_path / "ep_variant_pkg.py").write_text(textwrap.dedent('''
        from modules.attention import AttentionKernel, AttentionResult, register_attention

        @register_attention("test-entry-point")
        class FromEntryPoint(AttentionKernel):
            def normalize(self, logits, groups, *, q=None, k=None):
                return AttentionResult(groups.softmax(logits))
    '''))
    dist = tmp_path / "ep_variant_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-variant-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[attnbench.attention]\ntempered = ep_variant_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ATTENTIONS, "_entry_points_loaded", False)
    try:
        assert "test-entry-point" in list_attentions()
        build_attention("test-entry-point", num_heads=1, head_dim=2)
    finally:
        ATTENTIONS.unregister("test-entry-point")
        sys.modules.pop("ep_variant_pkg", None)


def test_a_name_fixes_its_preset_values():
    with pytest.raises(ValueError, match="fixes"):
        build_attention({"name": "sparsemax", "alpha": 1.3}, num_heads=1, head_dim=4)
    assert build_attention("sparsemax", num_heads=1, head_dim=4).config.alpha == 2.0
