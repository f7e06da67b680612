"""The VQA metrics on hand-made cases, the MCAN host under every variant, and the two tasks end to end."""

import math

import pytest
import torch

from harness.run.runner import execute
from harness.plan.spec import make_spec
from modules.attention import list_attentions
from modules.hosts.attention_layers import variant_kernels
from modules.hosts.mcan import MCAN
from modules.lit.attention_terms import trace_aux_loss
from modules.lit.vqa import PAvPU, TopAnswerCalibrationError, TopAnswerNLL, VQAAccuracy, VQAModule
from modules.tasks import get_task

# Soft targets over 4 answers, as min(#humans / 3, 1) of ten human answers.
TARGETS = torch.tensor([
    [1.0, 0.0, 0.0, 0.0],  # 10 humans said answer 0
    [1.0, 2 / 3, 1 / 3, 0.0],  # 5, 2, 1 (and 2 outside the vocabulary)
    [0.0, 0.0, 1 / 3, 1.0],  # 1, 9
])


def test_vqa_accuracy_is_the_soft_score_of_the_predicted_answer():
    metric = VQAAccuracy()
    metric.update(torch.tensor([0, 1, 0]), TARGETS)  # 3+ humans -> 1, 2 humans -> 2/3, nobody -> 0
    assert metric.compute().item() == pytest.approx((1 + 2 / 3 + 0) / 3)
    metric.update(torch.tensor([[0.1, 0.2, 0.9, 0.0]]), TARGETS[2:])  # scores: argmax is answer 2, one human
    assert metric.compute().item() == pytest.approx((1 + 2 / 3 + 0 + 1 / 3) / 4)


def test_pavpu_counts_accurate_certain_and_inaccurate_uncertain():
    confident = torch.tensor([0.97, 0.01, 0.01, 0.01])  # entropy 0.17 nats < 0.5
    flat = torch.tensor([0.3, 0.25, 0.25, 0.2])  # entropy 1.38 nats
    probs = torch.stack([
        confident,  # accurate (score 1), certain      -> counts
        flat.roll(1),  # argmax 1: score 2/3 >= 0.5 accurate, uncertain -> does not count
        confident.roll(2),  # argmax 2: score 1/3 inaccurate, certain -> does not count
        flat,  # argmax 0: score 0 inaccurate, uncertain -> counts
    ])
    targets = torch.cat([TARGETS, TARGETS[2:]])
    metric = PAvPU(threshold=0.5)
    metric.update(probs, targets)
    assert metric.compute().item() == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="must be positive"):
        PAvPU(threshold=0.0)


def test_calibration_and_nll_use_the_top_human_answer_and_skip_unanswerable_questions():
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    targets = torch.stack([TARGETS[0], TARGETS[2], torch.zeros(4)])  # the last has no in-vocabulary answer
    nll = TopAnswerNLL()
    nll.update(probs, targets)
    assert nll.compute().item() == pytest.approx((-math.log(0.7) - math.log(0.1)) / 2)
    ece = TopAnswerCalibrationError(4)
    ece.update(probs, targets)
    # Two questions: confidence 0.7 right, confidence 0.6 wrong, in different bins.
    assert ece.compute().item() == pytest.approx((abs(1 - 0.7) + abs(0 - 0.6)) / 2, abs=1e-6)


def tiny_batch(lengths=(5, 3), vocab=20, grid=(2, 2), channels=6, answers=7):
    generator = torch.Generator().manual_seed(0)
    longest = max(lengths)
    valid = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
    question = torch.randint(4, vocab, (len(lengths), longest), generator=generator) * valid
    target = torch.zeros(len(lengths), answers)
    target[:, 1] = 1.0
    target[0, 2] = 2 / 3
    return {"question": question, "question_valid": valid, "image": torch.randn(len(lengths), grid[0] * grid[1], channels, generator=generator),
            "target": target}


def tiny_mcan(variant):
    torch.manual_seed(0)
    return MCAN(variant, vocab_size=20, image_channels=6, grid_size=(2, 2), num_answers=7, width=16, heads=2, depth=1, dropout=0.0)


