"""te.scan (issue 13): forward values against numpy loops, gradients against float64
finite differences (raw and simplified) and torch, second order, linear work, errors."""

import pickle

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.testing import numeric_gradient
from gradcheck import weighted_sum

RNG = np.random.default_rng(13)


def _cumsum(T, n, dtype="float64"):
    X = te.placeholder((T, n), name="X", dtype=dtype)
    S = te.placeholder((T, n), name="S", dtype=dtype)
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, i] + X[t, i], name="upd")
    return X, te.scan(init, upd, S, name="csum")


def _tanh_rnn(T, n):
    """h[t] = tanh(W h[t-1] + X[t]) with h[0] = tanh(X[0]); W (n, n)."""
    X = te.placeholder((T, n), name="X", dtype="float64")
    W = te.placeholder((n, n), name="W", dtype="float64")
    S = te.placeholder((T, n), name="S", dtype="float64")
    k = te.reduce_axis(n, "k")
    init = te.compute((1, n), lambda _, i: te.tanh(X[0, i]), name="h0")
    upd = te.compute((T, n), lambda t, i: te.tanh(te.sum(W[i, k] * S[t - 1, k], axis=k)
                                                  + X[t, i]), name="h")
    return X, W, te.scan(init, upd, S, name="rnn")


def _np_rnn(x, w):
    h = np.empty_like(x)
    h[0] = np.tanh(x[0])
    for t in range(1, len(x)):
        h[t] = np.tanh(w @ h[t - 1] + x[t])
    return h


def _check_grads(loss, inputs, feed, simplify_flag, rtol=1e-6, atol=1e-8):
    res = te.differentiate(loss, inputs, simplify=simplify_flag)
    got = te.evaluate(list(res.result), feed)
    for g, x in zip(got, inputs):
        fd = numeric_gradient(loss, x, feed)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol, err_msg=f"d/d{x.name}")
    return res


# ---- forward -----------------------------------------------------------------------------


def test_cumsum_forward_and_printing():
    X, c = _cumsum(7, 3)
    x = RNG.standard_normal((7, 3))
    np.testing.assert_allclose(te.evaluate(c, {X: x}), np.cumsum(x, axis=0))
    assert c.shape == (7, 3) and c.dtype == "float64"
    text = te.graph_str(c)
    assert "csum(7, 3) = scan(S := csum from init; steps 1..7: upd)" in text
    assert "| upd[t<7, i<3] = S[t - 1, i] + X[t, i]" in text


def test_cumprod_and_rnn_forward():
    T, n = 6, 4
    X = te.placeholder((T, n), name="X", dtype="float64")
    S = te.placeholder((T, n), name="S", dtype="float64")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, i] * X[t, i], name="upd")
    cp = te.scan(init, upd, S, name="cprod")
    x = RNG.uniform(-2, 2, (T, n))
    x[2, 1] = 0.0
    np.testing.assert_array_equal(te.evaluate(cp, {X: x}), np.cumprod(x, axis=0))
    Xr, W, h = _tanh_rnn(T, n)
    xr, w = RNG.standard_normal((T, n)), RNG.standard_normal((n, n)) * 0.5
    np.testing.assert_allclose(te.evaluate(h, {Xr: xr, W: w}), _np_rnn(xr, w), rtol=1e-12)


def test_two_states_updated_together():
    # a[t] = a[t-1] + b[t-1] * x[t], b[t] = b[t-1] * 0.5 - a[t-1]: each reads the other
    T, n = 8, 3
    X = te.placeholder((T, n), name="X", dtype="float64")
    A = te.placeholder((T, n), name="A", dtype="float64")
    B = te.placeholder((T, n), name="B", dtype="float64")
    a0 = te.compute((1, n), lambda _, i: X[0, i], name="a0")
    b0 = te.compute((1, n), lambda _, i: X[0, i] * 2.0, name="b0")
    ua = te.compute((T, n), lambda t, i: A[t - 1, i] + B[t - 1, i] * X[t, i], name="ua")
    ub = te.compute((T, n), lambda t, i: B[t - 1, i] * 0.5 - A[t - 1, i], name="ub")
    sa, sb = te.scan([a0, b0], [ua, ub], [A, B], name="pair")
    assert isinstance(sa.op, te.ScanOp) and sa.op is sb.op
    x = RNG.standard_normal((T, n))
    a, b = np.empty((T, n)), np.empty((T, n))
    a[0], b[0] = x[0], 2 * x[0]
    for t in range(1, T):
        a[t] = a[t - 1] + b[t - 1] * x[t]
        b[t] = b[t - 1] * 0.5 - a[t - 1]
    got = te.evaluate([sa, sb], {X: x})
    np.testing.assert_allclose(got[0], a, rtol=1e-12)
    np.testing.assert_allclose(got[1], b, rtol=1e-12)


