"""torch.compile over a transformers model with a variant: the Hugging Face door adds no graph break, so a model
compiles in one graph wherever the variant's own algorithm reads nothing on the host; the breaks left belong to
variants whose algorithm sizes or stops its work by what it reads (README, "Use a variant in your own model")."""

from __future__ import annotations

import pytest
import torch

from modules.hf import FAMILIES, use_attention

NEEDED = {"softmax": 0, "fenchel": 0, "sparsemax": "modules/attention/variants/entmax.py"}
"""Graph breaks per variant on a 1-layer BERT in training (the README gives every variant's count): none, or every break in the variant's own file (sparsemax
sizes its sort by the support it has seen, a host read). Before the door was cut to these, every variant broke
the graph 16-20 times (the trace's checkpointing query, the groups' locked cached properties, host shortcuts)."""


@pytest.mark.parametrize("variant", sorted(NEEDED))
def test_graph_breaks_are_only_those_the_variant_needs(variant):
    import transformers
    import torch._dynamo as dynamo

    config = FAMILIES["bert"].config()
    config.num_hidden_layers = 1
    model = use_attention(transformers.BertModel(config), variant).train()
    ids = torch.randint(3, 60, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    dynamo.reset()
    explained = dynamo.explain(model)(input_ids=ids, attention_mask=mask)
    expected = NEEDED[variant]
    if expected == 0:
        assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    else:
        assert explained.graph_break_count > 0 and explained.break_reasons
        places = {frame.filename for b in explained.break_reasons for frame in b.user_stack[-1:]}
        assert all(place.endswith(expected) for place in places), places
