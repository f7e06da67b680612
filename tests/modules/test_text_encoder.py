"""The BERT hosts: the pretrained MiniLM keeps its outputs with softmax swapped in, keeps its weights with any
variant, and every registered variant trains, honours padding and reports from every layer."""

import pytest
import torch

from modules.attention import list_attentions
from modules.hosts.text_encoder import encode, kernels_of, load_minilm, mean_pool, minilm_tokenizer, small_bert
from modules.lit.sequence_classification import SequenceClassificationModule, SequenceClassifier

SENTENCES = (
    ["The cat sat on the mat.", "A considerably longer premise that forces the other rows of the batch to be padded."],
    ["A cat is sitting.", "Short hypothesis."],
)


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


@pytest.fixture(scope="module")
def batch(tokenizer):
    return tokenizer(*SENTENCES, padding=True, return_tensors="pt")


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_minilm_with_softmax_kernel_matches_the_original(batch, implementation):
    original = load_minilm().eval()
    original.set_attn_implementation(implementation)
    swapped = load_minilm("softmax").eval()
    with torch.no_grad():
        expected = original(**batch).last_hidden_state
        got, trace = encode(swapped, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    real = batch["attention_mask"].bool()
    assert (batch["attention_mask"] == 0).any()  # the padding path is exercised
    assert torch.allclose(got[real], expected[real], atol=1e-5, rtol=0)
    assert [kernel for kernel, _ in trace] == kernels_of(swapped)  # one (kernel, result) per layer, in order


def test_minilm_keeps_pretrained_weights_under_any_variant():
    reference = load_minilm().state_dict()
    # The contextual prior, so that the variant brings parameters of its own (on text BAM defaults to the
    # authors' GLUE setting, a fixed prior without any).
    converted = load_minilm({"name": "bam-weibull", "prior": "contextual"})
    state = converted.state_dict()
    for name, value in reference.items():
        assert torch.equal(state[name], value), name
    extra = sorted(set(state) - set(reference))
    assert extra and all(".attnbench_kernel." in name for name in extra)  # only the variant's own parameters are new


def _tiny(variant, tokenizer):
    torch.manual_seed(0)
    return small_bert(variant, vocab_size=tokenizer.vocab_size, depth=2, width=32, heads=4, max_length=64, dropout=0.0)


@pytest.mark.parametrize("variant", list_attentions())
def test_every_variant_trains_in_the_encoder_and_reports_per_layer(variant, tokenizer, batch):
    bert = _tiny(variant, tokenizer).train()
    hidden, trace = encode(bert, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert [kernel for kernel, _ in trace] == kernels_of(bert) and torch.isfinite(hidden).all()
    results = [result for _, result in trace]
    names = [sorted(r.aux_losses) for r in results]
    assert names[0] == names[1]  # every layer reports the same aux terms
    loss = mean_pool(hidden, batch["attention_mask"]).square().sum() + sum(v for r in results for v in r.aux_losses.values())
    loss.backward()
    grads = [p.grad for p in bert.encoder.layer[0].attention.self.query.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("variant", list_attentions())
def test_padding_does_not_change_a_sentence_encoding(variant, tokenizer):
    bert = _tiny(variant, tokenizer).eval()
    alone = tokenizer(["The cat sat on the mat."], return_tensors="pt")
    padded = tokenizer(["The cat sat on the mat.", "A much longer sentence so that the first one is padded here."], padding=True, return_tensors="pt")
    with torch.no_grad():
        h1, _ = encode(bert, alone["input_ids"], alone["attention_mask"], alone["token_type_ids"])
        h2, _ = encode(bert, padded["input_ids"], padded["attention_mask"], padded["token_type_ids"])
    n = alone["input_ids"].shape[1]
    assert torch.allclose(h1[0], h2[0, :n], atol=1e-5), (h1[0] - h2[0, :n]).abs().max()


def _module(variant, tokenizer, mc_samples):
    model = SequenceClassifier(_tiny(variant, tokenizer), 2, dropout=0.0)
    return SequenceClassificationModule(model, num_labels=2, metric_names=["acc"], test_names=["dev"], lr=1e-3,
                                        weight_decay=0.0, warmup_ratio=0.0, mc_samples=mc_samples).eval()


def test_mc_samples_average_sampled_predictions_for_stochastic_variants(tokenizer, batch):
    labelled = {**batch, "labels": torch.tensor([0, 1])}
    # sigma = 1 (the GAT setting): the GLUE setting's sigma = 1e-4 moves a prediction by less than round-off.
    noisy = {"name": "bam-lognormal", "sigma": 1.0}
    deterministic = _module(noisy, tokenizer, 1)
    sampled = _module(noisy, tokenizer, 8)
    sampled.load_state_dict(deterministic.state_dict())
    with torch.no_grad():
        p1, _, _ = deterministic.predict_batch(labelled)
        torch.manual_seed(1)
        p8, _, _ = sampled.predict_batch(labelled)
    assert torch.allclose(p8.sum(-1), torch.ones(2), atol=1e-6)
    assert (p1 - p8).abs().max() > 1e-5  # the samples moved the prediction (a small random encoder moves it little)
    assert not any(k.training for k in sampled.model.kernels())  # kernels are back in evaluation mode
    assert _module("softmax", tokenizer, 8).mc_samples == 1  # deterministic variants pay for one pass only
    assert len(kernels_of(sampled.model.encoder)) == 2


def test_text_kernels_are_told_they_attend_over_a_token_sequence(tokenizer):
    from modules.attention import AttentionSite

    text = AttentionSite("text", "self", sequence=True)
    assert [kernel.site for kernel in kernels_of(_tiny("fenchel", tokenizer))] == [text, text]
    assert [kernel.site for kernel in kernels_of(load_minilm("softmax"))] == [text] * 6
