"""The contract every attention variant keeps (DESIGN.md section 6.2), as checks a variant's author can run
on their own file: `attnbench check my_variant.py` runs them on each variant the file registers, and
tests/attention/test_contract.py and test_precision.py run the same functions on every registered variant
(one copy of the logic, so the command can never check less than the test suite does).

Each check takes a variant name (and optional config) and raises AssertionError naming what broke; `PROPERTIES`
lists the ones `check` runs, `applicable` says where one does not apply (no declared softmax limit)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .groups import DenseGroups, SegmentGroups
from .kernel import AttentionKernel, AttentionSite
from .registry import attention_entry, build_attention

HEADS, DIM = 2, 4
SCALE = DIM**-0.5


@dataclass
class Problem:
    q: torch.Tensor  # [B, H, L, d]
    k: torch.Tensor
    v: torch.Tensor
    key_valid: torch.Tensor  # [B, L]
    dense: DenseGroups
    segment: SegmentGroups
    edge_b: torch.Tensor
    edge_i: torch.Tensor
    edge_j: torch.Tensor

    def nodes(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, L, d] -> node layout [B*L, H, d]."""
        b, h, l, d = x.shape
        return x.permute(0, 2, 1, 3).reshape(b * l, h, d)

    def real_nodes(self, x: torch.Tensor) -> torch.Tensor:
        """Node-layout rows [B*L, ...] of the real tokens (padded tokens are nodes without edges)."""
        return x[self.key_valid.reshape(-1)]

    def dense_at_edges(self, logits: torch.Tensor) -> torch.Tensor:
        """Dense [B, H, L, L] values at the segment edges -> [E, H]."""
        return logits[self.edge_b, :, self.edge_i, self.edge_j]


