"""`attnbench probe fenchel`: the head -> dual-problem mapping against the model's own attention, the dual solver
against an independent scipy solution and the paper's small-alpha argument, and the command end to end."""

import csv
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import logsumexp

from harness.cli import main
from harness.studies.probe import head_mapping, relative_deviation, solve_dual
from modules.hosts.text_encoder import load_minilm, minilm_tokenizer

REPO = Path(__file__).resolve().parents[2]

# First lines of the GLUE SST-2 and RTE dev sets: different lengths, so a batch has padding.
SST2_SENTENCES = [
    "it 's a charming and often affecting journey . ",
    "unflinchingly bleak and desperate ",
    "allows us to hope that nolan is poised to embark a major career as a commercial yet inventive filmmaker . ",
]
RTE_PAIRS = (
    ["Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, according to the "
     "Christopher Reeve Foundation.", "Yet, we now are discovering that antibiotics are losing their effectiveness."],
    ["Christopher Reeve had an accident.", "Bacteria is winning the war against antibiotics."],
)


@pytest.fixture(scope="module")
def minilm():
    return load_minilm(), minilm_tokenizer()


@pytest.fixture
def data_root() -> Path:
    root = Path(os.environ.get("ATTNBENCH_DATA") or REPO.parent / "shared" / "data")
    if not (root / "glue" / "SST-2" / "dev.tsv").is_file():
        pytest.skip(f"no GLUE SST-2 dev set under {root}; set ATTNBENCH_DATA")
    return root


@pytest.mark.parametrize("segments", [(SST2_SENTENCES,), RTE_PAIRS], ids=["sst2", "rte-pairs"])
def test_softmax_of_templates_and_evidence_is_the_models_attention(minilm, segments):
    bert, tokenizer = minilm
    encoding = tokenizer(*segments, padding=True, return_tensors="pt")
    lengths = encoding["attention_mask"].sum(-1).tolist()
    assert min(lengths) < max(lengths), "the batch must contain padding"
    with torch.no_grad():
        output = bert(**encoding, output_hidden_states=True, output_attentions=True)
    for row, length in enumerate(lengths):
        for layer, block in enumerate(bert.encoder.layer):
            templates, evidence = head_mapping(block.attention.self, output.hidden_states[layer][row, :length])
            assert templates.shape == (length, 384) and evidence.shape == (12, length, 384)
            probs = output.attentions[layer][row, :, :length].double()
            mapped = torch.softmax(evidence @ templates.T, dim=-1)
            torch.testing.assert_close(mapped, probs[:, :, :length], atol=1e-5, rtol=0)
            assert probs[:, :, length:].sum() < 1e-6
            # a mapping without the 1/sqrt(d') in the templates is visibly wrong: the check can fail
            unscaled = torch.softmax(evidence @ (templates * 32**0.5).T, dim=-1)
            assert (unscaled - probs[:, :, :length]).abs().max() > 1e-2


def _reference_dual(lam: np.ndarray, templates: np.ndarray, weights: np.ndarray, z: np.ndarray, alpha: float):
    """Value and gradient of (13), written from the paper: <lam, mu + z> - ||lam||^2 / (2 alpha) - log M(lam)."""
    mu = weights @ templates
    log_m = logsumexp(templates @ lam, b=weights)
    tilted = weights * np.exp(templates @ lam - log_m)
    value = lam @ (mu + z) - lam @ lam / (2 * alpha) - log_m
    return value, mu + z - lam / alpha - tilted @ templates


@pytest.mark.parametrize("n, d, alpha", [(6, 10, 1.0), (9, 4, 1.0), (7, 7, 3.0)], ids=["n<d", "n>d", "alpha=3"])
def test_solver_meets_the_first_order_condition_and_agrees_with_scipy(n, d, alpha):
    rng = np.random.default_rng(100 * n + d)
    templates = rng.normal(size=(n, d))
    weights = rng.dirichlet(np.ones(n))
    weights[0] = 0.0  # a padding template: outside u's support
    weights /= weights.sum()
    evidence = rng.normal(scale=2.0, size=(5, d))

    solution = solve_dual(torch.from_numpy(templates), torch.from_numpy(weights), torch.from_numpy(evidence), alpha)
    assert solution.grad_norm.max() < 1e-10
    for z, lam in zip(evidence, solution.lam.numpy()):
        assert np.linalg.norm(_reference_dual(lam, templates, weights, z, alpha)[1]) < 1e-10

        def negated(point: np.ndarray):
            value, grad = _reference_dual(point, templates, weights, z, alpha)
            return -value, -grad

        reference = minimize(negated, x0=np.zeros(d), jac=True, method="BFGS", options={"gtol": 1e-11, "maxiter": 10_000})
        # strong concavity (modulus 1 / alpha): ||x - lam*|| <= alpha ||grad(x)||, so this bounds scipy's own error.
        # How far BFGS gets before its line search loses precision depends on the CPU's float bits (under 1e-8 on
        # the Intel Xeon where the test was written, 2e-8 on an AMD EPYC for n>d, issue 50): the reference is good
        # enough while that bound is well under the comparison's tolerance, and the tolerance covers it
        scipy_error = alpha * np.linalg.norm(reference.jac)
        assert scipy_error < 1e-7
        np.testing.assert_allclose(lam, reference.x, atol=1e-6 + scipy_error, rtol=0)
        # the solution is not just the starting point alpha z
        assert np.linalg.norm(lam - alpha * z) > 1e-3


