"""Packed operands (codegen/rewrite/operands.py): a contraction whose operand is computed
(a convolution of ``relu(conv + b)``, a weight gradient of a masked head) runs as
a GEMM over a packed stage, with the values of the loop nest it replaces --
against the evaluator (finite and non-finite inputs), finite differences and
PyTorch."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.codegen.analysis import contraction
from texpr.codegen.rewrite.operands import PACKED, pack_operands
from texpr.testing import numeric_gradient

from fuzz import every_contraction_on_blas as blas_at_any_size  # the cost rule off

nn = te.nn


def _block(dtype="float64"):
    """conv -> bias -> relu -> conv -> sum(out * H): the CNN block whose second
    convolution reads relu(conv0 + b) (the simplifier lifts the relu's select
    into that convolution's where)."""
    X = te.placeholder((2, 3, 6, 6), "X", dtype)
    W0 = te.placeholder((4, 3, 3, 3), "W0", dtype)
    b0 = te.placeholder((4,), "b0", dtype)
    W1 = te.placeholder((5, 4, 3, 3), "W1", dtype)
    H = te.placeholder((2, 5, 6, 6), "H", dtype)
    h = nn.relu(nn.conv2d(X, W0, b0, padding=1, name="conv0"), name="relu0")
    y = nn.conv2d(h, W1, padding=1, name="conv1")
    n, c, i, j = (te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij"))
    L = te.compute((), lambda: te.sum(y[n, c, i, j] * H[n, c, i, j], axis=[n, c, i, j]),
                   name="L")
    return L, [X, W0, b0, W1, H]


def _feed(ins, seed=0):
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(t.shape) for t in ins}


def test_the_second_convolution_reads_a_packed_relu():
    L, ins = _block()
    X, W0, b0, W1, H = ins
    grads = list(te.differentiate(L, [W0, W1]).result)
    outs = simplify.simplify([L] + grads)
    with blas_at_any_size():
        packed_outs, packed = pack_operands(outs)
    names = sorted(op.name for op in packed)
    # relu(conv0 + b0): read by conv1 and by W1's gradient, packed once
    assert any(n.startswith("conv1_packed") for n in names), names
    relus = [op for op in packed if "conv0_b" in str(op.body[0]) or
             any(t.name == "b0" for t in op.input_tensors())]
    assert len(relus) == 1
    from texpr.tensor import topo_order
    rewritten = [op for op in topo_order(packed_outs) if getattr(op, "attrs", {}).get(PACKED)]
    assert rewritten and all(contraction.match(op) is not None for op in rewritten)
    feed = _feed(ins)
    for a, b in zip(te.evaluate(packed_outs, feed), te.evaluate(outs, feed)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def block_kernel():
    L, ins = _block()
    X, W0, b0, W1, H = ins
    grads = list(te.differentiate(L, [X, W0, b0, W1]).result)
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    return kernel, L, grads, ins


def test_packed_gemms_match_the_evaluator_and_finite_differences(block_kernel):
    kernel, L, grads, ins = block_kernel
    blas = {u.stage for u in kernel.units if u.kind == "blas"}
    assert "conv1" in blas, [(u.stage, u.kind) for u in kernel.units]
    assert any(u.stage.startswith("conv1_packed") for u in kernel.units)
    feed = _feed(ins, 1)
    got = kernel(*[feed[t] for t in ins])
    want = te.evaluate([L] + grads, feed)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    X, W0, b0, W1, H = ins
    for t, g in zip([X, W0, b0, W1], got[1:]):
        np.testing.assert_allclose(g, numeric_gradient(L, t, feed), rtol=1e-5, atol=1e-6)


def test_packed_gemms_match_pytorch(block_kernel):
    torch = pytest.importorskip("torch")
    kernel, L, grads, ins = block_kernel
    feed = _feed(ins, 2)
    got = kernel(*[feed[t] for t in ins])
    tx, tw0, tb0, tw1 = (torch.tensor(feed[t], requires_grad=True) for t in ins[:4])
    y = torch.nn.functional.conv2d(torch.relu(torch.nn.functional.conv2d(tx, tw0, tb0, padding=1)),
                                   tw1, padding=1)
    loss = (y * torch.tensor(feed[ins[4]])).sum()
    loss.backward()
    np.testing.assert_allclose(got[0], loss.item(), rtol=1e-10)
    for g, t in zip(got[1:], (tx, tw0, tb0, tw1)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("where", ["inactive", "active", "nan"])
def test_non_finite_weights_give_the_loop_nests_values(block_kernel, where):
    # a term the relu masks is absent (the simplified graph never visits it), not
    # 0 * inf: an infinite weight at a tap whose inputs the relu zeroes leaves the
    # output finite; where the relu is active it gives the infinity (or NaN)
    kernel, L, grads, ins = block_kernel
    X, W0, b0, W1, H = ins
    feed = _feed(ins, 3)
    if where == "inactive":
        feed[b0] = np.full(4, -100.0)  # relu0 is zero everywhere
    feed[W1] = feed[W1].copy()
    feed[W1][1, 2, 0, 1] = np.nan if where == "nan" else np.inf
    got = kernel(*[feed[t] for t in ins])
    want = te.evaluate(simplify.simplify([L] + grads), feed)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w))
        ok = np.isfinite(w)
        np.testing.assert_allclose(g[ok], w[ok], rtol=1e-10, atol=1e-10)
    if where == "inactive":
        assert np.isfinite(got[0])


def test_a_stage_already_a_contraction_is_kept():
    X = te.placeholder((8, 6), "X")
    W = te.placeholder((5, 6), "W")
    k = te.reduce_axis(6, "k")
    Y = te.compute((8, 5), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    with blas_at_any_size():
        (Y2,), packed = pack_operands([Y])
    assert Y2 is Y and packed == []


def test_gradients_through_a_max_pool_pack_the_pooled_head():
    # conv -> relu -> conv -> relu -> maxpool -> conv: the first two convolutions'
    # gradients read the pooled head d_pool[n, c, h // 2, w // 2] under the relu's
    # and the argmax's conditions, whose parity the simplifier writes as
    # (h + kh + 1) % 2 beside the key's h - kh + 1: one group, packed, on BLAS
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    X = te.placeholder((2, 2, 8, 8), "X", "float64")
    Ws = [te.placeholder(s, f"W{k}", "float64")
          for k, s in enumerate([(3, 2, 3, 3), (3, 3, 3, 3), (2, 3, 3, 3)])]
    h = nn.relu(nn.conv2d(X, Ws[0], padding=1, name="conv0"), name="relu0")
    h = nn.relu(nn.conv2d(h, Ws[1], padding=1, name="conv1"), name="relu1")
    y = nn.conv2d(nn.max_pool2d(h, 2, name="pool"), Ws[2], padding=1, name="conv2")
    H = te.placeholder(y.shape, "H", "float64")
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    grads = list(te.differentiate(L, [X] + Ws).result)
    ins = [X] + Ws + [H]
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    blas = {u.stage for u in kernel.units if u.kind == "blas"}
    # a stage split into its taps (codegen/rewrite/tap_split.py: conv2 has fewer output
    # than input channels, so col2im moves less memory) runs its GEMM as <name>_taps
    blas |= {s[:-len("_taps")] for s in blas if s.endswith("_taps")}
    assert {"conv1", "conv2"} <= blas, sorted(blas)
    # every convolution's input and weight gradient: d_relu0__conv1 is conv1's
    # input gradient through relu1 and the pool
    assert {"d_X__conv0", "d_relu0__conv1", "d_pool__conv2", "d_W0__conv0", "d_W1__conv1",
            "d_W2__conv2"} <= blas, sorted(blas)
    feed = {t: rng.standard_normal(t.shape) for t in ins}
    got = kernel(*[feed[t] for t in ins])
    for g, w in zip(got, te.evaluate([L] + grads, feed)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    tx, *tw = (torch.tensor(feed[t], requires_grad=True) for t in [X] + Ws)
    F = torch.nn.functional
    t = F.relu(F.conv2d(F.relu(F.conv2d(tx, tw[0], padding=1)), tw[1], padding=1))
    loss = (F.conv2d(F.max_pool2d(t, 2), tw[2], padding=1) * torch.tensor(feed[H])).sum()
    loss.backward()
    for g, tt in zip(got[1:], [tx] + tw):
        np.testing.assert_allclose(g, tt.grad.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("cond, value", [
    (lambda n: n * 3 > 0, 2**62),          # 3 * 2**62 leaves int64 ("would wrap around")
    (lambda n: n // -1 > 0, -2**63),       # INT_MIN // -1
    (lambda n: n % 7 == 1, 2**40),         # a loaded int64 outside the checked +-2**31
], ids=["product", "floordiv", "range-check"])
def test_a_condition_that_can_refuse_is_not_packed(cond, value):
    """A packed stage covers its key tensor's whole index space, also the points
    the contraction never reads (here columns 32-39 of X): a condition there that
    can raise must not be packed, or the kernel refuses a valid program (an
    attack, 2026-12-03: the packed stage raised at column 35)."""
    X = te.placeholder((64, 40), "X", "float64")
    W = te.placeholder((32, 64), "W", "float64")
    N = te.placeholder((64, 40), "N", "int64")
    k = te.reduce_axis(32, "k")
    Y = te.compute((64, 64), lambda i, j: te.sum((X[i, k] + 1.0) * W[k, j], axis=k,
                                                 where=cond(N[i, k])), name="Y")
    outs, packed = pack_operands(simplify.simplify([Y]))
    assert packed == []
    rng = np.random.default_rng(0)
    feed = {X: rng.standard_normal((64, 40)), W: rng.standard_normal((32, 64)),
            N: rng.integers(-5, 6, (64, 40))}
    feed[N][0, 35] = value
    kernel = codegen.build([Y], [X, W, N])
    np.testing.assert_allclose(kernel(feed[X], feed[W], feed[N])[0], te.evaluate(Y, feed),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cond", [
    lambda i, k: i * k > 20,
    lambda i, k: (i * i + k) % 7 < 3,
    lambda i, k: (i * k) // (k - 3) > 0,   # a divisor of 0 at k = 3: both raise
], ids=["product", "square-mod", "refusing"])
def test_a_condition_isl_cannot_read_keeps_the_stage_unpacked(cond):
    """A condition that reads no tensor but is not quasi-affine (``i * k > 20``) is
    one of the GEMM path's data conditions, which a stage with packed operands
    applies only where an operand is not finite, while the packing put it in no
    packed stage: the kernel dropped it (a difference of 68 on integer data)
    or missed its division by zero (an attack, 2026-12-03). Such a stage is not
    packed; the kernel equals te.evaluate of the simplified graph."""
    n = 64
    X = te.placeholder((n, n), "X", "float64")
    b = te.placeholder((n,), "b", "float64")
    W = te.placeholder((n, n), "W", "float64")
    k = te.reduce_axis(n, "k")
    Y = te.compute((n, n), lambda i, j: te.sum((X[i, k] + b[k]) * W[k, j], axis=k,
                                               where=te.all(X[i, k] > 0.0, cond(i, k))),
                   name="Y")
    outs, packed = pack_operands(simplify.simplify([Y]))
    assert packed == []
    rng = np.random.default_rng(0)
    feed = {X: rng.integers(-3, 4, (n, n)).astype(float),
            b: rng.integers(-2, 3, n).astype(float), W: rng.integers(-3, 4, (n, n)).astype(float)}
    kernel = codegen.build([Y], [X, b, W])
    try:
        want = te.evaluate(simplify.simplify([Y])[0], feed)
    except te.TexprError:
        with pytest.raises(te.TexprError, match="division by zero"):
            kernel(feed[X], feed[b], feed[W])
        return
    np.testing.assert_array_equal(kernel(feed[X], feed[b], feed[W])[0], want)
    assert np.any(want != 0)