def _fib(T, n, guard_extent=2):
    """f[t] = f[t-1] * c[t] + f[t-2] (init extent 2), or with init extent 1 and a guard."""
    X = te.placeholder((T, n), name="X", dtype="float64")
    S = te.placeholder((T, n), name="S", dtype="float64")
    if guard_extent == 2:
        init = te.compute((2, n), lambda t, i: X[t, i], name="init2")
        upd = te.compute((T, n), lambda t, i: S[t - 1, i] * X[t, i] + S[t - 2, i], name="upd")
    else:
        init = te.compute((1, n), lambda t, i: X[t, i], name="init1")
        upd = te.compute((T, n), lambda t, i: S[t - 1, i] * X[t, i]
                         + te.if_then_else(t >= 2, S[t - 2, i], 0.0), name="upd")
    return X, te.scan(init, upd, S, name="fib")


def _np_fib(x, L):
    f = np.empty_like(x)
    f[:L] = x[:L]
    for t in range(L, len(x)):
        f[t] = f[t - 1] * x[t] + (f[t - 2] if t >= 2 else 0.0)
    return f


@pytest.mark.parametrize("L", [1, 2])
def test_reads_two_steps_back(L):
    X, f = _fib(9, 2, L)
    x = RNG.uniform(-1.2, 1.2, (9, 2))
    np.testing.assert_allclose(te.evaluate(f, {X: x}), _np_fib(x, L), rtol=1e-12)


def test_pickle_roundtrip():
    X, c = _cumsum(5, 2)
    c2 = pickle.loads(pickle.dumps(c))
    (X2,) = [op.output(0) for op in te.topo_order(c2) if isinstance(op, te.PlaceholderOp)]
    x = RNG.standard_normal((5, 2))
    np.testing.assert_allclose(te.evaluate(c2, {X2: x}), np.cumsum(x, axis=0))


# ---- gradients -----------------------------------------------------------------------------


@pytest.mark.parametrize("simplify_flag", [False, True])
def test_rnn_gradients_vs_finite_differences(simplify_flag):
    X, W, h = _tanh_rnn(6, 3)
    loss, C = weighted_sum(h)
    feed = {X: RNG.standard_normal((6, 3)), W: RNG.standard_normal((3, 3)) * 0.7,
            C: RNG.standard_normal((6, 3))}
    _check_grads(loss, [X, W], feed, simplify_flag)


@pytest.mark.parametrize("simplify_flag", [False, True])
def test_two_state_gradients(simplify_flag):
    T, n = 7, 2
    X = te.placeholder((T, n), name="X", dtype="float64")
    V = te.placeholder((n,), name="V", dtype="float64")
    A = te.placeholder((T, n), name="A", dtype="float64")
    B = te.placeholder((T, n), name="B", dtype="float64")
    a0 = te.compute((1, n), lambda _, i: V[i], name="a0")
    b0 = te.compute((1, n), lambda _, i: X[0, i] * V[i], name="b0")
    ua = te.compute((T, n), lambda t, i: A[t - 1, i] * te.sigmoid(B[t - 1, i]) + X[t, i],
                    name="ua")
    ub = te.compute((T, n), lambda t, i: te.tanh(B[t - 1, i] - A[t - 1, i] * V[i]), name="ub")
    sa, sb = te.scan([a0, b0], [ua, ub], [A, B], name="pair")
    j = te.reduce_axis(T, "j")
    q = te.reduce_axis(n, "q")
    loss = te.compute((), lambda: te.sum(sa[j, q] * sb[j, q] + sb[j, q], axis=[j, q]), name="L")
    feed = {X: RNG.standard_normal((T, n)), V: RNG.standard_normal((n,))}
    _check_grads(loss, [X, V], feed, simplify_flag)


@pytest.mark.parametrize("L", [1, 2])
@pytest.mark.parametrize("simplify_flag", [False, True])
def test_two_steps_back_gradients(L, simplify_flag):
    X, f = _fib(7, 2, L)
    loss, C = weighted_sum(f)
    feed = {X: RNG.uniform(-1.2, 1.2, (7, 2)), C: RNG.standard_normal((7, 2))}
    _check_grads(loss, [X], feed, simplify_flag)


def _scan_reading(Y, X, T, n):
    S = te.placeholder((T, n), name="S", dtype="float64")
    init = te.compute((1, n), lambda _, i: X[0, i] * X[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, i] * Y[t, i] - Y[t - 1, i], name="upd")
    return init, te.scan(init, upd, S, inputs=[Y], name="s")


