"""Loads whose row-major offset is affine although their indices use // and %
(flatten, reshape): the loop nest addresses them by the affine offset, proved
by isl over the iteration box (texpr.codegen.analysis.affine)."""

import numpy as np

import texpr as te
from texpr import codegen
from texpr import expr as E
from texpr.codegen.analysis.affine import affine_offsets
from texpr.simplify.isl_bridge import VarSpace, box_set
from texpr.visitor import post_order


def _offsets(Y):
    """The proved offsets of Y's loads, and the loads."""
    op = Y.op
    axes = list(op.axis)
    body = op.body[0]
    if isinstance(body, E.Reduce):
        axes += list(body.axes)
        exprs = list(body.source)
    else:
        exprs = [body]
    space = VarSpace(axes)
    loads = [n for e in exprs for n in post_order(e) if isinstance(n, E.Load)]
    return affine_offsets(exprs, axes, space, box_set(space)), loads


def test_flatten_reshape_and_non_affine_loads():
    X = te.placeholder((2, 3, 4, 5), name="X", dtype="float64")
    k = te.reduce_axis(60, name="k")
    # flatten: X[n, k // 20, k // 5 % 4, k % 5] is X.reshape(-1)[60 n + k]
    F = te.compute((2,), lambda n: te.sum(X[n, k // 20, k // 5 % 4, k % 5] * (k + 1.0), axis=k),
                   name="F")
    # a reshape (2, 60) -> (2, 3, 4, 5) read back: affine again
    R = te.compute((2, 12, 5), lambda a, b, c: X[a, b // 4, b % 4, c] * 2.0, name="R")
    # a transposing reshape: X[n, c, h, w] at flat position (w, h, c): not affine
    T = te.compute((2, 60), lambda n, f: X[n, f % 3, f // 3 % 4, f // 12], name="T")
    # a clamped flat position, the clamp active at both ends: not affine over the box
    C = te.compute((2, 70), lambda n, i: X[n, te.max(te.min(i - 5, 59), 0) // 20,
                                           te.max(te.min(i - 5, 59), 0) // 5 % 4,
                                           te.max(te.min(i - 5, 59), 0) % 5], name="C")
    for Y, affine in ((F, True), (R, True), (T, False), (C, False)):
        found, loads = _offsets(Y)
        assert bool(found) == affine, Y.name
        for offset in found.values():
            assert not any(isinstance(x, (E.FloorDiv, E.FloorMod)) for x in post_order(offset))
    kernel = codegen.build([F, R, T, C], [X])
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    for got, want in zip(kernel(x), te.evaluate([F, R, T, C], {X: x})):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the flatten's load is addressed by its offset: no division left in F's unit
    unit = next(c for c in kernel.source.split("\n@njit") if "# ---- stage F:" in c)
    code = [ln for ln in unit.splitlines() if not ln.strip().startswith("#")]
    assert not any(op in ln for ln in code for op in ("// 20", "// 5", "% 4", "% 5"))
    assert any("X_[np.uint64(((i0_0 * 60) + r0_0))]" in ln for ln in code)


def test_flatten_dense_gradient_uses_the_offset_and_matches_the_evaluator():
    X = te.placeholder((3, 2, 3, 3), name="Xf", dtype="float64")
    W = te.placeholder((4, 18), name="Wf", dtype="float64")
    Y = te.nn.dense(te.nn.flatten(X), W)
    a, b = te.reduce_axis(3, "a"), te.reduce_axis(4, "b")
    L = te.compute((), lambda: te.sum(Y[a, b] * Y[a, b], axis=[a, b]), name="L")
    gx, gw = te.differentiate(L, [X, W]).result
    kernel = codegen.build([L, gx, gw], [X, W])
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal((4, 18))
    for got, want in zip(kernel(x, w), te.evaluate([L, gx, gw], {X: x, W: w})):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kernel(x, w)[2], 2 * (x.reshape(3, -1) @ w.T).T @ x.reshape(3, -1),
                               rtol=1e-10)
