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


def test_an_edited_plugin_runs_again_instead_of_answering_with_its_old_records(tmp_path, shared_data, capsys):
    """The README's plugin loop: run, edit the maths, run again. The edit (without a `version` bump) gives new
    keys, so the second run trains; a comment or docstring edit changes no result and keeps the key."""
    from harness.cli import main
    from modules import registry

    plugin = tmp_path / "my_variant.py"
    source = textwrap.dedent('''
        from modules.attention import AttentionKernel, AttentionResult, register_attention

        @register_attention("test-edited-plugin")
        class Tempered(AttentionKernel):
            """Softmax at another temperature."""
            def normalize(self, logits, groups, *, q=None, k=None):
                return AttentionResult(groups.softmax(2 * logits))
    ''')
    argv = ["run", "cora", "test-edited-plugin", "--plugin", str(plugin), "--set", "max_epochs=1",
            "--runs-dir", str(tmp_path / "runs"), "--data-root", str(shared_data)]

    def run_in_a_new_process(text):  # as a new `attnbench` process would see the file
        ATTENTIONS.unregister("test-edited-plugin")
        registry._loaded_plugin_files.discard(plugin.resolve())
        plugin.write_text(text)
        assert main(argv) == 0
        return capsys.readouterr().out

    try:
        assert "attnbench: running" in run_in_a_new_process(source)
        assert "already finished" in run_in_a_new_process(source)
        edited = source.replace("2 * logits", "3 * logits")
        out = run_in_a_new_process(edited)
        assert "attnbench: running" in out and "already finished" not in out
        assert len(list((tmp_path / "runs" / "records").glob("*.json"))) == 2
        cosmetic = edited.replace('"""Softmax at another temperature."""', '"""Softmax at 1/3."""  # a comment')
        assert "already finished" in run_in_a_new_process(cosmetic)
    finally:
        ATTENTIONS.unregister("test-edited-plugin")
        registry._loaded_plugin_files.discard(plugin.resolve())


def test_built_in_variants_and_tasks_key_by_their_explicit_version():
    from harness.plan.spec import make_spec
    from modules.attention import attention_entry

    spec = make_spec("cora", "bam-weibull", 0)
    assert spec.variant_version == str(attention_entry("bam-weibull").cls.version)
    assert spec.task_version == get_task("cora").version