def test_gradient_wrt_init_and_intermediate_input():
    # the init and an intermediate stage the update reads get their adjoints
    T, n = 5, 3
    X = te.placeholder((T, n), name="X", dtype="float64")
    Y = te.compute((T, n), lambda t, i: te.exp(X[t, i] * 0.5), name="Y")
    init, s = _scan_reading(Y, X, T, n)
    loss, C = weighted_sum(s)
    feed = {X: RNG.standard_normal((T, n)), C: RNG.standard_normal((T, n))}
    _check_grads(loss, [X], feed, True)
    g_init, g_y = te.evaluate(list(te.differentiate(loss, [init, Y])), feed)
    # the same graph with Y fed: its gradient by finite differences
    YP = te.placeholder((T, n), name="YP", dtype="float64")
    _init2, s2 = _scan_reading(YP, X, T, n)
    r, q = te.reduce_axis(T, "r"), te.reduce_axis(n, "q")
    loss2 = te.compute((), lambda: te.sum(C[r, q] * s2[r, q], axis=[r, q]), name="L2")
    feed2 = dict(feed)
    feed2[YP] = np.exp(feed[X] * 0.5)
    np.testing.assert_allclose(g_y, numeric_gradient(loss2, YP, feed2), rtol=1e-6, atol=1e-8)
    # d L / d s[0] = C[0] + sum_{t >= 1} C[t] * prod_{u=1..t} y[u]
    y, c = feed2[YP], feed[C]
    want = c[0] + sum(c[t] * np.prod(y[1:t + 1], axis=0) for t in range(1, T))
    np.testing.assert_allclose(g_init, want[None], rtol=1e-10)


def test_full_jacobian_head_none():
    X, c = _cumsum(4, 2)
    (jac,) = te.differentiate(c, [X])
    got = te.evaluate(jac, {X: RNG.standard_normal((4, 2))})
    want = np.einsum("ts,ij->tisj", np.tril(np.ones((4, 4))), np.eye(2))
    np.testing.assert_allclose(got, want)


def test_rnn_gradients_vs_torch():
    import torch

    T, n = 8, 5
    X, W, h = _tanh_rnn(T, n)
    loss, C = weighted_sum(h)
    feed = {X: RNG.standard_normal((T, n)), W: RNG.standard_normal((n, n)) * 0.5,
            C: RNG.standard_normal((T, n))}
    gx, gw = te.evaluate(list(te.differentiate(loss, [X, W])), feed)
    xt = torch.tensor(feed[X], requires_grad=True)
    wt = torch.tensor(feed[W], requires_grad=True)
    hs = [torch.tanh(xt[0])]
    for t in range(1, T):
        hs.append(torch.tanh(wt @ hs[-1] + xt[t]))
    (torch.stack(hs) * torch.tensor(feed[C])).sum().backward()
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gw, wt.grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("L", [1, 2])
def test_second_order(L):
    # the gradient of a gradient: d/dX of sum(V * dL/dX), vs finite differences of dL/dX
    X, f = _fib(6, 2, L)
    loss, C = weighted_sum(f)
    V = te.placeholder((6, 2), name="V", dtype="float64")
    (g,) = te.differentiate(loss, [X])
    r, q = te.reduce_axis(6, "r"), te.reduce_axis(2, "q")
    gv = te.compute((), lambda: te.sum(g[r, q] * V[r, q], axis=[r, q]), name="gv")
    feed = {X: RNG.uniform(-1, 1, (6, 2)), C: RNG.standard_normal((6, 2)),
            V: RNG.standard_normal((6, 2))}
    for simplify_flag in (False, True):
        _check_grads(gv, [X, C], feed, simplify_flag, rtol=1e-5, atol=1e-7)


def test_gradient_work_is_linear_in_T():
    counts = []
    for T in (64, 128, 256):
        X, c = _cumsum(T, 4, "float32")
        loss, _C = weighted_sum(c)
        (g,) = te.differentiate(loss, [X])
        counts.append(simplify.iteration_count([g]))
    # exactly linear: doubling T doubles the count's growth, no T**2 term
    d1, d2 = counts[1] - counts[0], counts[2] - counts[1]
    assert d2 == 2 * d1, counts
    assert counts[2] < 8 * 256 * 4, counts


# ---- errors --------------------------------------------------------------------------------


