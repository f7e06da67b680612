"""The captioning host, its decoding, the caption metrics against pycocoevalcap, and coco-captions end to end."""

import math

import pytest
import torch

from harness.cli import main
from harness.run.runner import execute
from harness.plan.spec import make_spec
from modules.attention import list_attentions
from modules.hosts.captioner import Captioner
from modules.lit import caption_metrics
from modules.lit.attention_terms import trace_aux_loss
from modules.lit.caption_metrics import CaptionScores, java_available, ptb_tokenize, python_tokenize
from modules.tasks import get_task

PAD, BOS, EOS = 0, 1, 2
VOCAB, FEATURES, GRID = 12, 16, 5


def tiny(variant="softmax", *, eos_bias=0.0, seed=0):
    torch.manual_seed(seed)
    model = Captioner(VOCAB, FEATURES, variant, pad_id=PAD, bos_id=BOS, eos_id=EOS, width=32, heads=4, depth=2, encoder_depth=1, dropout=0.0)
    with torch.no_grad():
        model.output_bias[EOS] = eos_bias  # captions of an untrained model then end at varied lengths
    return model.eval()


def words(batch, length, seed=1):
    return torch.randint(4, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


FEATS = torch.randn(3, GRID, FEATURES, generator=torch.Generator().manual_seed(2))


def padded_captions():
    tokens = torch.cat([torch.full((3, 1), BOS), words(3, 6)], 1)
    tokens[0, 4], tokens[0, 5:] = EOS, PAD  # a short caption, padded
    tokens[1, 6] = EOS
    return tokens


@pytest.mark.parametrize("variant", list_attentions())
def test_decoder_masks_are_causal_and_skip_padding(variant):
    tokens = padded_captions()
    trace = []
    with torch.no_grad():
        logits = tiny(variant)(FEATS, tokens, trace, need_weights=True)
    assert logits.shape == (3, 7, VOCAB)
    assert len(trace) == 5  # encoder self-attention, then self- and cross-attention of two decoder layers
    allowed = torch.ones(7, 7).tril().bool() & (tokens != PAD)[:, None, None, :]
    for index in (1, 3):
        weights = trace[index][1].weights
        assert weights.shape == (3, 4, 7, 7)
        assert (weights[~allowed.expand_as(weights)] == 0).all()
        assert torch.allclose(weights.sum(-1), torch.ones(3, 4, 7), atol=1e-5)
    for index in (2, 4):
        cross = trace[index][1].weights
        assert cross.shape == (3, 4, 7, GRID) and torch.allclose(cross.sum(-1), torch.ones(3, 4, 7), atol=1e-5)


@pytest.mark.parametrize("variant", list_attentions())
def test_decoder_output_at_t_ignores_every_later_token(variant):
    model = tiny(variant)
    tokens = padded_captions()
    with torch.no_grad():
        reference = model(FEATS, tokens)
        for t in range(tokens.shape[1] - 1):
            changed = tokens.clone()
            changed[:, t + 1 :] = words(3, tokens.shape[1] - t - 1, seed=10 + t)
            changed[2, -1] = PAD  # a later pad must not matter either
            logits = model(FEATS, changed)
            assert torch.allclose(logits[:, : t + 1], reference[:, : t + 1], atol=1e-5), (t, (logits[:, : t + 1] - reference[:, : t + 1]).abs().max())


@pytest.mark.parametrize("variant", list_attentions())
def test_every_variant_trains_a_step_and_reports_aux_losses(variant):
    model = tiny(variant).train()
    tokens = padded_captions()
    trace = []
    logits = model(FEATS, tokens[:, :-1], trace)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), ignore_index=PAD)
    aux, logs = trace_aux_loss(trace, step=0)
    names = [sorted(result.aux_losses) for kernel, result in trace if kernel.site.role == "self"]
    assert all(n == names[0] for n in names)  # every self-attention reports the same terms
    if variant.startswith("align-"):  # the alignment regulariser is defined for self-attention only
        assert all(not result.aux_losses for kernel, result in trace if kernel.site.role != "self")
        assert any(kernel.site.role == "cross" for kernel, _ in trace)
    weighted = {name for kernel, _ in trace for name, w in kernel.loss_weights(0, epoch=0).items() if w}
    if variant.startswith(("bam-", "align-")):
        assert weighted and names[0]
    assert set(logs) == {f"aux/{n}" for n in names[0]}
    assert (aux is not None) == bool(weighted & set(names[0]))
    total = loss + aux if aux is not None else loss
    assert torch.isfinite(total)
    total.backward()
    cross = model.decoder[0].cross_attn
    grads = [layer.weight.grad for layer in (cross.q, cross.k, cross.v, cross.out)]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def log_prob(model, features, caption):
    """log p(caption | image) by teacher forcing, up to and including its <eos>."""
    length = int((caption == EOS).nonzero()[0]) + 1 if (caption == EOS).any() else len(caption)
    tokens = torch.cat([torch.tensor([BOS]), caption[:length]])[None]
    with torch.no_grad():
        logp = model(features[None], tokens[:, :-1]).log_softmax(-1)
    return float(logp[0].gather(1, tokens[0, 1:, None]).sum()), length


