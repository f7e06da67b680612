"""The contract every attention variant keeps (DESIGN.md section 6.2), as checks a variant's author can run
on their own file: `attnbench check my_variant.py` runs them on each variant the file registers, and the tests
(tests/attention/test_contract.py, test_causal.py, test_precision.py, test_query_blocks.py and
tests/modules/test_mechanism_diagnostics.py) run the same functions on every registered variant: one copy of
the logic, so the command can never check less than the test suite does, with the same tolerances.

Each check takes a variant name (and optional config) and raises AssertionError naming what broke; `PROPERTIES`
lists the ones `check` runs, in its order, and `skip_reason` says where one cannot run for a variant (no declared
softmax limit, not row-separable, no mechanism declared): `check` reports that property skipped with the reason,
never passed. The checks raise with explicit messages rather than bare asserts: pytest rewrites asserts only in
test files, and `check`'s user must read what broke."""

from __future__ import annotations

import copy
import math
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


def assert_distribution(weights: torch.Tensor, groups, valid: torch.Tensor | None = None, tolerance: float = 1e-6) -> None:
    """Each real query's weights are a distribution over its keys: finite, non-negative, summing to 1 within
    `tolerance`, and exactly 0 on the keys `valid` masks out (dense padding, a causal future). The mask first: a
    map that ignores it also leaves the unmasked keys' sum short of 1, and the mask is then what to fix."""
    weights = weights.detach()
    if not torch.isfinite(weights).all():
        _fail(f"{int((~torch.isfinite(weights)).sum())} weights are not finite")
    if (weights < 0).any():
        _fail(f"weights go negative (smallest {float(weights.min()):.3g}): a distribution has none")
    if valid is not None:
        leaked = weights.masked_select(~valid.expand_as(weights))
        if (leaked != 0).any():
            _fail(f"masked keys get weight (up to {float(leaked.abs().max()):.3g}): a key the groups mask out (padding, "
                  f"a causal future) must get exactly 0; normalise with `groups.softmax` / `groups.normalize`, which know the mask")
    sums = groups.reduce(weights, "sum")
    if groups.valid_queries is not None:  # nodes without edges (padded tokens' twins) have no distribution
        sums = sums[groups.valid_queries.expand_as(sums)]
    off = float((sums - 1).abs().max()) if sums.numel() else 0.0
    if off > tolerance:
        _fail(f"a query's weights sum to {float(sums.flatten()[(sums - 1).abs().argmax()]):.6g}, not 1 (off by up to {off:.3g}, "
              f"allowed {tolerance:g})")


def check_weights_are_distributions(name: str, config: dict | None = None) -> None:
    """Dense (the last sequence padded) and segment, in training and evaluation: each query's weights are a
    distribution (`assert_distribution`) and padded keys get exactly 0."""
    p = make_problem()
    for train in (True, False):
        kernel = kernel_for(name, **(config or {})).train(train)
        mode = "train" if train else "eval"
        for layout, weights, groups, valid in (("dense", lambda: dense_weights(kernel, p).weights, p.dense, p.dense.valid),
                                               ("segment", lambda: segment_weights(kernel, p).weights, p.segment, None)):
            try:
                assert_distribution(weights(), groups, valid)
            except AssertionError as exc:
                raise AssertionError(f"{layout} ({mode}): {exc}") from exc


CAUSAL_LENGTH = 6