def test_shape_errors():
    T, n = 5, 3
    X = te.placeholder((T, n), name="X")
    S = te.placeholder((T, n), name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    bad_init = te.compute((1, n + 1), lambda _, i: 0.0, name="bad_init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, i] + X[t, i], name="upd")
    short = te.compute((T - 1, n), lambda t, i: S[t, i] * 2.0, name="short")
    with pytest.raises(te.ScanShapeError, match="init bad_init has shape"):
        te.scan(bad_init, upd, S)
    with pytest.raises(te.ScanShapeError, match="update short has shape"):
        te.scan(init, short, S)
    S64 = te.placeholder((T, n), name="S64", dtype="float64")
    upd64 = te.compute((T, n), lambda t, i: S64[t - 1, i] + 1.0, name="upd64")
    with pytest.raises(te.ScanShapeError, match="dtype float32"):
        te.scan(init, upd64, S64)
    long_init = te.compute((T + 1, n), lambda t, i: 0.0, name="long")
    with pytest.raises(te.ScanShapeError, match="at most T"):
        te.scan(long_init, upd, S)
    with pytest.raises(te.ScanShapeError, match="one of each"):
        te.scan([init], [upd, upd], [S])
    with pytest.raises(te.ScanError, match="not a placeholder"):
        te.scan(init, upd, init)
    assert issubclass(te.ScanShapeError, te.ShapeError)


def test_dependence_errors():
    T, n = 5, 3
    X = te.placeholder((T, n), name="X")
    S = te.placeholder((T, n), name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    now = te.compute((T, n), lambda t, i: S[t, i] + 1.0, name="now")
    with pytest.raises(te.ScanDependenceError, match=r"reads `S\[t, i\]`.*earlier steps"):
        te.scan(init, now, S)
    later = te.compute((T, n), lambda t, i: te.if_then_else(t < T - 1, S[t + 1, i], 0.0),
                       name="later")
    with pytest.raises(te.ScanDependenceError, match="earlier steps"):
        te.scan(init, later, S)
    k = te.reduce_axis(T, "k")
    allpast = te.compute((T, n), lambda t, i: te.sum(S[k, i], axis=k, where=k < t), name="past")
    with pytest.raises(te.ScanDependenceError, match="constant k >= 1"):
        te.scan(init, allpast, S)
    mid = te.compute((T, n), lambda t, i: S[t - 1, i] * 2.0, name="mid")
    shifted = te.compute((T, n), lambda t, i: mid[t - 1, i] + 1.0, name="shifted")
    with pytest.raises(te.ScanDependenceError, match="same step"):
        te.scan(init, shifted, S)


def test_init_errors():
    T, n = 6, 2
    X = te.placeholder((T, n), name="X")
    S = te.placeholder((T, n), name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    two_back = te.compute((T, n), lambda t, i: S[t - 1, i] + S[t - 2, i], name="two_back")
    with pytest.raises(te.ScanInitError, match=r"give 2 \(init.shape\[0\] = 2\)"):
        te.scan(init, two_back, S)
    weak_guard = te.compute((T, n), lambda t, i: te.if_then_else(t >= 1, S[t - 2, i], 0.0),
                            name="weak")
    with pytest.raises(te.ScanInitError, match="t >= 2"):
        te.scan(init, weak_guard, S)
    # guards in other spellings are understood
    for cond in (lambda t: t > 1, lambda t: 2 <= t, lambda t: (t - 2 >= 0) & (t < 99)):
        ok = te.compute((T, n), lambda t, i: te.if_then_else(cond(t), S[t - 2, i], 0.0)
                        + S[t - 1, i], name="ok")
        te.scan(init, ok, S)


def test_inputs_must_not_depend_on_state():
    T, n = 4, 2
    X = te.placeholder((T, n), name="X")
    S = te.placeholder((T, n), name="S")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    mid = te.compute((T, n), lambda t, i: S[t - 1, i] * 2.0, name="mid")
    upd = te.compute((T, n), lambda t, i: mid[t, i] + X[t, i], name="upd")
    with pytest.raises(te.ScanError, match="inputs lists mid"):
        te.scan(init, upd, S, inputs=[X, mid])


# ---- kernels ---------------------------------------------------------------------------------


def _kernel_matches(outputs, inputs, feed, rtol=1e-10):
    from texpr import codegen

    kernel = codegen.build(outputs, inputs)
    got = kernel(*[feed[x] for x in inputs])
    want = te.evaluate(outputs, feed)
    for g, w_, t in zip(got, want, outputs):
        np.testing.assert_allclose(g, w_, rtol=rtol, atol=1e-12, err_msg=t.name)
    return kernel, got


def test_kernel_rnn_forward_and_gradients():
    X, W, h = _tanh_rnn(7, 4)
    loss, C = weighted_sum(h)
    gx, gw = te.differentiate(loss, [X, W])
    feed = {X: RNG.standard_normal((7, 4)), W: RNG.standard_normal((4, 4)) * 0.6,
            C: RNG.standard_normal((7, 4))}
    kernel, got = _kernel_matches([h, gx, gw], [X, W, C], feed)
    np.testing.assert_allclose(got[0], _np_rnn(feed[X], feed[W]), rtol=1e-12)
    np.testing.assert_allclose(got[1], numeric_gradient(loss, X, feed), rtol=1e-6, atol=1e-8)
    src = kernel.source
    assert src.count(" = scan(") == 2, src  # the forward scan once, its reverse scan once
    assert "for t" in src


@pytest.mark.parametrize("L", [1, 2])
def test_kernel_two_steps_back_with_gradient(L):
    X, f = _fib(9, 3, L)
    loss, C = weighted_sum(f)
    (g,) = te.differentiate(loss, [X])
    feed = {X: RNG.uniform(-1.2, 1.2, (9, 3)), C: RNG.standard_normal((9, 3))}
    _kernel, got = _kernel_matches([f, g], [X, C], feed)
    np.testing.assert_allclose(got[0], _np_fib(feed[X], L), rtol=1e-12)
    np.testing.assert_allclose(got[1], numeric_gradient(loss, X, feed), rtol=1e-6, atol=1e-8)


def test_kernel_second_order():
    # Hessian-vector product of sum(C * s) for s[t] = s[t-1] * x[t] + x[t] through a kernel
    T, n = 6, 2
    X = te.placeholder((T, n), name="X", dtype="float64")
    S = te.placeholder((T, n), name="S", dtype="float64")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, i] * X[t, i] + X[t, i], name="upd")
    s = te.scan(init, upd, S, name="s")
    loss, C = weighted_sum(s)
    (g,) = te.differentiate(loss, [X])
    V = te.placeholder((T, n), name="V", dtype="float64")
    r, p = te.reduce_axis(T, "r"), te.reduce_axis(n, "p")
    gv = te.compute((), lambda: te.sum(g[r, p] * V[r, p], axis=[r, p]), name="gv")
    (hv,) = te.differentiate(gv, [X])
    feed = {X: RNG.uniform(-1, 1, (T, n)), C: RNG.standard_normal((T, n)),
            V: RNG.standard_normal((T, n))}
    _kernel, got = _kernel_matches([g, hv], [X, C, V], feed)
    np.testing.assert_allclose(got[1], numeric_gradient(gv, X, feed), rtol=1e-5, atol=1e-7)


def test_kernel_big_step_runs_parallel():
    # a step of 70,000 points: the body's loop nest runs with prange inside the time loop
    X, c = _cumsum(3, 70_000, "float32")
    x = RNG.standard_normal((3, 70_000)).astype("float32")
    kernel, got = _kernel_matches([c], [X], {X: x}, rtol=1e-6)
    np.testing.assert_allclose(got[0], np.cumsum(x, axis=0), rtol=1e-5, atol=1e-6)
    assert "prange" in kernel.source


def test_a_long_scan_of_a_scalar_state_runs_its_steps_in_order():
    # 70,000 steps of a state with no axis but time: the pointwise lowering's one
    # loop is the recurrence; the default rules ran it as a prange loop (65,536
    # points and more), so steps read states not yet written: a prefix sum off by
    # up to 90 at 200,000 steps (found through fuzz seed 7002900036, the parallel mode)
    T = 70_000
    X = te.placeholder((T,), name="X", dtype="float64")
    S = te.placeholder((T,), name="S", dtype="float64")
    init = te.compute((1,), lambda _: X[0], name="init")
    upd = te.compute((T,), lambda t: S[t - 1] * 0.5 + X[t], name="upd")
    c = te.scan(init, upd, S, name="ema")
    H = te.placeholder((T,), name="H", dtype="float64")
    (dX,) = te.differentiate(c, [X], head=H).result
    x, h = RNG.standard_normal(T), RNG.standard_normal(T)
    kernel, got = _kernel_matches([c, dX], [X, H], {X: x, H: h}, rtol=1e-9)
    want = np.empty(T)
    want[0] = x[0]
    for t in range(1, T):
        want[t] = want[t - 1] * 0.5 + x[t]
    np.testing.assert_allclose(got[0], want, rtol=1e-9, atol=1e-9)


def test_a_long_prefix_sum_written_as_a_reduction_is_exact():
    # the same recurrence reached from a where= reduction (the simplifier makes
    # the prefix sum a scan), 1-D, and its gradient (a suffix sum)
    n = 70_000
    X = te.placeholder((n,), "X", "float64")
    k = te.reduce_axis(n, "k")
    S = te.compute((n,), lambda j: te.sum(X[k], axis=k, where=k <= j), name="S")
    H = te.placeholder((n,), "H", "float64")
    (dX,) = te.differentiate(S, [X], head=H).result
    from texpr import codegen

    kernel = codegen.build([S, dX], [X, H])
    x, h = RNG.standard_normal(n), RNG.standard_normal(n)
    s, dx = kernel(x, h)
    np.testing.assert_allclose(s, np.cumsum(x), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dx, np.cumsum(h[::-1])[::-1], rtol=1e-9, atol=1e-9)


def test_schedule_cannot_inline_scan_or_its_input():
    from texpr import codegen

    T, n = 4, 2
    X = te.placeholder((T, n), name="X")
    Y = te.compute((T, n), lambda t, i: X[t, i] * 2.0, name="Y")
    S = te.placeholder((T, n), name="S")
    init = te.compute((1, n), lambda _, i: Y[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, i] + Y[t, i], name="upd")
    s = te.scan(init, upd, S, name="s")
    z = te.compute((T, n), lambda t, i: s[t, i] + 1.0, name="z")
    sch = codegen.create_schedule([z])
    with pytest.raises(te.ScheduleError, match="scan stage cannot be inlined"):
        sch[s].compute_inline()
    sch[Y].compute_inline()
    with pytest.raises(te.ScheduleError, match="reads it whole"):
        codegen.build([z], [X], sch)


@pytest.mark.parametrize("L", [1, 2])
def test_jvp_through_scan_and_hessian_vector_product(L):
    from texpr.testing import numeric_jacobian

    X, f = _fib(6, 2, L)
    D = te.placeholder((6, 2), name="D", dtype="float64")
    feed = {X: RNG.uniform(-1, 1, (6, 2)), D: RNG.standard_normal((6, 2))}
    jac = numeric_jacobian(f, X, feed)
    want = np.einsum("tiuj,uj->ti", jac, feed[D])
    for simplify_flag in (False, True):
        df = te.jvp(f, [X], [D], simplify=simplify_flag)
        np.testing.assert_allclose(te.evaluate(df, feed), want, rtol=1e-6, atol=1e-8)
    # forward over reverse: H v of sum(C * f)
    loss, C = weighted_sum(f)
    feed[C] = RNG.standard_normal((6, 2))
    (g,) = te.differentiate(loss, [X])
    hv = te.jvp(g, [X], [D])
    r, q = te.reduce_axis(6, "r"), te.reduce_axis(2, "q")
    gd = te.compute((), lambda: te.sum(g[r, q] * D[r, q], axis=[r, q]), name="gd")
    np.testing.assert_allclose(te.evaluate(hv, feed), numeric_gradient(gd, X, feed),
                               rtol=1e-5, atol=1e-7)


def test_data_dependent_reads_of_the_state():
    # s[t, i] = 0.5 s[t-1, P[i]] + tanh(X[t, P[i]]): the adjoint of the gather of the state
    # is a scatter, held in the reverse body as the equivalent sum; a bad index raises
    T, n = 5, 4
    X = te.placeholder((T, n), name="X", dtype="float64")
    P = te.placeholder((n,), name="P", dtype="int64")
    S = te.placeholder((T, n), name="S", dtype="float64")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, P[i]] * 0.5 + te.tanh(X[t, P[i]]),
                     name="upd")
    s = te.scan(init, upd, S, name="s")
    loss, C = weighted_sum(s)
    feed = {X: RNG.standard_normal((T, n)), C: RNG.standard_normal((T, n)),
            P: np.array([2, 0, 0, 3])}
    for simplify_flag in (False, True):
        res = _check_grads(loss, [X], feed, simplify_flag)
    (g,) = res
    _kernel, _got = _kernel_matches([s, g], [X, P, C], feed)
    feed[P] = np.array([2, 0, 7, 3])
    with pytest.raises(te.OutOfBoundsError, match=r"P\[r?_?[iu]"):
        te.evaluate(g, feed)
    with pytest.raises(te.OutOfBoundsError):
        _kernel(feed[X], feed[P], feed[C])