def assert_well_formed(caption, max_len):
    caption = caption.tolist()
    assert len(caption) <= max_len and BOS not in caption
    if EOS in caption:
        end = caption.index(EOS)
        assert PAD not in caption[:end] and all(t == PAD for t in caption[end + 1 :])
    else:
        assert PAD not in caption


@pytest.mark.parametrize("variant", ["softmax", "entmax15"])
def test_greedy_equals_beam_search_of_width_one(variant):
    model = tiny(variant, eos_bias=1.5)
    greedy = model.greedy(FEATS, 8)
    beam, scores = model.beam_search(FEATS, 1, 8)
    assert torch.equal(beam[:, 0, : greedy.shape[1]], greedy) and (beam[:, 0, greedy.shape[1] :] == PAD).all()
    for row in range(3):
        assert_well_formed(greedy[row], 8)
        assert scores[row, 0].item() == pytest.approx(log_prob(model, FEATS[row], greedy[row])[0], abs=1e-4)


def test_beam_search_returns_finished_captions_best_first_with_their_log_probabilities():
    model = tiny(eos_bias=2.0)
    captions, scores = model.beam_search(FEATS, 4, 6)
    assert captions.shape[:2] == (3, 4) and captions.shape[2] <= 6
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    finished = 0
    for row in range(3):
        assert len({tuple(c.tolist()) for c in captions[row]}) == 4  # four different captions
        for k in range(4):
            assert_well_formed(captions[row, k], 6)
            finished += int((captions[row, k] == EOS).any())
            expected, _ = log_prob(model, FEATS[row], captions[row, k])
            assert scores[row, k].item() == pytest.approx(expected, abs=1e-4)
    assert finished >= 6  # most captions ended with <eos>, so the check above covered finished beams
    greedy_score = log_prob(model, FEATS[0], model.greedy(FEATS[:1], 6)[0])[0]
    assert scores[0, 0].item() >= greedy_score - 1e-4


def test_length_penalty_divides_scores_by_length():
    model = tiny(eos_bias=2.0)
    captions, scores = model.beam_search(FEATS, 3, 6, length_penalty=1.0)
    for row in range(3):
        for k in range(3):
            logp, length = log_prob(model, FEATS[row], captions[row, k])
            assert scores[row, k].item() == pytest.approx(logp / length, abs=1e-4)
    assert (scores[:, :-1] >= scores[:, 1:]).all()


# ---- caption metrics ---------------------------------------------------------------------------------

