"""Small dense problems and their graph (segment) twins, shared by the attention tests."""

from __future__ import annotations

import pytest

from modules.attention.contract import Problem, make_problem  # noqa: F401 - the tests import them from here


@pytest.fixture
def problem() -> Problem:
    return make_problem()