def _body_variant(kind, T=5, n=3):
    X = te.placeholder((T, n), name="X", dtype="float64")
    W = te.placeholder((n, n), name="W", dtype="float64")
    S = te.placeholder((T, n), name="S", dtype="float64")
    k = te.reduce_axis(n, "k")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    if kind == "max":  # a max-plus (Viterbi) recurrence: argmax stages in both bodies
        upd = te.compute((T, n), lambda t, i: te.max(W[i, k] + S[t - 1, k], axis=k) + X[t, i],
                         name="upd")
    elif kind == "prod":  # the rest stages of a product in the body
        upd = te.compute((T, n), lambda t, i: te.prod(S[t - 1, k] * W[i, k] + 1.0, axis=k) * 0.3
                         + X[t, i], name="upd")
    else:  # the init gives every step: no update runs
        init = te.compute((T, n), lambda t, i: X[t, i] * 2.0, name="init")
        upd = te.compute((T, n), lambda t, i: S[t - 1, i] + W[i, i], name="upd")
    return X, W, te.scan(init, upd, S, name=kind)


@pytest.mark.parametrize("kind", ["max", "prod", "init_only"])
def test_body_reducers_and_init_only(kind):
    X, W, s = _body_variant(kind)
    loss, C = weighted_sum(s)
    feed = {X: RNG.standard_normal((5, 3)), W: RNG.standard_normal((3, 3)),
            C: RNG.standard_normal((5, 3))}
    for simplify_flag in (False, True):
        _check_grads(loss, [X, W] if kind != "init_only" else [X], feed, simplify_flag)
    if kind == "init_only":
        np.testing.assert_allclose(te.evaluate(s, feed), 2 * feed[X])
        (gw,) = te.differentiate(loss, [W])
        np.testing.assert_array_equal(te.evaluate(gw, feed), np.zeros((3, 3)))