REFERENCES = {
    1: ["A man riding a wave on top of a surfboard.", "A surfer rides a large wave in the ocean.", "A person surfing on a big wave."],
    2: ["Two dogs playing with a frisbee in the grass.", "A pair of dogs run after a frisbee.", "Dogs chase a red frisbee in a park."],
    3: ["A plate of food with broccoli and rice.", "A dish of rice, meat and broccoli.", "Broccoli and rice on a white plate."],
    4: ["A red bus driving down a city street.", "A double decker bus on the road.", "The bus is parked by the curb."],
}
HYPOTHESES = {1: "a man riding a wave on a surfboard", 2: "two dogs play with a frisbee", 3: "a plate of rice and broccoli", 4: "a cat sitting on a couch"}


def scored(tokenizer, scorers=("cider", "bleu4", "rouge_l"), batches=((1, 2), (3, 4))):
    metric = CaptionScores(scorers, tokenizer=tokenizer)
    for keys in batches:
        metric.update(list(keys), [HYPOTHESES[k] for k in keys], [REFERENCES[k] for k in keys])
    return metric.compute()


@pytest.mark.parametrize("tokenizer", ["python", "ptb"])
def test_scores_equal_pycocoevalcap_called_directly(tokenizer):
    if tokenizer == "ptb" and not java_available():
        pytest.skip("the PTB tokenizer needs Java")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    tokenize = ptb_tokenize if tokenizer == "ptb" else python_tokenize
    gts = tokenize({k: list(v) for k, v in REFERENCES.items()})
    res = tokenize({k: [v] for k, v in HYPOTHESES.items()})
    got = scored(tokenizer)
    assert got["cider"].item() == pytest.approx(Cider().compute_score(gts, res)[0], abs=1e-12)
    assert got["bleu4"].item() == pytest.approx(Bleu(4).compute_score(gts, res, verbose=0)[0][3], abs=1e-12)
    assert got["rouge_l"].item() == pytest.approx(Rouge().compute_score(gts, res)[0], abs=1e-12)
    # not a degenerate case, where a scorer returning 0 or 1 for everything would match the references too
    assert 0 < got["bleu4"].item() < 1 and got["cider"].item() > 0


def test_a_caption_equal_to_all_its_references_scores_one():
    caption = "a man riding a wave on top of a surfboard"
    metric = CaptionScores(("bleu4", "rouge_l"), tokenizer="python")
    metric.update([7], [caption], [[caption] * 3])
    scores = metric.compute()
    assert scores["bleu4"].item() == pytest.approx(1.0, abs=1e-6) and scores["rouge_l"].item() == pytest.approx(1.0)
    # A second image whose caption shares no word with its references: ROUGE-L averages 1 and 0.
    metric.update([8], ["a plate of food"], [["two dogs chase the red frisbee"] * 3])
    assert metric.compute()["rouge_l"].item() == pytest.approx(0.5)


def test_metric_accumulates_over_batches_resets_and_survives_moves():
    metric = CaptionScores(tokenizer="python")
    metric.update([1, 2, 3, 4], [HYPOTHESES[k] for k in (1, 2, 3, 4)], [REFERENCES[k] for k in (1, 2, 3, 4)])
    metric.to(torch.float64)  # strings are kept out of torchmetrics' device and dtype moves
    assert {k: v.item() for k, v in metric.compute().items()} == {k: v.item() for k, v in scored("python").items()}
    metric.reset()
    with pytest.warns(UserWarning, match="called before the ``update``"), pytest.raises(ValueError, match="before any update"):
        metric.compute()
    with pytest.raises(ValueError, match="2 image ids, 1 hypotheses"):
        metric.update([1, 2], ["a"], [["b"], ["c"]])


def test_without_java_meteor_is_skipped_with_a_warning_and_words_are_python_tokens(monkeypatch):
    monkeypatch.setattr(caption_metrics, "java_available", lambda: False)
    with pytest.warns(UserWarning, match="METEOR needs Java"):
        scores = scored("auto", scorers=("cider", "bleu4", "meteor"))
    assert set(scores) == {"cider", "bleu4"}
    assert scores["cider"].item() == scored("python", scorers=("cider",))["cider"].item()


