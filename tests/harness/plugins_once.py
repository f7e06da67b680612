"""Test plugin: variants that go wrong on their first attempt only, to check what the next bench re-runs.

The first attempt of each leaves a marker file in $ATTNBENCH_TEST_MARKERS; a later attempt finds it and runs
as softmax."""

import os
import signal
from pathlib import Path

from modules.attention import AttentionKernel, AttentionResult, register_attention


def first_attempt(name: str) -> bool:
    marker = Path(os.environ["ATTNBENCH_TEST_MARKERS"]) / name
    if marker.exists():
        return False
    marker.touch()
    return True


@register_attention("test-dies-once")
class DiesOnceAttention(AttentionKernel):
    """Kills its own process (as the OOM killer would) on the first attempt."""

    def normalize(self, logits, groups, *, q=None, k=None):
        if first_attempt("dies"):
            os.kill(os.getpid(), signal.SIGKILL)
        return AttentionResult(groups.softmax(logits))


@register_attention("test-fails-once")
class FailsOnceAttention(AttentionKernel):
    """Raises on the first attempt: an ordinary failed run, kept unless --retry-failed."""

    def normalize(self, logits, groups, *, q=None, k=None):
        if first_attempt("fails"):
            raise RuntimeError("deliberate first-attempt failure")
        return AttentionResult(groups.softmax(logits))