def test_scalar_steps_kernel():
    T = 7
    Xs = te.placeholder((T,), name="Xs", dtype="float64")
    Ss = te.placeholder((T,), name="Ss", dtype="float64")
    i0 = te.compute((1,), lambda _: Xs[0], name="i0")
    upd = te.compute((T,), lambda t: Ss[t - 1] * te.sin(Xs[t]) + Xs[t], name="upd")
    s = te.scan(i0, upd, Ss, name="sc")
    r = te.reduce_axis(T, "r")
    loss = te.compute((), lambda: te.sum(s[r] * s[r], axis=r), name="L")
    (g,) = te.differentiate(loss, [Xs])
    feed = {Xs: RNG.standard_normal(T)}
    _kernel, got = _kernel_matches([s, g], [Xs], feed)
    np.testing.assert_allclose(got[1], numeric_gradient(loss, Xs, feed), rtol=1e-6, atol=1e-8)


def test_torch_bridge_through_a_scan():
    # a scan as a differentiable torch op: its forward and adjoint kernels (double
    # backward works too, checked by hand: its kernels take minutes to compile here)
    import torch
    import texpr.torch

    X, W, h = _tanh_rnn(4, 3)
    f = texpr.torch.op(h, [X, W])
    xt = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (xt, wt))


def _batched_rnn(T, B, n, dtype="float64"):
    """h[t, b] = tanh(h[t-1, b] @ W^T + X[t, b]): a step that is a (B x n) @ (n x n)
    product, large enough for the per-step GEMM (codegen/loopnest/scan_gemm.py)."""
    X = te.placeholder((T, B, n), name="X", dtype=dtype)
    W = te.placeholder((n, n), name="W", dtype=dtype)
    S = te.placeholder((T, B, n), name="S", dtype=dtype)
    k = te.reduce_axis(n, "k")
    init = te.compute((1, B, n), lambda _, b, i: te.tanh(X[0, b, i]), name="h0")
    pre = te.compute((T, B, n), lambda t, b, i: te.sum(S[t - 1, b, k] * W[i, k], axis=k),
                     name="pre")
    upd = te.compute((T, B, n), lambda t, b, i: te.tanh(pre[t, b, i] + X[t, b, i]), name="h")
    return X, W, te.scan(init, upd, S, name="brnn")