@pytest.mark.slow
@pytest.mark.skipif(not java_available(), reason="METEOR needs Java")
def test_meteor_runs_on_java():
    """METEOR's JVM loads 2 GB of paraphrase tables (about 10 s)."""
    metric = CaptionScores(("meteor",), tokenizer="ptb")
    caption = "a man riding a wave on top of a surfboard"
    metric.update([1], [caption], [[caption, "a surfer on a wave"]])
    assert metric.compute()["meteor"].item() > 0.95


# ---- the task end to end ---------------------------------------------------------------------------

TINY = {"width": 32, "heads": 2, "depth": 1, "image_size": 64, "max_epochs": 1, "batch_size": 128, "beam_size": 2,
        "max_caption_words": 8, "meteor": False}


def test_coco_captions_end_to_end_records_finite_caption_metrics(shared_data):
    record = execute(make_spec("coco-captions", "softmax", 0, TINY), data_root=str(shared_data))
    assert record["status"] == "ok", record.get("traceback")
    assert list(record["metrics"]) == ["test/cider", "test/bleu4", "test/rouge_l"]
    assert all(math.isfinite(m["value"]) and m["value"] >= 0 for m in record["metrics"].values())
    assert record["best_monitor"]["name"] == "val/cider"
    assert "test/attn/entropy" in record["diagnostics"] and "test/attn/l1/support" in record["diagnostics"]  # self- and cross-attention of one layer
    assert get_task("coco-captions").primary.name == "test/cider"


def test_missing_coco_folder_exits_2_naming_the_file(tmp_path, capsys, runs):
    (tmp_path / "planetoid").mkdir()
    code = main(["run", "coco-captions", "softmax", "--data-root", str(tmp_path), "--runs-dir", str(runs)])
    assert code == 2
    err = capsys.readouterr().err
    assert "coco/captions.json" in err and "coco/images/" in err


def test_bad_image_weights_is_a_clear_error(shared_data, capsys, runs):
    code = main(["run", "coco-captions", "softmax", "--set", "image_weights=imagenet", "--data-root", str(shared_data), "--runs-dir", str(runs)])
    assert code == 2
    assert "image_weights must be one of ('random', 'pretrained')" in capsys.readouterr().err


def _score_on_rank(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # Each rank sees half the images, plus image 1 on both (a DistributedSampler pads a shard that way).
        keys = (1, 2) if rank == 0 else (3, 4, 1)
        metric = CaptionScores(tokenizer="python")
        metric.update(list(keys), [HYPOTHESES[k] for k in keys], [REFERENCES[k] for k in keys])
        out.put((rank, {k: v.item() for k, v in metric.compute().items()}))
    finally:
        dist.destroy_process_group()


def test_data_parallel_ranks_score_the_union_of_their_captions_once():
    import socket

    import torch.multiprocessing as tmp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = tmp.get_context("spawn")
    out = ctx.Queue()
    processes = [ctx.Process(target=_score_on_rank, args=(rank, 2, port, out)) for rank in range(2)]
    for p in processes:
        p.start()
    results = dict(out.get(timeout=120) for _ in processes)
    for p in processes:
        p.join(timeout=30)
    expected = {k: v.item() for k, v in scored("python").items()}
    assert results[0] == results[1] == expected


def test_each_attention_of_the_captioner_is_told_its_site():
    from modules.attention import AttentionSite

    model = tiny()
    grid = AttentionSite("vision-language", "self")
    caption = AttentionSite("vision-language", "self", sequence=True)
    assert [layer.self_attn.kernel.site for layer in model.encoder] == [grid]
    assert [layer.self_attn.kernel.site for layer in model.decoder] == [caption, caption]
    assert [layer.cross_attn.kernel.site for layer in model.decoder] == [AttentionSite("vision-language", "cross")] * 2