@pytest.mark.parametrize("variant", list_attentions())
def test_every_variant_trains_one_step_in_mcan(variant):
    model = tiny_mcan(variant).train()
    module = VQAModule(model, num_answers=7, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0)
    batch = tiny_batch()
    trace = []
    loss = module.loss(module(batch, trace), batch["target"])
    # 1 SA + 1 SGA (self and guided) + 2 poolings, all through the variant.
    assert len(trace) == 5 and len(variant_kernels(model)) == 5
    aux, logs = trace_aux_loss(trace, step=1000)
    expected_terms = {name for _, result in trace for name in result.aux_losses}
    assert {f"aux/{name}" for name in expected_terms} == set(logs)
    if variant.startswith(("bam", "align")):
        assert expected_terms and aux is not None and torch.isfinite(aux)
    total = loss + (aux if aux is not None else 0)
    assert torch.isfinite(total)
    total.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.pool_image.attn.q.parameters())
    assert model.embed.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", list_attentions())
def test_padding_does_not_change_a_questions_prediction(variant):
    model = tiny_mcan(variant).eval()
    batch = tiny_batch(lengths=(3, 5))
    alone = {k: v[:1] for k, v in batch.items()}
    alone["question"], alone["question_valid"] = alone["question"][:, :3], alone["question_valid"][:, :3]
    with torch.no_grad():
        padded = model(batch["question"], batch["question_valid"], batch["image"])[0]
        single = model(alone["question"], alone["question_valid"], alone["image"])[0]
    assert torch.allclose(padded, single, atol=1e-5), (padded - single).abs().max()


def test_stochastic_variant_averages_mc_samples():
    module = VQAModule(tiny_mcan("bam-weibull"), num_answers=7, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0, mc_samples=4).eval()
    probs, loss, _ = module.predict_batch(tiny_batch())
    assert module.mc_samples == 4 and torch.allclose(probs.sum(1), torch.ones(2)) and torch.isfinite(loss)
    assert VQAModule(tiny_mcan("softmax"), num_answers=7, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0, mc_samples=4).mc_samples == 1


TINY = {"width": 16, "heads": 2, "depth": 1, "max_epochs": 1, "batch_size": 8, "image_size": 64, "stage": 2}
METRICS = ["test/vqa_acc", "test/ece", "test/nll", "test/pavpu"]


def check(record):
    assert record["status"] == "ok", record.get("traceback")
    assert list(record["metrics"]) == METRICS
    assert all(math.isfinite(m["value"]) for m in record["metrics"].values())
    assert record["metrics"]["test/ece"]["higher_is_better"] is False
    assert record["diagnostics"]  # attention entropy/support on test


def test_vqa_subset_end_to_end(shared_data):
    check(execute(make_spec("vqa", "entmax15", 0, TINY), data_root=str(shared_data)))


def test_easy_vqa_end_to_end():
    pytest.importorskip("easy_vqa")
    record = execute(make_spec("easy-vqa", "bam-lognormal", 0, {**TINY, "max_train_examples": 64, "max_eval_examples": 48, "mc_samples": 2}))
    check(record)
    assert 0.0 <= record["metrics"]["test/vqa_acc"]["value"] <= 1.0


def test_tasks_name_missing_vqa_files(tmp_path):
    problem = get_task("vqa").data_problem(str(tmp_path))
    assert "vqa/questions.json" in problem and "v2_OpenEnded_mscoco_" in problem
    assert get_task("easy-vqa").data_problem(str(tmp_path)) is None
    with pytest.raises(ValueError, match="dataset must be one of"):
        get_task("vqa").params({"dataset": "gqa"})


def test_each_attention_of_mcan_is_told_its_site():
    from modules.attention import AttentionSite

    model = tiny_mcan("softmax")
    text, grid = AttentionSite("vision-language", "self", sequence=True), AttentionSite("vision-language", "self")
    cross, pool = AttentionSite("vision-language", "cross"), AttentionSite("vision-language", "pool")
    assert [layer.self_attn.kernel.site for layer in model.encoder] == [text]  # over the question's words
    assert [layer.self_attn.kernel.site for layer in model.decoder] == [grid]  # over the image grid
    assert [layer.cross_attn.kernel.site for layer in model.decoder] == [cross]  # image -> question
    assert [model.pool_question.attn.kernel.site, model.pool_image.attn.kernel.site] == [pool, pool]
    # the trace holds every kernel once per call, in the order they ran
    batch = tiny_batch()
    trace = []
    model(batch["question"], batch["question_valid"], batch["image"], trace)
    order = [model.encoder[0].self_attn, model.decoder[0].self_attn, model.decoder[0].cross_attn, model.pool_question.attn, model.pool_image.attn]
    assert [kernel for kernel, _ in trace] == [attention.kernel for attention in order]