@pytest.mark.parametrize("poison", [None, "nan_weight", "inf_input"])
def test_kernel_step_products_run_as_gemms(poison):
    # forward and gradient steps that are matrix products run as np.dot under a
    # finiteness test; a NaN or inf operand takes the loop nest: values and NaN
    # patterns equal te.evaluate either way (the gradient's step has a t >= 2 test)
    from texpr import codegen

    T, B, n = 5, 16, 16
    X, W, h = _batched_rnn(T, B, n)
    loss, C = weighted_sum(h)
    gx, gw = te.differentiate(loss, [X, W])
    feed = {X: RNG.standard_normal((T, B, n)), W: RNG.standard_normal((n, n)) * 0.3,
            C: RNG.standard_normal((T, B, n))}
    if poison == "nan_weight":
        feed[W][3, 5] = np.nan
    elif poison == "inf_input":
        feed[X][2, 1, 4] = np.inf
    kernel = codegen.build([h, gx, gw], [X, W, C])
    assert kernel.source.count("np.dot(") == 2, kernel.source
    got = kernel(*[feed[x] for x in (X, W, C)])
    want = te.evaluate([h, gx, gw], feed)
    for g, w_ in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w_))
        np.testing.assert_allclose(g[np.isfinite(w_)], w_[np.isfinite(w_)], rtol=1e-9,
                                   atol=1e-12)
    if poison is None:
        np.testing.assert_allclose(got[2], numeric_gradient(loss, W, feed), rtol=1e-5,
                                   atol=1e-7)


def test_a_body_stage_or_state_is_no_input_of_a_derivative():
    # the update, a body stage and the state placeholder have no value outside the
    # scan: differentiate and jvp w.r.t. one of them returned zeros (L depends on
    # the update at every step t >= 1), a silent wrong value; now they refuse
    T = 3
    X = te.placeholder((T, 2), name="X", dtype="float64")
    S = te.placeholder((T, 2), name="S", dtype="float64")
    init = te.compute((1, 2), lambda _, i: X[0, i], name="init")
    B = te.compute((T, 2), lambda t, i: te.sin(S[t - 1, i]), name="B")
    upd = te.compute((T, 2), lambda t, i: B[t, i] * X[t, i], name="upd")
    s = te.scan(init, upd, S, name="sc")
    r0, r1 = te.reduce_axis(T, "r0"), te.reduce_axis(2, "r1")
    L = te.compute((), lambda: te.sum(s[r0, r1], axis=[r0, r1]), name="L")
    V = te.placeholder((T, 2), name="V", dtype="float64")
    for t in (upd, B, S):
        for simp in (True, False):
            with pytest.raises(te.ScanBodyInputError, match=rf"input {t.name} is part of scan sc"):
                te.differentiate(L, [X, t], simplify=simp)
        with pytest.raises(te.NotDifferentiableError, match=rf"input {t.name} is part of scan sc"):
            te.jvp(L, [t], [V])
    # the scan's output and its inputs stay fine, against finite differences
    x = RNG.standard_normal((T, 2))
    (dx,) = te.differentiate(L, [X]).result
    num = numeric_gradient(L, X, {X: x})
    np.testing.assert_allclose(te.evaluate(dx, {X: x}), num, rtol=1e-6, atol=1e-8)
    (ds,) = te.differentiate(L, [s]).result
    np.testing.assert_array_equal(te.evaluate(ds, {X: x}), np.ones((T, 2)))


_LSE = te.comm_reducer(lambda a, b: te.log(te.exp(a) + te.exp(b)),
                       lambda dt: te.const(-np.inf, dt), name="lse")


