"""Scans with multi-stage bodies (issue 51): an RK4 integrator and two stacked cells.
The gradient's work is a constant multiple of the primal's, whatever the number of
steps; ``te.scan(checkpoint=)`` chooses whether the reverse scan stores a body stage's
step adjoint or the external inputs' contributions recompute it (docs/pipeline.md,
"Scans"). Values against float64 central differences, through the evaluator."""

import numpy as np
import pytest

import texpr as te
from texpr import simplify
from texpr.errors import ScanError

import sampler_programs

MODES = ("auto", "store", "recompute")


def _rk4(n, steps, checkpoint="auto", h=0.01):
    """``steps`` RK4 steps of ``y_0' = x_0``, ``y_i' = x_i * y_{i-1}`` (issue 51's case):
    k1..k4 are stages of the body, each reading the state at ``t - 1``. Returns the
    inputs ``(X, Y0)`` and the loss ``sum(y * y)`` over every step."""
    X = te.placeholder((n,), name="X", dtype="float64")
    Y0 = te.placeholder((n,), name="Y0", dtype="float64")
    S = te.placeholder((steps + 1, n), name="S", dtype="float64")

    def rate(name, shifted):  # shifted(t, i): the stage's argument at i - 1
        return te.compute((steps + 1, n), lambda t, i: te.if_then_else(
            i == 0, X[0] + 0.0 * S[t - 1, 0], X[i] * shifted(t, i)), name=name)

    k1 = rate("k1", lambda t, i: S[t - 1, i - 1])
    k2 = rate("k2", lambda t, i: S[t - 1, i - 1] + 0.5 * h * k1[t, i - 1])
    k3 = rate("k3", lambda t, i: S[t - 1, i - 1] + 0.5 * h * k2[t, i - 1])
    k4 = rate("k4", lambda t, i: S[t - 1, i - 1] + h * k3[t, i - 1])
    upd = te.compute((steps + 1, n), lambda t, i: S[t - 1, i] + (h / 6) * (
        k1[t, i] + 2.0 * k2[t, i] + 2.0 * k3[t, i] + k4[t, i]), name="upd")
    init = te.compute((1, n), lambda _, i: Y0[i], name="init")
    Y = te.scan(init, upd, S, name="rk4", checkpoint=checkpoint)
    r, q = te.reduce_axis(steps + 1, "r"), te.reduce_axis(n, "q")
    loss = te.compute((), lambda: te.sum(Y[r, q] * Y[r, q], axis=[r, q]), name="loss")
    return (X, Y0), loss


def _stacked(T, B=2, H=6, checkpoint="auto"):
    """Two tanh cells stacked in one scan body: ``h1 = tanh(W1 h1[t-1] + X[t])``, ``h2 =
    tanh(W2 h1[t] + U h2[t-1])``. The adjoint of ``a1`` (which reads ``W1`` and ``X``)
    goes through the contraction with ``W2``."""
    f = "float64"
    X = te.placeholder((T, B, H), name="X", dtype=f)
    W1, W2, U = (te.placeholder((H, H), name=n, dtype=f) for n in ("W1", "W2", "U"))
    S1, S2 = (te.placeholder((T, B, H), name=n, dtype=f) for n in ("S1", "S2"))
    k, k2 = te.reduce_axis(H, "k"), te.reduce_axis(H, "k2")
    a1 = te.compute((T, B, H), lambda t, b, j: te.sum(W1[j, k] * S1[t - 1, b, k], axis=k)
                    + X[t, b, j], name="a1")
    h1 = te.compute((T, B, H), lambda t, b, j: te.tanh(a1[t, b, j]), name="h1")
    a2 = te.compute((T, B, H), lambda t, b, j: te.sum(
        W2[j, k2] * h1[t, b, k2] + U[j, k2] * S2[t - 1, b, k2], axis=k2), name="a2")
    h2 = te.compute((T, B, H), lambda t, b, j: te.tanh(a2[t, b, j]), name="h2")
    i1 = te.compute((1, B, H), lambda _, b, j: X[0, b, j], name="i1")
    i2 = te.compute((1, B, H), lambda _, b, j: X[0, b, j] * 0.5, name="i2")
    o1, o2 = te.scan([i1, i2], [h1, h2], [S1, S2], name="stack", checkpoint=checkpoint)
    r, bb, q = te.reduce_axis(T, "r"), te.reduce_axis(B, "bb"), te.reduce_axis(H, "q")
    loss = te.compute((), lambda: te.sum(o2[r, bb, q] * o2[r, bb, q] + o1[r, bb, q],
                                         axis=[r, bb, q]), name="loss")
    return (X, W1, W2, U), loss


def _check_against_fd(inputs, loss, grads, seed, scale=1.0, points=3):
    rng = np.random.default_rng(seed)
    feed = {t: scale * rng.uniform(-1, 1, t.shape) for t in inputs}
    eps = 1e-6
    for t, g in zip(inputs, grads):
        got = te.evaluate(g, feed)
        for flat in rng.choice(int(np.prod(t.shape)), size=points, replace=False):
            d = np.zeros(t.shape)
            d.flat[flat] = eps
            plus, minus = dict(feed), dict(feed)
            plus[t], minus[t] = feed[t] + d, feed[t] - d
            fd = (te.evaluate(loss, plus) - te.evaluate(loss, minus)) / (2 * eps)
            np.testing.assert_allclose(got.flat[flat], fd, rtol=1e-6, atol=1e-8,
                                       err_msg=f"d loss / d {t.name} at {flat}")


def _reverse_scans(grads):
    return [op for op in simplify.materialized_stages(simplify.simplify(list(grads)))
            if isinstance(op, te.ScanOp) and op.tag == "scan_adjoint"]