def make_problem(batch=2, heads=2, length=5, dim=4, dtype=torch.float64, seed=0) -> Problem:
    """A small dense self-attention batch (the last sequence padded) and its graph (segment) twin."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, dim, generator=g, dtype=dtype) for _ in range(3))
    key_valid = torch.ones(batch, length, dtype=torch.bool)
    key_valid[-1, -2:] = False  # the last sequence is padded
    dense = DenseGroups.from_key_padding(key_valid, query_valid=key_valid)  # self-attention: padded tokens are padded queries too
    # the graph twin: real tokens attend real tokens; a padded token is a node without incoming edges
    b, i, j = torch.nonzero(key_valid[:, :, None] & key_valid[:, None, :], as_tuple=True)
    segment = SegmentGroups(dst=b * length + i, src=b * length + j, num_nodes=batch * length)
    return Problem(q, k, v, key_valid, dense, segment, b, i, j)


def kernel_for(name: str, **overrides) -> AttentionKernel:
    torch.manual_seed(0)
    return build_attention({"name": name, **overrides}, num_heads=HEADS, head_dim=DIM).double()


def dense_weights(kernel, p):
    logits = kernel.score(p.q, p.k, p.dense, scale=SCALE)
    return kernel.normalize(logits, p.dense, q=p.q, k=p.k)


def segment_weights(kernel, p):
    q, k = p.nodes(p.q), p.nodes(p.k)
    logits = kernel.score(q, k, p.segment, scale=SCALE)
    return kernel.normalize(logits, p.segment, q=q, k=k)


# ---- dense equal to segment, gradients, the softmax limit --------------------------------------------------

def check_dense_equals_segment(name: str, config: dict | None = None) -> None:
    """The dense and the segment (graph) forms give the same weights, and the same outputs."""
    p = make_problem()
    kernel = kernel_for(name, **(config or {})).eval()
    dense = dense_weights(kernel, p).weights
    segment = segment_weights(kernel, p).weights
    torch.testing.assert_close(segment, p.dense_at_edges(dense), atol=1e-6, rtol=1e-5)
    out_dense, _ = kernel(p.q, p.k, p.v, p.dense, scale=SCALE)
    out_seg, _ = kernel(p.nodes(p.q), p.nodes(p.k), p.nodes(p.v), p.segment, scale=SCALE)
    torch.testing.assert_close(p.real_nodes(out_seg), p.real_nodes(p.nodes(out_dense)), atol=1e-6, rtol=1e-5)


def check_gradients(name: str, config: dict | None = None) -> None:
    """Analytic gradients with respect to q, k and v match finite differences in float64."""
    p = make_problem(batch=1, length=4, dim=DIM)
    kernel = kernel_for(name, **(config or {})).eval()
    q, k, v = (x.clone().requires_grad_(True) for x in (p.q, p.k, p.v))

    def f(q, k, v):
        out, _ = kernel(q, k, v, p.dense, scale=SCALE)
        return out

    torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-5, raise_exception=False) or _fail(
        f"{name}: gradients differ from finite differences (torch.autograd.gradcheck in float64)")


def _fail(message: str) -> None:
    raise AssertionError(message)


def has_reachable_limit(name: str) -> bool:
    """Names that fix a limit value otherwise (sparsemax fixes alpha=2) are a fixed member of a family
    whose free name (entmax) carries the limit test."""
    entry = attention_entry(name)
    limit = entry.cls.softmax_limit
    return limit is not None and all(entry.preset.get(k, v) == v for k, v in limit.items())


def check_softmax_limit(name: str, config: dict | None = None) -> None:
    """At its declared `softmax_limit` config the variant's weights are softmax's, dense and segment."""
    entry = attention_entry(name)
    limit = {k: v for k, v in entry.cls.softmax_limit.items() if k not in entry.preset}
    p = make_problem()
    kernel = kernel_for(name, **limit).train()
    atol = entry.cls.softmax_limit_atol
    reference = p.dense.softmax(p.dense.scores(p.q, p.k, SCALE))
    torch.testing.assert_close(dense_weights(kernel, p).weights, reference, atol=atol, rtol=0)
    torch.testing.assert_close(segment_weights(kernel, p).weights, p.dense_at_edges(reference), atol=atol, rtol=0)


# ---- padding invariance ---------------------------------------------------------------------------------
# A batch's padding must not change what a variant computes for its real entries: appending padded tokens
# (dense: padded keys and padded query rows) or adding isolated nodes or another graph to a segment batch
# leaves the real rows' weights and outputs, the aux losses and the diagnostics as they were. Stochastic
# variants are compared under the same noise: `draw_noise` is held fixed, the padded call's entries of the
# real positions getting the noise the unpadded call gets.

PADDING = 3
TEXT_SITE = AttentionSite("text", "self", sequence=True)


def perturbed_kernel(name: str, config: dict, site: AttentionSite) -> AttentionKernel:
    """The kernel with every parameter moved off its initial value (zero-initialised priors included)."""
    torch.manual_seed(0)
    kernel = build_attention({"name": name, **config}, num_heads=HEADS, head_dim=DIM, site=site).double()
    with torch.no_grad():
        for parameter in kernel.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return kernel


def hold_noise_fixed(kernel: AttentionKernel) -> None:
    """The first draw of each shape and distribution is the master; later draws index it periodically, so a
    prefix of it (the real positions before appended padding) or a repetition (a copied graph) reuse it."""
    masters: dict[str, torch.Tensor] = {}

    def draw_noise(like: torch.Tensor, distribution: str = "uniform") -> torch.Tensor:
        if distribution not in masters:
            masters[distribution] = AttentionKernel.draw_noise(kernel, like, distribution)
        master = masters[distribution]
        index = [torch.arange(n) % m for n, m in zip(like.shape, master.shape, strict=True)]
        return master[torch.meshgrid(*index, indexing="ij")]

    kernel.draw_noise = draw_noise


def _run(kernel, q, k, v, groups, need_weights=True):
    torch.manual_seed(1)  # anything else a kernel draws (subsampling) starts from the same state
    return kernel(q, k, v, groups, scale=SCALE, need_weights=need_weights)


def assert_same_terms(padded, plain):
    assert padded.aux_losses.keys() == plain.aux_losses.keys()
    for key in plain.aux_losses:
        torch.testing.assert_close(padded.aux_losses[key], plain.aux_losses[key], atol=1e-9, rtol=1e-7, msg=f"aux loss {key}")
    assert padded.diagnostics.keys() == plain.diagnostics.keys()
    for key in plain.diagnostics:
        torch.testing.assert_close(padded.diagnostics[key], plain.diagnostics[key], atol=1e-9, rtol=1e-7, msg=f"diagnostic {key}")


def appended(x: torch.Tensor, count: int, scale: float) -> torch.Tensor:
    """x [B, H, L, d] with `count` garbage positions appended (what a padded token's projections may hold)."""
    garbage = scale * torch.randn(*x.shape[:2], count, x.shape[-1], dtype=x.dtype)
    return torch.cat([x, garbage], dim=2)


def check_dense_padding(name: str, config: dict | None = None, train: bool = True) -> None:
    p = make_problem()
    kernel = perturbed_kernel(name, config or {}, TEXT_SITE).train(train)
    hold_noise_fixed(kernel)
    length = p.q.shape[2]
    key_valid = torch.cat([p.key_valid, torch.zeros(p.key_valid.shape[0], PADDING, dtype=torch.bool)], dim=1)
    groups = DenseGroups.from_key_padding(key_valid, query_valid=key_valid)
    q, k, v = appended(p.q, PADDING, 30.0), appended(p.k, PADDING, -20.0), appended(p.v, PADDING, 10.0)
    out_padded, padded = _run(kernel, q, k, v, groups)  # first: its noise is the master
    out_plain, plain = _run(kernel, p.q, p.k, p.v, p.dense)
    real = p.key_valid[:, None, :, None]  # the real query rows
    torch.testing.assert_close(
        padded.weights[..., :length, :length].masked_select(real), plain.weights.masked_select(real), atol=1e-9, rtol=1e-7
    )
    assert (padded.weights[..., :length, length:] == 0).all(), "appended padded keys got weight"
    torch.testing.assert_close(out_padded[..., :length, :].masked_select(real), out_plain.masked_select(real), atol=1e-9, rtol=1e-7)
    assert_same_terms(padded, plain)
    # the fused path (what transformer hosts take) too
    fused_padded, fused_result = _run(kernel, q, k, v, groups, need_weights=False)
    fused_plain, fused_plain_result = _run(kernel, p.q, p.k, p.v, p.dense, need_weights=False)
    torch.testing.assert_close(fused_padded[..., :length, :].masked_select(real), fused_plain.masked_select(real), atol=1e-9, rtol=1e-7)
    for key in fused_plain_result.aux_losses:
        torch.testing.assert_close(fused_result.aux_losses[key], fused_plain_result.aux_losses[key], atol=1e-9, rtol=1e-7)


def _node_inputs(p):
    return p.nodes(p.q), p.nodes(p.k), p.nodes(p.v)


def check_isolated_nodes(name: str, config: dict | None = None, train: bool = True) -> None:
    p = make_problem()
    kernel = perturbed_kernel(name, config or {}, AttentionSite("graph")).train(train)
    hold_noise_fixed(kernel)
    q, k, v = _node_inputs(p)
    nodes = q.shape[0]
    grown = [torch.cat([x, 25.0 * torch.randn(PADDING, *x.shape[1:], dtype=x.dtype)]) for x in (q, k, v)]
    groups = SegmentGroups(p.segment.dst, p.segment.src, nodes + PADDING)
    out_grown, grown_result = _run(kernel, *grown, groups)
    out_plain, plain = _run(kernel, q, k, v, p.segment)
    torch.testing.assert_close(grown_result.weights, plain.weights, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(p.real_nodes(out_grown[:nodes]), p.real_nodes(out_plain), atol=1e-9, rtol=1e-7)
    assert_same_terms(grown_result, plain)


def check_second_graph(name: str, config: dict | None = None, train: bool = True) -> None:
    """The second graph is a copy (same features, same noise), so batch means must not move either."""
    p = make_problem()
    kernel = perturbed_kernel(name, config or {}, AttentionSite("graph")).train(train)
    hold_noise_fixed(kernel)
    q, k, v = _node_inputs(p)
    nodes, edges = q.shape[0], p.segment.dst.numel()
    out_plain, plain = _run(kernel, q, k, v, p.segment)  # first: its noise is the master, repeated for the copy
    batch = SegmentGroups(torch.cat([p.segment.dst, p.segment.dst + nodes]), torch.cat([p.segment.src, p.segment.src + nodes]), 2 * nodes)
    out_batch, batch_result = _run(kernel, *(torch.cat([x, x]) for x in (q, k, v)), batch)
    torch.testing.assert_close(batch_result.weights[:edges], plain.weights, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(p.real_nodes(out_batch[:nodes]), p.real_nodes(out_plain), atol=1e-9, rtol=1e-7)
    assert_same_terms(batch_result, plain)


def check_padding_invariance(name: str, config: dict | None = None) -> None:
    """Padded tokens, isolated nodes and a second graph in the batch leave the real entries unchanged."""
    for check in (check_dense_padding, check_isolated_nodes, check_second_graph):
        for train in (True, False):
            try:
                check(name, config, train)
            except AssertionError as exc:
                raise AssertionError(f"{check.__name__.removeprefix('check_').replace('_', ' ')} "
                                     f"({'train' if train else 'eval'}): {exc}") from exc


# ---- bf16 autocast ---------------------------------------------------------------------------------------
# Errors are measured against float64 on the inputs the kernel actually received (tests/attention/
# test_precision.py's docstring says why); the logits are peaky (std ~3), where bf16 Newton tolerances,
# Hessians and samplers break. CPU autocast stands in for CUDA's.

BF16_HEADS, BF16_DIM, BF16_LENGTH = 2, 8, 12
PEAKINESS = 3.0  # q and k scaled so the logits have std ~3
RELATIVE_TO_SOFTMAX = 2.0
"""Allowed relative error: a small multiple of softmax's on the same problem, plus FLOOR, a bf16 ulp or two
(softmax's own error can be near 0 where nothing in its path rounds, e.g. segment scores from fp32 inputs)."""
FLOOR = 8e-3
AUX_TOLERANCE = 2e-2


def bf16_problem(layout: str):
    p = make_problem(batch=2, heads=BF16_HEADS, length=BF16_LENGTH, dim=BF16_DIM)
    q, k, v = p.q * PEAKINESS, p.k * PEAKINESS, p.v
    if layout == "dense":
        return (q, k, v), p.dense, AttentionSite("text", "self", sequence=True)
    return (p.nodes(q), p.nodes(k), p.nodes(v)), p.segment, AttentionSite("graph")


def fixed_noise(kernel: AttentionKernel) -> None:
    """The same float64 noise for every precision, cast to the dtype the kernel asks it in: a kernel that
    samples in bf16 gets bf16 noise (8 bits), which is the failure this catches."""
    masters: dict[tuple, torch.Tensor] = {}

    def draw_noise(like: torch.Tensor, distribution: str = "uniform") -> torch.Tensor:
        key = (distribution, tuple(like.shape))
        if key not in masters:
            g = torch.Generator().manual_seed(5)
            draw = torch.rand if distribution == "uniform" else torch.randn
            masters[key] = draw(like.shape, generator=g, dtype=torch.float64)
        return masters[key].to(like.dtype)

    kernel.draw_noise = draw_noise


def forward_backward(kernel, inputs, groups, cotangent, autocast: bool):
    """Output, input gradients and aux losses (all float64) of sum(out * cotangent) + sum(aux)."""
    fixed_noise(kernel)
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, result = kernel(*inputs, groups)
        loss = (out.double() * cotangent).sum() + sum(a.double() for a in result.aux_losses.values())
    loss.backward()
    tensors = [out.detach().double()] + [x.grad.double() for x in inputs]
    return tensors, {key: a.detach().double() for key, a in result.aux_losses.items()}


def bf16_cotangent(inputs) -> torch.Tensor:
    return torch.randn(inputs[0].shape[:-1] + (inputs[2].shape[-1],), generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def relative_errors(name: str, config: dict, layout: str, train: bool, kernel: AttentionKernel | None = None):
    """Per input mode: the largest relative error over output and input gradients, and the aux losses'."""
    inputs, groups, site = bf16_problem(layout)
    if kernel is None:
        torch.manual_seed(0)
        kernel = build_attention({"name": name, **config}, num_heads=BF16_HEADS, head_dim=BF16_DIM, site=site)
    kernel.train(train)
    reference_kernel = copy.deepcopy(kernel).double()
    cotangent = bf16_cotangent(inputs)
    errors = {}
    for mode in ("fp32-inputs", "bf16-inputs"):
        given = [x.float() if mode == "fp32-inputs" else x.bfloat16() for x in inputs]
        expected, expected_aux = forward_backward(copy.deepcopy(reference_kernel), [x.double() for x in given], groups, cotangent, False)
        got, got_aux = forward_backward(kernel, given, groups, cotangent, True)
        assert all(torch.isfinite(t).all() for t in got), f"{name} {mode}: non-finite output or gradient"
        worst = max(float((g - e).norm() / e.norm().clamp_min(1e-12)) for g, e in zip(got, expected, strict=True))
        aux = {key: float((got_aux[key] - e).abs() / e.abs().clamp_min(1e-6)) for key, e in expected_aux.items()}
        errors[mode] = (worst, aux)
    return errors


def softmax_bf16_errors() -> dict:
    return {(layout, train): relative_errors("softmax", {}, layout, train) for layout in ("dense", "segment") for train in (False, True)}


def check_bf16_autocast(name: str, config: dict | None = None, layouts=("dense", "segment"), softmax_errors: dict | None = None) -> None:
    """Forward and backward under bf16 autocast, on float32 and on bf16 inputs, err no more than softmax does."""
    config = config or {}
    softmax_errors = softmax_errors or softmax_bf16_errors()
    modes = (False, True) if build_attention({"name": name, **config}, num_heads=BF16_HEADS, head_dim=BF16_DIM).stochastic else (False,)
    for layout in layouts:
        for train in modes:
            for mode, (worst, aux) in relative_errors(name, config, layout, train).items():
                baseline = softmax_errors[(layout, train)][mode][0]
                assert worst <= RELATIVE_TO_SOFTMAX * baseline + FLOOR, (
                    f"{name}{config or ''} {layout} {'train' if train else 'eval'} {mode}: relative error {worst:.3g} under bf16 "
                    f"autocast vs softmax's {baseline:.3g} (allowed {RELATIVE_TO_SOFTMAX:g}x + {FLOOR:g}). What to change: compute the "
                    f"map in float32 inside `normalize` (`with torch.autocast(logits.device.type, enabled=False):` around it, on "
                    f"`logits.float()`, returning weights in the logits' dtype), as the built-in sparse maps do; if it already does, "
                    f"the map sharpens the bf16 rounding of the logits it receives (a temperature below 1 multiplies that error by "
                    f"1/T, a learned scale alike): keep its default in the range where it is no sharper than softmax, or run it "
                    f"with `--precision 32`")
                for key, error in aux.items():
                    assert error <= AUX_TOLERANCE, f"{name} {layout} {mode}: aux loss {key} relative error {error:.3g}"


# ---- what `attnbench check` runs -------------------------------------------------------------------------

PROPERTIES: dict[str, Callable[[str], None]] = {
    "softmax limit": check_softmax_limit,
    "padding invariance": check_padding_invariance,
    "bf16 autocast": check_bf16_autocast,
    "gradients": check_gradients,
    "dense equals segment": check_dense_equals_segment,
}


@dataclass(frozen=True)
class Outcome:
    variant: str
    prop: str
    status: str
    """"pass", "FAIL" or "n/a" (a property the variant does not declare)."""
    detail: str = ""


def check_variant(name: str) -> list[Outcome]:
    """Every property of PROPERTIES on one registered variant; an exception other than AssertionError (the
    variant crashed) is a failure too, named by its type."""
    outcomes = []
    for prop, check in PROPERTIES.items():
        if check is check_softmax_limit and not has_reachable_limit(name):
            declared = attention_entry(name).cls.softmax_limit
            outcomes.append(Outcome(name, prop, "n/a", "no softmax_limit declared" if declared is None else "fixed by the name's preset"))
            continue
        try:
            check(name)
        except Exception as exc:  # noqa: BLE001 - any crash of a plugin's code is its failure, reported, not raised
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            outcomes.append(Outcome(name, prop, "FAIL", f"{type(exc).__name__}: {first}"[:300]))
        else:
            outcomes.append(Outcome(name, prop, "pass"))
    return outcomes


def format_outcomes(outcomes: list[Outcome]) -> str:
    width = max((len(o.variant) for o in outcomes), default=0)
    return "\n".join(f"{o.variant:<{width}}  {o.prop:<22} {o.status}{f'  ({o.detail})' if o.detail else ''}" for o in outcomes)