@pytest.mark.parametrize("label,body,init_len", [
    # a reduction over the state whose summand reads an input at step t: the reverse
    # scan's argmax / before / after stages read X[T] at tau = 0 (OutOfBoundsError
    # from a load texpr generated itself; attack helper-18)
    ("max", lambda S, X, t, i, k: te.max(S[t - 1, k] * X[t, i], axis=k), 1),
    ("max_reversed_time", lambda S, X, t, i, k: te.max(S[t - 1, k] * X[3 - t, i], axis=k), 1),
    ("max_where", lambda S, X, t, i, k: te.max(S[t - 1, k] * X[t, i], axis=k, where=k < t), 1),
    ("min", lambda S, X, t, i, k: te.min(S[t - 1, k] + X[t, k], axis=k), 1),
    ("prod", lambda S, X, t, i, k: te.prod(S[t - 1, k] * 0.5 + X[t, i], axis=k), 1),
    ("custom", lambda S, X, t, i, k: _LSE(S[t - 1, k] * X[t, i], axis=k), 1),
    ("max_lag2", lambda S, X, t, i, k: te.max(S[t - 2, k] * X[t, i], axis=k), 2),
    # the state read at a data index and at its own: the lag's adjoint is a scatter
    # with an init, whose sum ended below an add ("a reduction below the top")
    ("gather_plus_direct", lambda S, X, t, i, k: S[t - 1, k * 0 + (i + 1) % 3]
     + S[t - 1, i] * X[t, i], 1),
])
def test_scan_gradients_through_step_reductions_and_state_gathers(label, body, init_len):
    T = 4
    X = te.placeholder((T, 3), name="X", dtype="float64")
    S = te.placeholder((T, 3), name="S", dtype="float64")
    I = te.placeholder((T, 3), name="I", dtype="int64")
    k = te.reduce_axis(3, "k")
    init = te.compute((init_len, 3), lambda a, i: X[a, i] * 0.5, name="init")
    if label == "gather_plus_direct":
        upd = te.compute((T, 3), lambda t, i: S[t - 1, I[t, i]] + S[t - 1, i] * X[t, i],
                         name="upd")
    else:
        upd = te.compute((T, 3), lambda t, i: body(S, X, t, i, k), name="upd")
    s = te.scan(init, upd, S, name="sc")
    r, q = te.reduce_axis(T, "r"), te.reduce_axis(3, "q")
    W = te.placeholder((T, 3), name="W", dtype="float64")
    L = te.compute((), lambda: te.sum(s[r, q] * W[r, q], axis=[r, q]), name="L")
    rng = np.random.default_rng(5)
    feed = {X: rng.uniform(0.3, 1.2, (T, 3)), W: rng.standard_normal((T, 3)),
            I: rng.integers(0, 3, (T, 3))}
    num = numeric_gradient(L, X, feed)
    for simp in (False, True):
        (dx,) = te.differentiate(L, [X], simplify=simp).result
        np.testing.assert_allclose(te.evaluate(dx, feed), num, rtol=1e-5, atol=1e-7)


def test_one_update_for_two_states():
    # the same update tensor for two states (as the simplifier's merging of identical
    # stages makes in a reverse scan): each state gets its own copy. The evaluator took
    # the update of a state by the tensor and mixed the two states up (o1 and o2 both
    # wrong from step 2), and the kernel got o2 wrong
    T, n = 5, 3
    X = te.placeholder((T, n), name="X", dtype="float64")
    S1 = te.placeholder((T, n), name="S1", dtype="float64")
    S2 = te.placeholder((T, n), name="S2", dtype="float64")
    a = te.compute((T, n), lambda t, i: S1[t - 1, i] * 0.5 + X[t, i] * S2[t - 1, i], name="a")
    i1 = te.compute((1, n), lambda _, i: X[0, i], name="i1")
    i2 = te.compute((1, n), lambda _, i: X[0, i] * 3.0, name="i2")
    o1, o2 = te.scan([i1, i2], [a, a], [S1, S2], name="sc")
    x = RNG.standard_normal((T, n))
    s1, s2 = np.zeros((T, n)), np.zeros((T, n))
    s1[0], s2[0] = x[0], 3 * x[0]
    for t in range(1, T):
        s1[t] = s2[t] = s1[t - 1] * 0.5 + x[t] * s2[t - 1]
    got = te.evaluate([o1, o2], {X: x})
    np.testing.assert_allclose(got[0], s1, rtol=1e-12)
    np.testing.assert_allclose(got[1], s2, rtol=1e-12)
    kernel = codegen.build([o1, o2], [X])
    for g, w in zip(kernel(x), (s1, s2)):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    j, q = te.reduce_axis(T, "j"), te.reduce_axis(n, "q")
    loss = te.compute((), lambda: te.sum(o1[j, q] * o2[j, q], axis=[j, q]), name="L")
    _check_grads(loss, [X], {X: x}, True)
