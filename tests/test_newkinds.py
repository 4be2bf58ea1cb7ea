"""The primitive kinds TAKE, SELECT, MAX_GRAD, DROPOUT_MASK, STEP: exact semantics and their VJPs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from vtrain.errors import GraphError
from vtrain.graph.executor import StepExecutor
from vtrain.graph.fp64 import evaluate_fp64
from vtrain.graph.generated import dropout_uniforms
from vtrain.graph.step_graph import GraphBuilder, OpKind, T, f32_bits

SEED = bytes(range(32))


def _run(g: GraphBuilder, out: T, data: np.ndarray | None = None, step: int = 1, seed: bytes = SEED):
    """Execute a state-free graph (certified mode) and return ``out``'s value."""
    if data is None:
        g.data((1,))
        data = np.zeros((1,), np.float32)
    graph = g.build(out)
    res = StepExecutor(graph, "certified", seed=seed).run([], torch.from_numpy(data), keep_trace=True, step=step)
    return res.trace[out.op].numpy()


def test_take_copies_and_zeroes_invalid_indices() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    idx = np.array([[4, 0, -1], [2.5, 5, 1]], np.float32)
    g = GraphBuilder()
    out = g.take(g.const(x), g.const(idx), axis=1)
    got = _run(g, out)
    assert got.shape == (2, 2, 3, 3)
    for a in range(2):
        for i in range(2):
            for j in range(3):
                k = idx[i, j]
                want = x[a, int(k)] if k == int(k) and 0 <= k < 5 else np.zeros(3, np.float32)
                assert np.array_equal(got[a, i, j], want)
    assert not np.signbit(got[0, 0, 2]).any()


def test_select_broadcasts_and_copies() -> None:
    g = GraphBuilder()
    cond = np.array([[1.0], [0.0]], np.float32)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((1, 3), -7.0, np.float32)
    got = _run(g, g.select(g.const(cond), g.const(a), g.const(b)))
    assert np.array_equal(got, np.where(cond != 0, a, b))


def test_max_grad_routes_to_first_maximum() -> None:
    g = GraphBuilder()
    x = np.array([[1.0, 3.0, 3.0, 0.0], [-1.0, -2.0, -1.0, -5.0]], np.float32)
    gr = np.array([[2.5], [-4.0]], np.float32)
    got = _run(g, g.max_grad(g.const(x), g.const(gr)))
    assert np.array_equal(got, np.array([[0, 2.5, 0, 0], [-4.0, 0, 0, 0]], np.float32))


def test_dropout_mask_follows_the_hash_rule() -> None:
    p = 0.25
    g = GraphBuilder()
    g.dropout_mask((3, 5), 0.5)  # salt 0
    m = g.dropout_mask((3, 5), p)  # salt 1
    node = g.ops[m.op]
    assert node.kind == OpKind.DROPOUT_MASK and node.attrs == (round(p * 2**32), f32_bits(1 / (1 - p)), 1)
    got = _run(g, m, step=7)
    for i in range(15):
        d = hashlib.sha256(SEED + (7).to_bytes(8, "big") + (1).to_bytes(4, "big") + i.to_bytes(8, "big")).digest()
        keep = int.from_bytes(d[:4], "big") >= round(p * 2**32)
        assert got.reshape(-1)[i] == (np.float32(1 / (1 - p)) if keep else 0.0)
    assert not np.array_equal(got, _run(_fresh_mask(p), T(1, (3, 5)), step=8))  # another step, another mask
    frac = (dropout_uniforms(SEED, 3, 0, 20_000) < round(p * 2**32)).mean()
    assert abs(frac - p) < 0.02


def _fresh_mask(p: float) -> GraphBuilder:
    g = GraphBuilder()
    g.dropout_mask((3, 5), 0.5)
    g.dropout_mask((3, 5), p)
    return g


def test_step_op_and_its_errors() -> None:
    g = GraphBuilder()
    s = g.step()
    assert _run(g, s, step=12).tolist() == [12.0]
    g2 = GraphBuilder()
    s2 = g2.step()
    g2.data((1,))
    with pytest.raises(GraphError, match="step number"):
        StepExecutor(g2.build(s2)).run([], torch.zeros(1), keep_trace=True)
    with pytest.raises(GraphError, match="drop probability"):
        GraphBuilder().dropout_mask((2,), 1.0)


def _grad_check(build, x0: np.ndarray, torch_fn) -> None:
    """The graph's VJP of ``build(g, x)`` (summed against a random cotangent) equals torch's, FP64."""
    g = GraphBuilder()
    x = g.input("x", x0.shape)
    g.data((1,))
    y = build(g, x)
    w = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    flat = g.reshape(g.mul(y, g.const(w)), (1, int(np.prod(y.shape))))
    loss = g.sum(flat)
    (gx,) = g.grad(loss, [x])
    graph = g.build(loss)
    vals = evaluate_fp64(graph, [torch.from_numpy(x0).double()], torch.zeros(1, dtype=torch.float64))
    xt = torch.from_numpy(x0).double().requires_grad_(True)
    (torch_fn(xt) * torch.from_numpy(w).double()).sum().backward()
    assert torch.allclose(vals[gx.op], xt.grad, rtol=1e-12, atol=1e-12)


def test_take_vjp_const_table_and_data_index() -> None:
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((3, 6, 2)).astype(np.float32)
    idx = np.array([[0, 2, 2], [5, -1, 0], [2, 2, 1]], np.float32)  # repeats and padding
    it = torch.from_numpy(idx)

    def ref(t):
        safe = torch.where(it >= 0, it, torch.zeros(())).long()
        out = t[:, safe, :]
        return out * (it >= 0).double()[None, :, :, None]

    _grad_check(lambda g, x: g.take(x, g.const(idx), 1), x0, ref)

    def data_take(g, x):  # an index that is not a CONST (computed): the ONE_HOT matmul VJP
        return g.take(x, g.add_s(g.const(idx), 0.0), 1)

    _grad_check(data_take, x0, ref)


def test_select_and_max_vjps() -> None:
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((4, 5)).astype(np.float32)
    cond = (rng.random((4, 1)) > 0.5).astype(np.float32)
    ct = torch.from_numpy(cond) != 0
    _grad_check(lambda g, x: g.select(g.const(cond), x, g.mul_s(x, 2.0)), x0,
                lambda t: torch.where(ct, t, 2 * t))
    _grad_check(lambda g, x: g.max(x, differentiable=True), x0, lambda t: t.amax(-1, keepdim=True))
