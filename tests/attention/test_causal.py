"""Every registered variant under causal groups (a decoder's self-attention, modules/hf.py's Llama host): the
weights are distributions over the past only, and a query's output does not move when a future token does
(modules/attention/contract.py `check_causal_mask`, which `attnbench check` runs on a plugin too).

Parametrised over the registry, as test_contract.py is: a new variant is covered without editing this file."""

import pytest

from modules.attention import list_attentions
from modules.attention import contract


@pytest.mark.parametrize("name", list_attentions())
def test_causal_weights_and_outputs_ignore_the_future(name):
    contract.check_causal_mask(name)