def test_deviation_from_alpha_z_vanishes_as_alpha_goes_to_zero():
    """Eqs. (17)-(20): lambda* = alpha (I + alpha Sigma)^-1 z + O(alpha^3), so ||lambda* - alpha z|| / ||lambda*||
    = alpha ||Sigma z|| / ||z|| + O(alpha^2), and (19) accounts for all but a vanishing part of the deviation."""
    rng = np.random.default_rng(7)
    n, d = 8, 6
    templates = rng.normal(size=(n, d))
    weights = np.full(n, 1.0 / n)
    z = rng.normal(scale=2.0, size=d)
    centred = templates - weights @ templates
    sigma = centred.T @ (weights[:, None] * centred)

    deviations = []
    for alpha in (1.0, 1e-1, 1e-2, 1e-3):
        lam = solve_dual(torch.from_numpy(templates), torch.from_numpy(weights), torch.from_numpy(z[None]), alpha).lam
        deviations.append(relative_deviation(lam, torch.from_numpy(z[None]), alpha).item())
        second_order = alpha * np.linalg.solve(np.eye(d) + alpha * sigma, z)  # (19)
        unexplained = np.linalg.norm(lam[0].numpy() - second_order) / np.linalg.norm(lam[0].numpy() - alpha * z)
        if alpha <= 1e-2:
            assert unexplained < 3 * alpha
    assert all(later < earlier for earlier, later in zip(deviations, deviations[1:]))
    slope = np.linalg.norm(sigma @ z) / np.linalg.norm(z)
    assert deviations[-1] / 1e-3 == pytest.approx(slope, rel=5e-3)


def test_cli_writes_the_report_and_prints_the_per_layer_table(data_root, tmp_path, capsys):
    def run(out: Path) -> str:
        argv = ["probe", "fenchel", "--sentences", "4", "--out", str(out), "--data-root", str(data_root)]
        assert main(argv) == 0
        return capsys.readouterr().out

    printed = run(tmp_path / "first")
    assert all(word in printed for word in ("mean", "median", "p90"))
    table = [line for line in printed.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(line.split("|")[1]) for line in table] == list(range(6))
    layer_means = [float(line.split("|")[4]) for line in table]
    assert all(0.0 < mean < 1.0 for mean in layer_means)
    # the mapping check in the last column
    assert all(float(line.split("|")[8]) < 1e-5 for line in table)

    out = tmp_path / "first"
    with open(out / "fenchel-minilm.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 * 12
    for layer, mean in enumerate(layer_means):
        head_means = [float(row["mean"]) for row in rows if int(row["layer"]) == layer]
        # every head sees the same tokens, so the layer mean is the mean of the head means
        assert np.mean(head_means) == pytest.approx(mean, abs=1e-4)
    report = (out / "fenchel-minilm.md").read_text()
    assert "all-MiniLM-L6-v2" in report and "SST-2" in report and "Fig. 4" in report and table[0] in report
    assert (out / "fenchel-minilm.png").read_bytes().startswith(b"\x89PNG")

    run(tmp_path / "second")
    for name in ("fenchel-minilm.md", "fenchel-minilm.csv", "fenchel-minilm.png"):
        assert (tmp_path / "second" / name).read_bytes() == (out / name).read_bytes(), f"{name} is not deterministic"


def test_cli_names_the_missing_data_file_and_the_fix(tmp_path, capsys):
    assert main(["probe", "fenchel", "--data-root", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "glue/SST-2/dev.tsv" in err and "ATTNBENCH_DATA" in err
    assert not (tmp_path / "out").exists()