@pytest.mark.parametrize("mode", MODES)
def test_rk4_gradient_matches_finite_differences(mode):
    inputs, loss = _rk4(8, 6, checkpoint=mode)
    grads = te.differentiate(loss, list(inputs)).result
    _check_against_fd(inputs, loss, grads, seed=51)


def test_rk4_gradient_work_is_a_constant_multiple_of_the_primal():
    # each step's stages are recomputed once (outside the reverse scan, for all steps)
    # and each of their adjoints once: about 3x the primal at any number of steps
    ratios = []
    for steps in (10, 40):
        inputs, loss = _rk4(50, steps)
        grads = te.differentiate(loss, list(inputs)).result
        ratios.append(simplify.iteration_count(list(grads))
                      / simplify.iteration_count([loss]))
    assert max(ratios) <= 3.2, ratios
    assert abs(ratios[1] - ratios[0]) <= 0.05, ratios


@pytest.mark.parametrize("mode", MODES)
def test_stacked_cells_gradient_matches_finite_differences(mode):
    inputs, loss = _stacked(5, checkpoint=mode)
    grads = te.differentiate(loss, list(inputs)).result
    _check_against_fd(inputs, loss, grads, seed=7, scale=0.5)


def test_stacked_cells_store_the_adjoint_behind_a_contraction():
    # auto stores the adjoint of a1 (behind the contraction with W2): the W2^T product
    # of every step is formed once, in the reverse scan; recompute forms it again for
    # dW1 and dX. a1 is two stages (its sum over k reads W1, a1 adds X): auto stores
    # both adjoints, store also a2's (the update's adjoint plus nothing: one hop)
    counts, outs = {}, {}
    for mode in MODES:
        per_T = []
        for T in (6, 12):
            inputs, loss = _stacked(T, checkpoint=mode)
            grads = te.differentiate(loss, list(inputs)).result
            per_T.append(simplify.iteration_count(list(grads))
                         / simplify.iteration_count([loss]))
            if T == 6:
                (rev,) = _reverse_scans(grads)
                outs[mode] = rev.num_outputs
        counts[mode] = per_T
    assert outs == {"auto": 4, "store": 5, "recompute": 2}
    for mode in MODES:  # a constant multiple of the primal (the first steps aside)
        assert max(counts[mode]) <= 5.5, counts
        assert abs(counts[mode][1] - counts[mode][0]) <= 0.1, counts
    # per step, auto saves the second W2^T product (B*H*H points a step)
    for i in range(2):
        assert counts["auto"][i] < counts["recompute"][i], counts


def test_rk4_auto_recomputes_elementwise_adjoints():
    # the RK4 body has no reduction: a stage's adjoint recomputed for all steps costs
    # what reading a stored one does, so auto stores nothing and store adds outputs
    outs = {}
    for mode in MODES:
        inputs, loss = _rk4(8, 6, checkpoint=mode)
        (rev,) = _reverse_scans(te.differentiate(loss, list(inputs)).result)
        outs[mode] = rev.num_outputs
    assert outs["auto"] == outs["recompute"] == 1
    assert outs["store"] > 1


def test_checkpoint_errors():
    X = te.placeholder((6, 2), name="X")
    S = te.placeholder((6, 2), name="S")
    init = te.compute((1, 2), lambda _, i: X[0, i], name="init")
    upd = te.compute((6, 2), lambda t, i: S[t - 1, i] * X[t, i], name="upd")
    with pytest.raises(ScanError, match="checkpoint='keep'; expected one of"):
        te.scan(init, upd, S, name="bad", checkpoint="keep")
    # a lag-2 body with one init step: the reverse scan covers the steps t >= 2 only
    upd2 = te.compute((6, 2), lambda t, i: te.if_then_else(
        t >= 2, S[t - 2, i] * X[t, i], X[t, i]), name="upd2")
    s = te.scan(init, upd2, S, name="lag2", checkpoint="store")
    with pytest.raises(ScanError, match="scan lag2: checkpoint='store'"):
        te.differentiate(s, [X])
    s = te.scan(init, upd2, S, name="lag2")
    (dX,) = te.differentiate(s, [X]).result
    assert dX.shape == (6, 2, 6, 2)


def test_step_tests_that_every_step_passes_are_folded_before_lowering():
    # the reverse scan's guard tau >= 1 sat in each disjunct of a union of equalities
    # (the LSTM's gate adjoint): folded, the step's loop nest runs the union's points,
    # not the box with a test per point
    from texpr.simplify.step_tests import fold_step_tests as _fold_step_tests
    from texpr.printer import expr_str

    from texpr.expr import var

    t, r, j = var("t"), var("r"), var("j")
    union = te.any(te.all(t >= 1, r == j), te.all(t >= 1, r + 8 == j))
    assert expr_str(_fold_step_tests(union, t, 1, 10)) == "r == j || r + 8 == j"
    assert expr_str(_fold_step_tests(union, t, 0, 10)) == expr_str(union)  # t = 0 fails
    assert expr_str(_fold_step_tests(te.all(t < 0, r == j), t, 1, 10)) == "false"
    assert expr_str(_fold_step_tests(te.all(t <= 9, 2 * t >= 3, r == j), t, 2, 10)) == "r == j"
    assert expr_str(_fold_step_tests(t >= 5, t, 1, 10)) == "t >= 5"


def test_stacked_lstm_program_gradient_matches_finite_differences():
    # benchmarks/bench_build_blowups.py's stacked_lstm case, small: 2 layers (4
    # coupled states), each reading the layer below at the same step
    inputs, loss = sampler_programs.stacked_lstm(layers=2, steps=4, batch=2, hidden=3,
                                                 dtype="float64")
    grads = te.differentiate(loss, list(inputs)).result
    _check_against_fd(inputs, loss, grads, seed=3)