def check_causal_mask(name: str, config: dict | None = None) -> None:
    """Under causal groups (a decoder's self-attention, right-padded prompts), in training and evaluation: the
    weights are distributions over the past only, and a query's output does not move when a future token does."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, HEADS, CAUSAL_LENGTH, DIM, generator=g, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(2, CAUSAL_LENGTH, dtype=torch.bool)
    valid[1, -2:] = False
    groups = DenseGroups.from_key_padding(valid, causal=True, query_valid=valid)
    past = torch.ones(CAUSAL_LENGTH, CAUSAL_LENGTH, dtype=torch.bool).tril()
    for train in (True, False):
        mode = "train" if train else "eval"
        torch.manual_seed(0)
        kernel = build_attention({"name": name, **(config or {})}, num_heads=HEADS, head_dim=DIM, site=TEXT_SITE).double().train(train)
        torch.manual_seed(1)
        out, result = kernel(q, k, v, groups, scale=SCALE, need_weights=True)
        weights = result.weights
        try:
            if (weights[..., ~past] != 0).any():
                _fail(f"future keys get weight (up to {float(weights[..., ~past].abs().max()):.3g})")
            assert_distribution(weights, groups, past & valid[:, None, None, :])
        except AssertionError as exc:
            raise AssertionError(f"causal ({mode}): {exc}") from exc
        # the last real token of the first sequence changes: every earlier query's output stays
        k2, v2 = k.clone(), v.clone()
        k2[0, :, -1] += 3.0
        v2[0, :, -1] -= 2.0
        torch.manual_seed(1)
        moved, _ = kernel(q, k2, v2, groups, scale=SCALE, need_weights=True)
        for what, got, expected in (("earlier queries' outputs", moved[0, :, :-1], out[0, :, :-1]), ("the other sequence's outputs", moved[1], out[1])):
            try:
                torch.testing.assert_close(got, expected, atol=1e-7, rtol=0)
            except AssertionError as exc:
                raise AssertionError(f"causal ({mode}): {what} moved when a future token changed: {exc}") from exc


def check_fused_path(name: str, config: dict | None = None) -> None:
    """need_weights=False (what transformer hosts pass) may take a fused path, never other math."""
    p = make_problem()
    kernel = kernel_for(name, **(config or {})).eval()
    with_weights, _ = kernel(p.q, p.k, p.v, p.dense, scale=SCALE, need_weights=True)
    fused, _ = kernel(p.q, p.k, p.v, p.dense, scale=SCALE, need_weights=False)
    valid = p.key_valid[:, None, :, None].expand_as(fused)  # padded query rows are free to differ
    torch.testing.assert_close(fused[valid], with_weights[valid], atol=1e-6, rtol=1e-5,
                               msg=lambda text: f"need_weights=False gives another output than need_weights=True: {text}")


def check_terms(name: str, config: dict | None = None) -> None:
    """Aux losses are finite scalars, diagnostics detached finite scalars (dense and segment, train and eval),
    and every aux loss returned in training has a finite non-negative weight in `loss_weights` at every step."""
    p = make_problem()
    kernel = kernel_for(name, **(config or {}))
    returned = set()
    for train in (True, False):
        kernel.train(train)
        for result in (dense_weights(kernel, p), segment_weights(kernel, p)):
            for key, value in result.aux_losses.items():
                if value.dim() != 0 or not torch.isfinite(value):
                    _fail(f"aux loss {key} must be a finite scalar, got shape {tuple(value.shape)}")
                if train:
                    returned.add(key)
            for key, value in result.diagnostics.items():
                if value.dim() != 0 or value.requires_grad or not torch.isfinite(value):
                    _fail(f"diagnostic {key} must be a detached finite scalar (shape {tuple(value.shape)}, "
                          f"requires_grad {value.requires_grad})")
    # an annealed weight may be 0 at some steps, but every term needs an entry
    for step in (0, 1, 10_000):
        weights = kernel.loss_weights(step, epoch=step)
        if not returned <= set(weights):
            _fail(f"aux losses {sorted(returned - set(weights))} have no entry in loss_weights (step {step})")
        bad = {k: w for k, w in weights.items() if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0)}
        if bad:
            _fail(f"loss_weights at step {step} must be finite non-negative numbers: {bad}")


def check_config(name: str, config: dict | None = None) -> None:
    """The config is a frozen dataclass, and the knobs its `suggest` proposes to Optuna are its own fields and build."""
    import dataclasses

    import optuna

    from .registry import suggest_config

    built = kernel_for(name, **(config or {})).config
    fields = [f.name for f in dataclasses.fields(built)]
    if fields:
        try:
            setattr(built, fields[0], None)
        except dataclasses.FrozenInstanceError:
            pass
        else:
            _fail(f"the config is not frozen (@dataclass(frozen=True)): {fields[0]} could be set")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    suggested = suggest_config(name, trial)
    if not set(suggested) <= set(fields):
        _fail(f"suggest proposes {sorted(set(suggested) - set(fields))}, which are not fields of its config")
    build_attention({"name": name, **(config or {}), **suggested}, num_heads=HEADS, head_dim=DIM)


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


# ---- query blocks (row-separable variants) ---------------------------------------------------------------

def held_noise(like: torch.Tensor, distribution: str = "uniform") -> torch.Tensor:
    """A stochastic kernel's noise as a function of the value it perturbs: the same for a row whether the call
    runs whole or in query blocks (which draw in another order), so that the two can be compared."""
    precise = torch.promote_types(like.dtype, torch.float32)
    u = torch.frac(torch.sin(like.detach().to(precise) * 12.9898 + 0.5) * 43758.5453).clamp(1e-6, 1 - 1e-6).to(like.dtype)
    return u if distribution == "uniform" else torch.erfinv(2 * u - 1) * math.sqrt(2)


BLOCK_LENGTH, BLOCK_ROWS = 7, 3
"""Blocks of 3, 3 and 1 queries over 7."""


def _block_groups(kind: str, key_valid: torch.Tensor) -> DenseGroups:
    if kind == "padded":
        return DenseGroups.from_key_padding(key_valid, query_valid=key_valid)
    if kind == "causal":
        return DenseGroups.from_key_padding(key_valid, causal=True, query_valid=key_valid)
    return DenseGroups()


def blocked_call(kernel, p: Problem, groups, rows: int | None, with_aux: bool = True):
    from .kernel import query_blocks

    q, k, v = (t.clone().requires_grad_() for t in (p.q, p.k, p.v))
    with query_blocks(rows):
        out, result = kernel(q, k, v, groups, scale=SCALE, need_weights=False)
    path = kernel.last_path
    loss = out.square().sum() + (sum(result.aux_losses.values(), out.new_zeros(())) if with_aux else 0)
    params = [t for t in kernel.parameters() if t.requires_grad]
    grads = torch.autograd.grad(loss, [q, k, v, *params], allow_unused=True)
    return path, out, result, grads


def check_query_blocks(name: str, config: dict | None = None, modes=(True, False), kinds=("padded", "causal", "unmasked")) -> None:
    """A row-separable variant's eager call run in query blocks (kernel.py `query_block_rows`, each block recomputed
    in the backward) computes the whole call: output, gradients of q, k, v and the kernel's parameters, aux losses
    and diagnostics, under padded, causal and unmasked groups, in training and evaluation."""
    p = make_problem(length=BLOCK_LENGTH)
    for train in modes:
        for kind in kinds:
            where = f"{kind} ({'train' if train else 'eval'})"
            kernel = kernel_for(name, **(config or {})).train(train)
            kernel.draw_noise = held_noise
            groups = _block_groups(kind, p.key_valid)
            whole_path, whole, whole_result, whole_grads = blocked_call(kernel, p, groups, None)
            blocked_path, blocked, blocked_result, blocked_grads = blocked_call(kernel, p, groups, BLOCK_ROWS)
            if blocked_path != "blocked" or whole_path == "blocked":
                _fail(f"{where}: query_blocks({BLOCK_ROWS}) took path {blocked_path!r} (whole call: {whole_path!r}); "
                      f"a row_separable kernel must run in blocks when they are asked for")
            if blocked_result.weights is not None:
                _fail(f"{where}: a blocked call must not return the whole weights")
            torch.testing.assert_close(blocked, whole, atol=1e-10, rtol=1e-8, msg=lambda text: f"{where}: output: {text}")
            for index, (a, b) in enumerate(zip(blocked_grads, whole_grads)):
                if (a is None) != (b is None):
                    _fail(f"{where}: gradient {index} is None in one call only")
                if b is not None:
                    torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8, msg=lambda text: f"{where}: gradient {index}: {text}")
            for what, found, expected in (("aux losses", blocked_result.aux_losses, whole_result.aux_losses),
                                          ("diagnostics", blocked_result.diagnostics, whole_result.diagnostics)):
                if found.keys() != expected.keys():
                    _fail(f"{where}: {what} {sorted(found)} in blocks, {sorted(expected)} whole")
                for key in expected:
                    torch.testing.assert_close(found[key], expected[key], atol=1e-10, rtol=1e-8, msg=lambda text: f"{where}: {what} {key}: {text}")


# ---- mechanism diagnostics -------------------------------------------------------------------------------

def check_mechanism_diagnostics(name: str, config: dict | None = None) -> None:
    """The declared mechanism diagnostics are well formed (each a MechanismDiagnostic with its meaning, names
    unique, `mechanism_rule` 'any' or 'all'), the kernel reports every one it computes itself, in training and
    evaluation (in training those the declaration says it measures there, `in_training`), and none while they are off."""
    from .kernel import MechanismDiagnostic, mechanism_diagnostics

    cls = attention_entry(name).cls
    if not cls.mechanism:
        _fail("declares no mechanism diagnostic")
    malformed = [d for d in cls.mechanism if not (isinstance(d, MechanismDiagnostic) and d.meaning)]
    if malformed:
        _fail(f"every entry of `mechanism` must be a MechanismDiagnostic with its meaning: {malformed}")
    if cls.mechanism_rule not in ("any", "all"):
        _fail(f"mechanism_rule must be 'any' or 'all', got {cls.mechanism_rule!r}")
    names = [d.name for d in cls.mechanism]
    if len(set(names)) != len(names):
        _fail(f"mechanism diagnostics must have unique names: {names}")
    p = make_problem()
    kernel = kernel_for(name, **(config or {}))
    for train in (True, False):
        result = segment_weights(kernel.train(train), p)
        # graph site: self-attention; the host computes loss shares, the kernel the rest
        reported = {d.name for d in cls.mechanism if d.loss_share is None and (d.in_training or not train)}
        if not reported <= set(result.diagnostics):
            _fail(f"({'train' if train else 'eval'}) did not report {sorted(reported - set(result.diagnostics))}")
    with mechanism_diagnostics(False):
        result = segment_weights(kernel.train(), p)
    computed_while_off = {d.name for d in cls.mechanism if d.name != "sample_tv"} & set(result.diagnostics)
    if computed_while_off:
        _fail(f"computed {sorted(computed_while_off)} in training while mechanism diagnostics were off")


# ---- what `attnbench check` runs -------------------------------------------------------------------------

PROPERTIES: dict[str, Callable[[str], None]] = {
    "weights are distributions": check_weights_are_distributions,
    "causal mask": check_causal_mask,
    "softmax limit": check_softmax_limit,
    "padding invariance": check_padding_invariance,
    "dense equals segment": check_dense_equals_segment,
    "fused path": check_fused_path,
    "gradients": check_gradients,
    "bf16 autocast": check_bf16_autocast,
    "aux losses and diagnostics": check_terms,
    "config": check_config,
    "query blocks": check_query_blocks,
    "mechanism diagnostics": check_mechanism_diagnostics,
}
"""Every property the test suite checks of each built-in variant, in `check`'s order. The suite checks some at
extra configs of particular built-ins too (gmm's iterative paths, BAM's fixed prior); `check` runs a plugin's
defaults."""

PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"


def skip_reason(name: str, prop: str) -> str | None:
    """Why `prop` cannot run for variant `name` (reported skipped, never passed); None when it runs."""
    cls = attention_entry(name).cls
    if prop == "softmax limit" and not has_reachable_limit(name):
        return ("no softmax_limit declared: set it to the config at which the variant is softmax (the test suite "
                "requires it of every built-in but softmax)") if cls.softmax_limit is None else "its limit is fixed by the name's preset"
    if prop == "query blocks" and not getattr(cls, "row_separable", False):
        return "not row_separable: its calls are never split into query blocks"
    if prop == "mechanism diagnostics" and not cls.mechanism:
        return ("no `mechanism` declared: boards and claims cannot tell whether its idea is at work (every built-in "
                "declares one; docs/guides/adding-a-variant.md)")
    return None


@dataclass(frozen=True)
class Outcome:
    variant: str
    prop: str
    status: str
    """PASS, FAIL or SKIPPED (a property that cannot run for the variant; `detail` says why)."""
    detail: str = ""


def check_variant(name: str) -> list[Outcome]:
    """Every property of PROPERTIES on one registered variant; an exception other than AssertionError (the
    variant crashed) is a failure too, named by its type."""
    outcomes = []
    for prop, check in PROPERTIES.items():
        reason = skip_reason(name, prop)
        if reason is not None:
            outcomes.append(Outcome(name, prop, SKIPPED, reason))
            continue
        try:
            check(name)
        except Exception as exc:  # noqa: BLE001 - any crash of a plugin's code is its failure, reported, not raised
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            outcomes.append(Outcome(name, prop, FAIL, f"{type(exc).__name__}: {first}"[:300]))
        else:
            outcomes.append(Outcome(name, prop, PASS))
    return outcomes


def format_outcomes(outcomes: list[Outcome]) -> str:
    width = max((len(o.variant) for o in outcomes), default=0)
    prop_width = max((len(o.prop) for o in outcomes), default=0)
    return "\n".join(f"{o.variant:<{width}}  {o.prop:<{prop_width}}  {o.status}{f'  ({o.detail})' if o.detail else ''}" for o in outcomes)
