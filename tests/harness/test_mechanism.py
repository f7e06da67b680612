"""The "mechanism active" rule (modules/attention/mechanism.py) on records' diagnostic curves (issue 35)."""

from modules.attention.mechanism import baseline_variant, mechanism_active


def record(variant, history=None, diagnostics=None):
    return {"spec": {"variant": variant}, "history": history or {}, "diagnostics": diagnostics or {}}


def test_align_gan_is_active_when_its_discriminator_beat_chance_or_its_distance_fell_below_softmaxs():
    assert baseline_variant("align-gan") == "softmax"
    at_chance = {"diag/disc_acc": [0.5, 0.5, 0.51]}
    softmax = record("softmax", diagnostics={"val/diag/qk_distance": 0.8})
    active, evidence = mechanism_active(record("align-gan", at_chance, {"val/diag/qk_distance": 0.79}), softmax)
    assert active is False and "disc_acc max 0.51 <= 0.55" in evidence and "x0.99" in evidence
    assert mechanism_active(record("align-gan", {"diag/disc_acc": [0.5, 0.7, 0.52]}, {"val/diag/qk_distance": 0.79}), softmax)[0] is True
    assert mechanism_active(record("align-gan", at_chance, {"val/diag/qk_distance": 0.5}), softmax)[0] is True
    # without softmax's record the distance decides nothing, and a discriminator at chance alone is not proof
    assert mechanism_active(record("align-gan", at_chance, {"val/diag/qk_distance": 0.5}))[0] is None


def test_bam_needs_both_a_kl_share_and_a_sampling_spread():
    both = {"diag/kl_share": 0.2, "diag/sample_tv": 0.05}
    assert mechanism_active(record("bam-lognormal", diagnostics=both))[0] is True
    active, evidence = mechanism_active(record("bam-weibull", diagnostics={**both, "diag/sample_tv": 5e-4}))
    assert active is False and "sample_tv final 0.0005 <= 0.001" in evidence


def test_softmax_old_records_and_shown_only_diagnostics_decide_nothing():
    assert mechanism_active(record("softmax", diagnostics={"val/diag/qk_distance": 0.8}))[0] is None
    assert mechanism_active(record("bam-weibull"))[0] is None  # a record from before the diagnostics
    assert mechanism_active(record("gmm", {"diag/alpha": [0.35, 0.5]}))[0] is None


def test_entmax_and_fenchel_rules():
    assert mechanism_active(record("sparsemax", diagnostics={"diag/support_fraction": 0.4}))[0] is True
    assert mechanism_active(record("entmax15", diagnostics={"diag/support_fraction": 0.99}))[0] is False
    moved = {"diag/alpha": [1.0, 1.2], "diag/prior_tv": [0.0, 0.001]}
    active, evidence = mechanism_active(record("fenchel", moved))
    assert active is True and "alpha 1 -> 1.2 (20.0% > 5%)" in evidence
    assert mechanism_active(record("fenchel", {"diag/alpha": [1.0, 1.0], "diag/prior_tv": [0.0, 0.001]}))[0] is False
