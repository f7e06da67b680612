"""The suite holds on any CPU (issue 50): no test compares floats against a stored fixture bit for bit or at
rtol=0, and no timed value decides a test, unless marked with the reason (tests/comparison_rules.py states both
rules and why)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.comparison_rules import EXACT_MARK, TIMING_MARK, scan_source, scan_tree

TESTS = Path(__file__).resolve().parent


def test_no_test_compares_stored_floats_exactly_or_decides_on_a_time():
    found = scan_tree(TESTS)
    assert not found, "\n".join(str(f) for f in found)


def scan(source: str) -> list[str]:
    return [f.rule.split(" (")[0] for f in scan_source(textwrap.dedent(source))]


BIT_FOR_BIT = "bit-for-bit comparison against loaded data"
EQUALS = "'==' on a loaded tensor or array"
TIMED = "a timed value decides this assert"


@pytest.mark.parametrize("source", [
    """
    def test_fixture():
        stored = torch.load("tests/fixtures/x.pt")
        torch.testing.assert_close(model(), stored["hidden"], atol=1e-6, rtol=0)
    """,
    """
    def test_fixture():
        reference = np.load(path)
        assert np.array_equal(compute(), reference)
    """,
    """
    def test_fixture():
        pair = torch.load(path)
        exponent = pair["exponent"].view(1, -1).double()
        assert torch.equal(solve(exponent), exponent)
    """,
    """
    def test_fixture():
        data = json.loads(path.read_text())
        np.testing.assert_allclose(compute(), data["values"], rtol=0, atol=1e-7)
    """,
    """
    STORED = torch.load(PATH)
    def test_fixture():
        def check(x):
            torch.testing.assert_close(x, STORED, rtol=0, atol=0)
        check(compute())
    """,
    """
    def test_fixture():
        for row in torch.load(path):
            torch.testing.assert_close(compute(row), row, rtol=0, atol=1e-6)
    """,
])
def test_a_planted_exact_comparison_against_a_loaded_fixture_is_flagged(source):
    assert scan(source) == [BIT_FOR_BIT]


def test_an_equality_on_a_loaded_tensor_is_flagged_and_one_on_text_is_not():
    assert scan("""
    def test_fixture():
        hidden = torch.load(path)["hidden"]
        assert (compute() == hidden).all()
    """) == [EQUALS]
    assert scan("""
    def test_golden_board():
        assert render().read_bytes() == expected.read_bytes()
    """) == []


def test_reverting_the_minilm_fix_is_flagged():
    """Issue 50's failing comparison, put back into the real test file: exactly one finding, on that line."""
    path = TESTS / "modules" / "test_hf_models.py"
    source = path.read_text()
    fixed = 'assert_close_to_stored(got, stored["hidden"], what=MINILM_FIXTURE)'
    assert fixed in source
    found = scan_source(source.replace(fixed, 'torch.testing.assert_close(got, stored["hidden"], atol=1e-6, rtol=0)'), str(path))
    assert [f.rule.split(" (")[0] for f in found] == [BIT_FOR_BIT]
    assert 'stored["hidden"]' in found[0].text


def test_a_marked_comparison_passes_only_with_a_reason():
    body = """
    def test_same_process():
        saved = torch.load(buffer)
        torch.testing.assert_close(model.state_dict()["w"], saved["w"], rtol=0, atol=0)  {mark}
    """
    assert scan(body.format(mark=f"{EXACT_MARK} saved by this process a line above")) == []
    assert scan(body.format(mark=EXACT_MARK)) == [BIT_FOR_BIT]  # a mark without its reason is no mark
    assert scan(body.format(mark="")) == [BIT_FOR_BIT]


def test_a_computed_value_is_not_a_loaded_one():
    """Data a test passes through its own code was computed on this machine: comparing two such results exactly
    (same code path, same process) is the bit-identity tests' business, not a stored-fixture comparison."""
    assert scan("""
    def test_same_path():
        inputs = torch.load(path)
        a, b = model(inputs), model(inputs.clone())
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.equal(a, b)
    """) == []


@pytest.mark.parametrize("source", [
    """
    def test_profile():
        calls, cpu_ms, _ = found["by_op"]["aten::addmm"]
        assert calls >= 2 and cpu_ms > 0
    """,
    """
    def test_fast():
        started = time.perf_counter()
        run()
        took = time.perf_counter() - started
        assert took < 5
    """,
    """
    def test_fast():
        started = time.perf_counter()
        run()
        assert time.perf_counter() - started < 30
    """,
    """
    def test_record():
        assert record["wall_time_s"] < 60
    """,
    """
    def test_epochs():
        assert ok.time_per_epoch_s * 5 == pytest.approx(ok.fit_time_s, rel=0.5)
    """,
])
def test_a_planted_timed_assert_is_flagged(source):
    assert scan(source) == [TIMED]


def test_counts_and_a_synthetic_records_own_times_are_not_timing():
    assert scan("""
    def test_profile():
        calls, cpu_ms, _ = found["by_op"]["aten::addmm"]
        assert calls >= 2
        assert record.wall_time_s == 1.5
        assert cost["time_per_epoch_s"] == pytest.approx(0.05)
    """) == []
    assert scan(f"""
    def test_present():
        assert record["wall_time_s"] > 0  {TIMING_MARK} the field is filled in; any positive size passes
    """) == []
