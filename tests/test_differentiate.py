"""te.differentiate on the classic cases, against float64 central finite differences."""

import numpy as np
import pytest

import texpr as te
from gradcheck import check_gradients, check_jacobian, feed_for, square_sum, weighted_sum
from texpr.testing import numeric_gradient, numeric_jacobian

F = "float64"


def ph(shape, name, dtype=F):
    return te.placeholder(shape, name, dtype)


# ---- elementwise, layout, reductions ----------------------------------------------


def test_elementwise_math():
    x = ph((2, 3), "X")
    y = ph((2, 3), "Y")
    z = te.compute((2, 3), lambda i, j: te.exp(x[i, j]) * te.sin(y[i, j])
                   + x[i, j] / (1.0 + y[i, j] * y[i, j]) + te.tanh(x[i, j]) * te.sigmoid(y[i, j])
                   - te.log(1.5 + te.cos(x[i, j])) + te.sqrt(2.0 + y[i, j]) * te.abs(x[i, j])
                   + te.power(1.5 + x[i, j], y[i, j]) + te.erf(x[i, j] * y[i, j]), name="Z")
    loss, c = weighted_sum(z)
    feed = feed_for([x, y, c])
    check_gradients(loss, [x, y], feed)


def test_transpose_and_both_loads():
    x = ph((3, 3), "X")
    w = ph((3, 4), "W")
    t = te.compute((4, 3), lambda i, j: x[j, i % 3] * w[j, i], name="T")
    s = te.compute((3, 3), lambda i, j: x[i, j] + x[j, i], name="S")  # A[i,j] + A[j,i]
    loss_t, c1 = weighted_sum(t, "Lt")
    loss_s = square_sum(s, "Ls")
    feed = feed_for([x, w, c1])
    check_gradients(loss_t, [x, w], feed)
    (dx,) = check_gradients(loss_s, [x], feed)
    xv = feed[x]
    np.testing.assert_allclose(dx, 4 * (xv + xv.T))


def test_matmul_reduction_of_products_vs_torch():
    torch = pytest.importorskip("torch")
    x = ph((3, 4), "X")
    w = ph((4, 2), "W")
    k = te.reduce_axis(4, "k")
    y = te.compute((3, 2), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="Y")
    h = te.compute((3, 2), lambda i, j: te.tanh(y[i, j]), name="H")
    loss, c = weighted_sum(h)
    feed = feed_for([x, w, c])
    dx, dw = check_gradients(loss, [x, w], feed)
    tx, tw = (torch.tensor(feed[t], requires_grad=True) for t in (x, w))
    (torch.tanh(tx @ tw) * torch.tensor(feed[c])).sum().backward()
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-12)


def test_reduction_offset_axis_and_where():
    x = ph((4, 6), "X")
    k = te.reduce_axis((1, 5), "k")
    y = te.compute((4,), lambda i: te.sum(x[i, k] * x[i, k + 1], axis=k, where=k <= i + 1),
                   name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    check_gradients(loss, [x], feed)


def test_cumsum_triangular_where():
    x = ph((5,), "X")
    k = te.reduce_axis(5, "k")
    y = te.compute((5,), lambda i: te.sum(x[k], axis=k, where=k <= i), name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    (dx,) = check_gradients(loss, [x], feed)
    np.testing.assert_allclose(dx, np.cumsum(feed[c][::-1])[::-1])


@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_min_reducers(kind):
    red = te.max if kind == "max" else te.min
    x = ph((3, 2, 4), "X")
    a = te.reduce_axis(2, "a")
    b = te.reduce_axis((1, 4), "b")
    y = te.compute((3,), lambda i: red(x[i, a, b] * 2.0 + x[i, a, b - 1], axis=[a, b]), name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c], seed=3)
    check_gradients(loss, [x], feed)


def test_max_where_and_empty_window():
    x = ph((4, 3), "X")
    k = te.reduce_axis(3, "k")
    # row i reduces over k < i: row 0 is empty (-inf) and gets no gradient
    y = te.compute((4,), lambda i: te.max(x[i, k], axis=k, where=k < i), name="Y")
    z = te.compute((4,), lambda i: te.if_then_else(i > 0, y[i], 0.0), name="Z")
    loss, c = weighted_sum(z)
    feed = feed_for([x, c])
    (dx,) = check_gradients(loss, [x], feed)
    assert np.all(dx[0] == 0)


@pytest.mark.parametrize("zeros", [0, 1, 2])
def test_prod_reducer_with_zero_factors(zeros):
    x = ph((2, 4), "X")
    k = te.reduce_axis(4, "k")
    y = te.compute((2,), lambda i: te.prod(x[i, k], axis=k), name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    feed[x][0, :zeros] = 0.0
    (dx,) = check_gradients(loss, [x], feed)
    # exclusive product: the gradient of a row with one zero is nonzero only there
    if zeros == 1:
        assert np.count_nonzero(dx[0]) == 1 and dx[0, 0] != 0
    if zeros == 2:
        assert np.all(dx[0] == 0)


def test_prod_reducer_where_offset():
    x = ph((3, 5), "X")
    k = te.reduce_axis((1, 5), "k")
    y = te.compute((3,), lambda i: te.prod(x[i, k] + 1.0, axis=k, where=k != i + 1), name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    check_gradients(loss, [x], feed)


def test_custom_reducer_logaddexp():
    logaddexp = te.comm_reducer(lambda a, b: te.log(te.exp(a) + te.exp(b)),
                                lambda d: te.const(-np.inf, d), name="logaddexp")
    x = ph((2, 3), "X")
    k = te.reduce_axis(3, "k")
    y = te.compute((2,), lambda i: logaddexp(x[i, k] * 1.5, axis=k), name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    (dx,) = check_gradients(loss, [x], feed)
    xv = feed[x] * 1.5
    soft = np.exp(xv) / np.exp(xv).sum(1, keepdims=True)
    np.testing.assert_allclose(dx, 1.5 * soft * feed[c][:, None])


def test_custom_tuple_reducer_complex_product():
    cmul = te.comm_reducer(lambda a, b: (a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]),
                           lambda d0, d1: (te.const(1, d0), te.const(0, d1)), name="cmul")
    re_ = ph((2, 3), "Re")
    im = ph((2, 3), "Im")
    k = te.reduce_axis(3, "k")
    pr, pi = te.compute((2,), lambda i: cmul((re_[i, k], im[i, k] * re_[i, k]), axis=k), name="P")
    out = te.compute((2,), lambda i: pr[i] * 0.7 + pi[i] * pi[i], name="O")
    loss, c = weighted_sum(out)
    feed = feed_for([re_, im, c])
    check_gradients(loss, [re_, im], feed)


def _argmax_reducer():
    """(value, index) tuple reducer; ``>=`` keeps the accumulator on ties."""
    return te.comm_reducer(
        lambda x, y: (te.if_then_else(x[0] >= y[0], x[0], y[0]),
                      te.if_then_else(x[0] >= y[0], x[1], y[1])),
        lambda vd, idd: (te.const(-np.inf, vd), te.const(-1, idd)), name="argmax")


def test_custom_argmax_tuple_reducer_value_gradient():
    argmax = _argmax_reducer()
    x = ph((3, 4), "X")
    k = te.reduce_axis(4, "k")
    v, idx = te.compute((3,), lambda i: argmax((x[i, k], k), axis=k), name="AM")
    y = te.compute((3,), lambda i: v[i] * te.cast(idx[i] + 1, F), name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    check_gradients(loss, [x], feed)


@pytest.mark.parametrize("simplify", [False, True])
def test_custom_selecting_reducers_give_ties_to_the_first_winner(simplify):
    """A max written with comm_reducer (scalar or as a (value, index) tuple) follows the
    built-in max's tie rule: the first winner in row-major order gets the whole adjoint."""
    mymax = te.comm_reducer(lambda a, b: te.max(a, b), lambda d: te.const(-np.inf, d), name="mymax")
    argmax = _argmax_reducer()
    x = ph((3, 4), "X")
    k = te.reduce_axis(4, "k")
    r = te.reduce_axis(3, "r")
    y1 = te.compute((3,), lambda i: mymax(x[i, k], axis=k), name="Y1")
    y2, _ = te.compute((3,), lambda i: argmax((x[i, k], k), axis=k), name="Y2")
    xv = np.array([[1, 3, 3, 0], [5, 1, 2, 5], [0, 0, 0, 0.0]])
    expected = [[0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    for y in (y1, y2):
        loss = te.compute((), lambda: te.sum(y[r], axis=r), name="L")
        (g,) = te.evaluate(te.differentiate(loss, [x], simplify=simplify).result, {x: xv})
        np.testing.assert_array_equal(g, expected)


@pytest.mark.parametrize("form", ["scalar", "tuple", "product"])
def test_custom_reducer_gradient_nan_patterns_raw_equal_simplified(form):
    """A NaN in a window: the chain rule through a custom reducer multiplies local
    derivatives by select indicators, which are symbolic zeros (docs/conventions.md),
    so the raw adjoint has NaN exactly where the simplified one has (a fuzzed
    argmax once gave NaN in the raw adjoint at points the simplified one skipped)."""
    mymax = te.comm_reducer(lambda a, b: te.max(a, b), lambda d: te.const(-np.inf, d), name="mymax")
    x = ph((2, 4), "X")
    k = te.reduce_axis(4, "k")
    r = te.reduce_axis(2, "r")
    if form == "scalar":
        y = te.compute((2,), lambda i: mymax(x[i, k] * x[i, 3 - k], axis=k), name="Y")
    elif form == "tuple":
        y, _ = te.compute((2,), lambda i: _argmax_reducer()((x[i, k] * x[i, 3 - k], k), axis=k),
                          name="Y")
    else:
        y = te.compute((2,), lambda i: te.prod(x[i, k] - x[i, 0], axis=k, where=k >= 1),
                       name="Y")
    loss = te.compute((), lambda: te.sum(y[r], axis=r), name="L")
    xv = np.array([[-1.5, -0.9, np.nan, 0.3], [0.5, 2.0, -1.0, 1.5]])
    raw = te.evaluate(te.differentiate(loss, [x], simplify=False).result, {x: xv})[0]
    simp = te.evaluate(te.differentiate(loss, [x]).result, {x: xv})[0]
    np.testing.assert_array_equal(np.isnan(raw), np.isnan(simp))
    np.testing.assert_allclose(raw[np.isfinite(raw)], simp[np.isfinite(simp)], rtol=1e-12)
    assert np.isfinite(raw[1]).all()


@pytest.mark.parametrize("form", ["two_loads", "difference", "two_d"])
def test_nan_adjoint_through_several_loads_stays_where_it_belongs(form):
    """An inf input makes the consumer's adjoint NaN at one point; the input is
    loaded at several places, so its Jacobian is a sum of indicator terms: the
    head goes into each term (symbolic zeros), and the raw adjoint is NaN exactly
    where the simplified one is (a fuzzed program once had NaN everywhere raw)."""
    n = 5
    k = te.reduce_axis(3, "k")
    if form == "two_d":
        x = ph((2, n), "X")
        y = te.compute((2, n), lambda a, i: te.sum(
            x[a, (i + k) % n] + x[a, (i + 1) % n] * 0.5, axis=k, where=k <= i), name="Y")
        xv = np.array([[0.3, -np.inf, 0.1, np.inf, 0.4], [0.5, 0.2, -0.3, 0.1, 0.7]])
    else:
        x = ph((n,), "X")
        if form == "two_loads":  # the fuzzed program's form: a guarded load among them
            y = te.compute((n,), lambda i: te.sum(
                x[te.max(te.min((0 - i - k) % 3 + i, n - 1), 0)]
                - (te.if_then_else(i + 1 < n, x[te.min(i + 1, n - 1)], 0.0) + x[i] * -0.75)
                * 0.5, axis=k, where=k <= i), name="Y")
        else:
            y = te.compute((n,), lambda i: te.sum(
                x[(i + k) % n] - x[(i + 2) % n] * 0.25 + x[n - 1 - i], axis=k, where=k <= i),
                name="Y")
        xv = np.array([0.3, -np.inf if form == "two_loads" else -0.2, 0.1, np.inf, 0.4])
    z = te.compute(y.shape, lambda *i: te.exp(te.tanh(y[i])), name="Z")
    loss, c = weighted_sum(z)
    feed = feed_for([x, c])
    feed[x] = xv
    raw = te.evaluate(te.differentiate(loss, [x], simplify=False).result, feed)[0]
    simp = te.evaluate(te.differentiate(loss, [x]).result, feed)[0]
    np.testing.assert_array_equal(np.isnan(raw), np.isnan(simp))
    assert not np.isnan(raw).all()


# ---- index maps ---------------------------------------------------------------------


def test_min_clamped_indices():
    x = ph((5,), "X")
    y = te.compute((6,), lambda i: x[te.min(i + 1, 4)] * 2.0 + x[te.max(i - 2, 0)], name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    check_gradients(loss, [x], feed)


def test_reversal():
    x = ph((10,), "X")
    y = te.compute((10,), lambda i: x[9 - i] * (i + 1.0), name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    (dx,) = check_gradients(loss, [x], feed)
    np.testing.assert_allclose(dx, (feed[c] * np.arange(1, 11))[::-1])


def test_diagonal():
    x = ph((4, 4), "X")
    y = te.compute((4,), lambda i: x[i, i], name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    (dx,) = check_gradients(loss, [x], feed)
    np.testing.assert_allclose(dx, np.diag(feed[c]))


def test_flatten_div_mod_and_strided():
    a = ph((3, 4), "A")
    flat = te.compute((12,), lambda i: a[i // 4, i % 4], name="Flat")
    s = te.compute((5,), lambda i: flat[2 * i + 1] * flat[(3 * i) % 12], name="S")
    loss, c = weighted_sum(s)
    feed = feed_for([a, c])
    check_gradients(loss, [a], feed)


# ---- heads, Jacobians, API -------------------------------------------------------------


def test_full_jacobian_non_scalar_output():
    x = ph((3,), "X")
    w = ph((2, 3), "W")
    k = te.reduce_axis(3, "k")
    y = te.compute((2, 3), lambda i, j: te.sum(w[i, k] * x[k], axis=k) * x[j], name="Y")
    feed = feed_for([x, w])
    check_jacobian(y, x, feed)
    check_jacobian(y, w, feed)


def test_head_prefix_batched():
    x = ph((3, 4), "X")
    k = te.reduce_axis(4, "k")
    y = te.compute((3, 2), lambda i, j: te.sum(x[i, k] * x[j, k] * (j + 1.0), axis=k), name="Y")
    head = ph((5, 2, 3, 2), "Head")
    feed = feed_for([x, head])
    (dx,) = te.differentiate(y, [x], head=head, simplify=False)
    assert dx.shape == (5, 2, 3, 4)
    got = te.evaluate(dx, feed)
    jac = numeric_jacobian(y, x, feed)
    want = np.einsum("pqab,abcd->pqcd", feed[head], jac)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_scalar_output_head_none_is_gradient():
    x = ph((3,), "X")
    k = te.reduce_axis(3, "k")
    loss = te.compute((), lambda: te.sum(x[k] * x[k], axis=k), name="L")
    res = te.differentiate(loss, [x], simplify=False)
    (dx,) = res  # unpacks like the list
    assert res[0] is dx and len(res) == 1 and res.result == [dx]
    feed = feed_for([x])
    np.testing.assert_allclose(te.evaluate(dx, feed), 2 * feed[x])


def test_inputs_none_means_every_float_placeholder():
    x = ph((3,), "X")
    idx = te.placeholder((2,), "I", "int64")
    w = ph((2,), "W")
    y = te.compute((2,), lambda i: x[idx[i]] * w[i], name="Y")
    loss, c = weighted_sum(y)
    res = te.differentiate(loss, simplify=False)
    assert len(res.result) == 3  # X, W and C_Y; not the int tensor I
    assert {id(res.adjoints[t]) for t in (x, w, c)} == {id(r) for r in res.result}
    with pytest.raises(te.NotDifferentiableError, match="I"):
        te.differentiate(loss, [idx])


def test_adjoints_and_summands():
    x = ph((3,), "X")
    a = te.compute((3,), lambda i: x[i] * 2.0, name="A")
    b = te.compute((3,), lambda i: te.exp(x[i]), name="B")
    s = te.compute((3,), lambda i: a[i] * b[i], name="S")
    loss, c = weighted_sum(s)
    res = te.differentiate(loss, [x], simplify=False)
    for t in (loss, s, a, b, x):
        assert t in res.adjoints
    assert c not in res.adjoints  # does not depend on x
    assert set(res.adjoint_summands[x]) == {a, b}
    # one consumer: the contribution is the adjoint, no 0 + x stage
    assert res.adjoints[a] is res.adjoint_summands[a][s]
    assert res.adjoints[x].op.tag == "adjoint_sum"
    feed = feed_for([x, c])
    got = te.evaluate(res.adjoints[s], feed)
    np.testing.assert_allclose(got, feed[c])


def test_intermediate_input_and_unrelated_input():
    x = ph((3,), "X")
    u = ph((2,), "U")
    h = te.compute((3,), lambda i: te.sin(x[i]), name="H")
    y = te.compute((3,), lambda i: h[i] * h[i], name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, u, c])
    dh, dx, du = te.differentiate(loss, [h, x, u], simplify=False)
    hv = np.sin(feed[x])
    np.testing.assert_allclose(te.evaluate(dh, feed), 2 * hv * feed[c])
    np.testing.assert_allclose(te.evaluate(dx, feed), 2 * hv * np.cos(feed[x]) * feed[c])
    assert du.shape == (2,) and np.all(te.evaluate(du, feed) == 0)


def test_errors():
    x = ph((3,), "X")
    y = te.compute((3,), lambda i: x[i] * 2.0, name="Y")
    with pytest.raises(te.ShapeError, match="Y"):
        te.differentiate(y, [x], head=ph((3, 2), "H"))
    yi = te.compute((3,), lambda i: i * 2, name="Yi")
    with pytest.raises(te.NotDifferentiableError, match="Yi"):
        te.differentiate(yi, [x])
    with pytest.raises(te.TexprError):
        te.differentiate(y, ["X"])


def test_simplify_default_gives_same_values():
    x = ph((4,), "X")
    y = te.compute((2,), lambda i: x[2 * i] * x[2 * i + 1], name="Y")
    loss, c = weighted_sum(y)
    feed = feed_for([x, c])
    (raw,) = te.differentiate(loss, [x], simplify=False)
    (default,) = te.differentiate(loss, [x])
    np.testing.assert_allclose(te.evaluate(default, feed), te.evaluate(raw, feed), rtol=1e-12)


# ---- manual overrides --------------------------------------------------------------------


def _flatten_case():
    a = ph((3, 4), "A")
    flat = te.compute((12,), lambda i: a[i // 4, i % 4], name="Flat")
    y = te.compute((12,), lambda i: te.tanh(flat[i]) * (i + 1.0), name="Y")
    loss, c = weighted_sum(y)
    return a, flat, loss, c


def flatten_grad(out, inp, head):
    """Hand-written flatten gradient: dA[p..., a, b] = head[p..., 4a + b]."""
    nprefix = len(head.shape) - len(out.shape)
    shape = head.shape[:nprefix] + inp.shape
    return te.compute(shape, lambda *ax: head[tuple(ax[:nprefix]) + (ax[-2] * 4 + ax[-1],)],
                      name="manual_flatten_grad")


def test_manual_flatten_gradient_equals_automatic():
    a, flat, loss, c = _flatten_case()
    feed = feed_for([a, c])
    (auto,) = te.differentiate(loss, [a], simplify=False)
    for key in [(flat, a), (flat, None), (None, a)]:
        res = te.differentiate(loss, [a], manual={key: flatten_grad}, simplify=False)
        assert res.adjoints[a].op.name == "manual_flatten_grad"
        np.testing.assert_allclose(te.evaluate(res[0], feed), te.evaluate(auto, feed), rtol=1e-12)
    # batched head through the manual function
    head = ph((2, 12), "H")
    feed[head] = np.random.default_rng(1).uniform(size=(2, 12))
    (m,) = te.differentiate(flat, [a], head=head, manual={(flat, a): flatten_grad}, simplify=False)
    (au,) = te.differentiate(flat, [a], head=head, simplify=False)
    np.testing.assert_allclose(te.evaluate(m, feed), te.evaluate(au, feed), rtol=1e-12)


def test_manual_entry_matching_no_edge_is_an_error():
    a, flat, loss, c = _flatten_case()
    other = ph((3,), "Other")
    with pytest.raises(te.TexprError, match="matches no edge"):
        te.differentiate(loss, [a], manual={(other, a): flatten_grad})
    with pytest.raises(te.TexprError, match="matches no edge"):
        te.differentiate(loss, [a], manual={(loss, a): flatten_grad})  # loss does not read A


def test_manual_wrong_shape_is_an_error():
    a, flat, loss, c = _flatten_case()
    bad = lambda out, inp, head: te.compute((12,), lambda i: head[i])  # noqa: E731
    with pytest.raises(te.ShapeError, match="Flat"):
        te.differentiate(loss, [a], manual={(flat, a): bad})


def test_manual_result_of_another_dtype_is_an_error():
    # as JAX's custom_vjp: a float32 contribution in a float64 graph would round
    # the gradient (and, alone on the path, make it float32); it is refused with
    # the edge and both dtypes, never cast silently
    a, flat, loss, c = _flatten_case()

    def as_float32(out, inp, head):
        g = flatten_grad(out, inp, head)
        return te.compute(g.shape, lambda *i: te.cast(g[i], "float32"), name="G32")

    with pytest.raises(te.DTypeError, match=r"\(Flat, A\).*G32 of dtype float32; "
                                             r"expected float64"):
        te.differentiate(loss, [a], manual={(flat, a): as_float32})
    # a float32 graph refuses a float64 result the same way
    a32 = ph((3, 4), "A32", "float32")
    flat32 = te.compute((12,), lambda i: a32[i // 4, i % 4], name="Flat32")
    y32 = te.compute((), lambda: flat32[0] * 2.0, name="Y32")
    as_float64 = lambda out, inp, head: te.compute(  # noqa: E731
        inp.shape, lambda i, j: te.cast(te.if_then_else(te.all(i == 0, j == 0), head[0], 0.0),
                                        "float64"), name="G64")
    with pytest.raises(te.DTypeError, match=r"\(Flat32, A32\).*float64; expected float32"):
        te.differentiate(y32, [a32], manual={(flat32, a32): as_float64})
    # the result in the expected dtype is taken, and the gradient keeps the input's
    ok = lambda out, inp, head: te.compute(  # noqa: E731
        inp.shape, lambda i, j: te.if_then_else(te.all(i == 0, j == 0), head[0], 0.0),
        name="G32ok")
    (d,) = te.differentiate(y32, [a32], manual={(flat32, a32): ok}, simplify=False)
    assert d.dtype == "float32"
    want = np.zeros((3, 4), "float32")
    want[0, 0] = 2.0
    np.testing.assert_array_equal(te.evaluate(d, {a32: np.ones((3, 4), "float32")}), want)


# ---- second order --------------------------------------------------------------------------


def _mlp():
    x = ph((3, 4), "X")
    w1 = ph((4, 5), "W1")
    w2 = ph((5, 2), "W2")
    k = te.reduce_axis(4, "k")
    h = te.compute((3, 5), lambda i, j: te.tanh(te.sum(x[i, k] * w1[k, j], axis=k)), name="Hid")
    m = te.reduce_axis(5, "m")
    o = te.compute((3, 2), lambda i, j: te.sum(h[i, m] * w2[m, j], axis=m), name="Out")
    r = te.reduce_axis(3, "r")
    s = te.reduce_axis(2, "s")
    loss = te.compute((), lambda: te.sum(te.sigmoid(o[r, s]) * o[r, s], axis=[r, s]), name="L")
    return x, w1, w2, loss


def test_hessian_vector_product_mlp():
    x, w1, w2, loss = _mlp()
    v1 = ph((4, 5), "V1")
    v2 = ph((5, 2), "V2")
    feed = feed_for([x, w1, w2, v1, v2], seed=5)
    g1, g2 = te.differentiate(loss, [w1, w2], simplify=False)
    # gradient of <g, v> w.r.t. the weights: the Hessian-vector product
    a = te.reduce_axis(4, "a")
    b = te.reduce_axis(5, "b")
    c = te.reduce_axis(5, "c")
    d = te.reduce_axis(2, "d")
    gv1 = te.compute((), lambda: te.sum(g1[a, b] * v1[a, b], axis=[a, b]), name="GV1")
    gv2 = te.compute((), lambda: te.sum(g2[c, d] * v2[c, d], axis=[c, d]), name="GV2")
    gv = te.compute((), lambda: gv1[()] + gv2[()], name="GV")
    h1, h2 = te.differentiate(gv, [w1, w2], simplify=False)
    got1, got2 = te.evaluate([h1, h2], feed)
    # finite differences of the gradient along v
    eps = 1e-5
    plus, minus = dict(feed), dict(feed)
    plus[w1], plus[w2] = feed[w1] + eps * feed[v1], feed[w2] + eps * feed[v2]
    minus[w1], minus[w2] = feed[w1] - eps * feed[v1], feed[w2] - eps * feed[v2]
    gp = te.evaluate([g1, g2], plus)
    gm = te.evaluate([g1, g2], minus)
    np.testing.assert_allclose(got1, (gp[0] - gm[0]) / (2 * eps), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got2, (gp[1] - gm[1]) / (2 * eps), rtol=1e-6, atol=1e-9)


def test_second_order_of_max_and_head():
    x = ph((2, 3), "X")
    k = te.reduce_axis(3, "k")
    y = te.compute((2,), lambda i: te.max(x[i, k] * x[i, k] * x[i, k], axis=k), name="Y")
    loss, c = weighted_sum(y)
    (g,) = te.differentiate(loss, [x], simplify=False)
    l2 = square_sum(g, "L2")
    feed = feed_for([x, c], seed=2)
    (h,) = te.differentiate(l2, [x], simplify=False)
    np.testing.assert_allclose(te.evaluate(h, feed), numeric_gradient(l2, x, feed),
                               rtol=1e-6, atol=1e-8)


# ---- scatter-add stages -------------------------------------------------------------------


def test_scatter_add_stage():
    x = ph((3,), "X")
    init = ph((4,), "Init")
    idx = te.placeholder((3,), "I", "int64")
    s = te.scatter_add((4,), F, (3,), lambda p: idx[p], lambda p: x[p] * x[p], init=init, name="S")
    loss, c = weighted_sum(te.compute((4,), lambda i: te.sin(s[i]), name="Y"))
    feed = feed_for([x, init, c])
    feed[idx] = np.array([2, 0, 2])
    check_gradients(loss, [x, init], feed)


# ---- done-when: a 2-layer conv net ---------------------------------------------------------


def _conv_net():
    nn = te.nn
    x = ph((2, 1, 6, 6), "X")
    labels = te.placeholder((2,), "labels", "int64")
    w1, b1 = ph((2, 1, 3, 3), "W1"), ph((2,), "b1")
    w2, b2 = ph((3, 2, 2, 2), "W2"), ph((3,), "b2")
    w3, b3 = ph((4, 3), "W3"), ph((4,), "b3")
    h = nn.max_pool2d(nn.relu(nn.conv2d(x, w1, b1, padding=0)), 2)  # (2, 2, 2, 2)
    h = nn.relu(nn.conv2d(h, w2, b2))  # (2, 3, 1, 1)
    logits = nn.dense(nn.flatten(h), w3, b3)  # (2, 4)
    loss = nn.cross_entropy(logits, labels)
    weights = [w1, b1, w2, b2, w3, b3]
    feed = feed_for([x] + weights, seed=11)
    feed[labels] = np.array([1, 3])
    return loss, weights, feed, x, labels


@pytest.mark.parametrize("simplify", [False, True])
def test_conv_net_loss_all_weights(simplify):
    loss, weights, feed, x, labels = _conv_net()
    res = te.differentiate(loss, weights, simplify=simplify)
    got = te.evaluate(list(res.result), feed)
    for g, w in zip(got, weights):
        fd = numeric_gradient(loss, w, feed)
        assert g.shape == w.shape
        assert np.abs(g - fd).max() <= 1e-6 * np.abs(fd).max(), w.name
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9, err_msg=w.name)


def test_conv_net_vs_torch():
    torch = pytest.importorskip("torch")
    loss, weights, feed, x, labels = _conv_net()
    got = te.evaluate(list(te.differentiate(loss, weights, simplify=False)), feed)
    tw = [torch.tensor(feed[w], requires_grad=True) for w in weights]
    f = torch.nn.functional
    h = f.max_pool2d(f.relu(f.conv2d(torch.tensor(feed[x]), tw[0], tw[1])), 2)
    h = f.relu(f.conv2d(h, tw[2], tw[3]))
    out = f.cross_entropy(f.linear(h.flatten(1), tw[4], tw[5]), torch.tensor(feed[labels]))
    np.testing.assert_allclose(te.evaluate(loss, feed), out.item(), rtol=1e-12)
    out.backward()
    for g, t in zip(got, tw):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-14)


# ---- heads through every reducer, float32, random programs -----------------------------------


def _reducer_stage(kind, x):
    k = te.reduce_axis(4, "k")
    if kind == "sum":
        return te.compute((3,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="R")
    if kind == "max":
        return te.compute((3,), lambda i: te.max(x[i, k] * 2.0, axis=k, where=k != i), name="R")
    if kind == "min":
        return te.compute((3,), lambda i: te.min(te.sin(x[i, k]), axis=k), name="R")
    if kind == "prod":
        return te.compute((3,), lambda i: te.prod(x[i, k] + 0.5, axis=k), name="R")
    lae = te.comm_reducer(lambda a, b: te.log(te.exp(a) + te.exp(b)),
                          lambda d: te.const(-np.inf, d), name="logaddexp")
    return te.compute((3,), lambda i: lae(x[i, k], axis=k), name="R")


@pytest.mark.parametrize("kind", ["sum", "max", "min", "prod", "custom"])
def test_batched_head_through_reducers(kind):
    x = ph((3, 4), "X")
    r = _reducer_stage(kind, x)
    head = ph((2, 3), "Head")
    feed = feed_for([x, head], seed=7)
    (dx,) = te.differentiate(r, [x], head=head, simplify=False)
    want = np.einsum("pa,abc->pbc", feed[head], numeric_jacobian(r, x, feed))
    np.testing.assert_allclose(te.evaluate(dx, feed), want, rtol=1e-6, atol=1e-8)
    check_jacobian(r, x, feed)


def test_float32_gradients_stay_float32():
    x = te.placeholder((3, 4), "X")
    w = te.placeholder((4,), "W")
    k = te.reduce_axis(4, "k")
    y = te.compute((3,), lambda i: te.tanh(te.sum(x[i, k] * w[k], axis=k)) * 2.0, name="Y")
    r = te.reduce_axis(3, "r")
    loss = te.compute((), lambda: te.max(y[r], axis=r) + te.sum(te.sqrt(y[r] * y[r] + 1.0), axis=r),
                      name="L")
    dx, dw = te.differentiate(loss, [x, w], simplify=False)
    assert dx.dtype == "float32" and dw.dtype == "float32"
    feed32 = {t: v.astype("float32") for t, v in feed_for([x, w]).items()}
    got = te.evaluate([dx, dw], feed32)
    assert got[0].dtype == np.float32
    x64, w64 = ph((3, 4), "X"), ph((4,), "W")
    k = te.reduce_axis(4, "k")
    y64 = te.compute((3,), lambda i: te.tanh(te.sum(x64[i, k] * w64[k], axis=k)) * 2.0)
    r = te.reduce_axis(3, "r")
    l64 = te.compute((), lambda: te.max(y64[r], axis=r)
                     + te.sum(te.sqrt(y64[r] * y64[r] + 1.0), axis=r))
    want = te.evaluate(list(te.differentiate(l64, [x64, w64], simplify=False)),
                       {x64: feed32[x].astype(F), w64: feed32[w].astype(F)})
    for g, wv in zip(got, want):
        np.testing.assert_allclose(g, wv, rtol=1e-4, atol=1e-6)


_UNARY = [
    lambda v: te.exp(v * 0.5), te.tanh, te.sigmoid, te.sin, lambda v: v * v,
    lambda v: te.sqrt(v * v + 1.0), lambda v: te.log(v * v + 1.0), te.abs,
    lambda v: te.if_then_else(v > 0, v, 0.1 * v), lambda v: te.power(v * v + 1.0, 1.5),
]
_INDEX = [
    lambda t: lambda i, j: t[i, j],
    lambda t: lambda i, j: t[i, 2 - j],
    lambda t: lambda i, j: t[3 - i, j],
    lambda t: lambda i, j: t[te.min(i + 1, 3), j],
    lambda t: lambda i, j: te.if_then_else(i >= 1, t[te.max(i - 1, 0), j], 0.0),
    lambda t: lambda i, j: t[(i + j) % 4, j],
    lambda t: lambda i, j: t[i, (i * 3 + j) // 2 % 3],
]
_BINARY = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b,
           lambda a, b: a / (1.0 + b * b), te.max, te.min]


def _random_program(rng):
    xs = [ph((4, 3), "X0"), ph((4, 3), "X1")]
    pool = list(xs)
    for s in range(int(rng.integers(2, 5))):
        kind = rng.integers(0, 4)
        a = pool[int(rng.integers(len(pool)))]
        b = pool[int(rng.integers(len(pool)))]
        name = f"S{s}"
        if kind == 0:
            f, g = _UNARY[int(rng.integers(len(_UNARY)))], _INDEX[int(rng.integers(len(_INDEX)))](a)
            t = te.compute((4, 3), lambda i, j: f(g(i, j)), name=name)
        elif kind == 1:
            f = _BINARY[int(rng.integers(len(_BINARY)))]
            g = _INDEX[int(rng.integers(len(_INDEX)))](b)
            t = te.compute((4, 3), lambda i, j: f(a[i, j], g(i, j)), name=name)
        elif kind == 2:
            red = [te.sum, te.max, te.min, te.prod][int(rng.integers(4))]
            k = te.reduce_axis(3, "k")
            r = te.compute((4,), lambda i: red(a[i, k] * b[i, 2 - k], axis=k,
                                               where=k <= i if rng.integers(2) else None),
                           name=name + "r")
            t = te.compute((4, 3), lambda i, j: te.if_then_else(i > 0, r[i], 0.0) + b[i, j],
                           name=name)
        else:
            k = te.reduce_axis(3, "k")
            t = te.compute((4, 3), lambda i, j: te.sum(a[i, k] * b[(i + k) % 4, j], axis=k),
                           name=name)
        pool.append(t)
    return xs, pool[-1]


@pytest.mark.parametrize("seed", range(24))
def test_random_programs(seed):
    print("seed", seed)
    xs, out = _random_program(np.random.default_rng(seed))
    loss, c = weighted_sum(out)
    feed = feed_for(xs + [c], seed=seed)
    check_gradients(loss, xs, feed, rtol=1e-5, atol=1e-7)


def test_jvp_by_differentiating_through_the_head():
    # d/dV <vjp(Y, X, V), U> = J U: adjoints are differentiable in their head too
    x = ph((3,), "X")
    y = te.compute((2,), lambda i: te.exp(x[i] * x[i + 1]) + x[2] * i, name="Y")
    v = ph((2,), "V")
    u = ph((3,), "U")
    (g,) = te.differentiate(y, [x], head=v, simplify=False)
    a = te.reduce_axis(3, "a")
    gu = te.compute((), lambda: te.sum(g[a] * u[a], axis=a), name="GU")
    (ju,) = te.differentiate(gu, [v], simplify=False)
    feed = feed_for([x, v, u])
    np.testing.assert_allclose(te.evaluate(ju, feed), numeric_jacobian(y, x, feed) @ feed[u],
                               rtol=1e-6, atol=1e-8)


def test_manual_wildcard_everywhere_and_clash():
    a, flat, loss, c = _flatten_case()
    calls = []

    def zero(out, inp, head):
        calls.append((out.name, inp.name))
        return te.compute(head.shape[:head.ndim - out.ndim] + inp.shape,
                          lambda *i: te.const(0.0, head.dtype), name="Z")

    (da,) = te.differentiate(loss, [a], manual={(None, None): zero}, simplify=False)
    assert calls[0][0] == loss.name
    feed = feed_for([a, c])
    np.testing.assert_array_equal(te.evaluate(da, feed), np.zeros(a.shape))
    with pytest.raises(te.TexprError, match="several manual entries"):
        te.differentiate(loss, [a], manual={(flat, None): flatten_grad, (None, a): flatten_grad})


# ---- the raw adjoint form (what simplify builds on) ----------------------------------------


def test_raw_form_is_regular():
    from texpr.expr import Load, Mul, Reduce, Select
    from texpr.visitor import loads

    x = ph((4, 3), "X")
    w = ph((3,), "W")
    k = te.reduce_axis(3, "k")
    y = te.compute((4,), lambda i: te.sum(x[i, k] * w[k] + w[k], axis=k, where=k != i), name="Y")
    head = ph((2, 4), "H")
    res = te.differentiate(y, [x, w], head=head, simplify=False)
    dx = res.adjoint_summands[x][y]
    assert res.adjoints[x] is dx and dx.shape == (2, 4, 3)
    op = dx.op
    assert op.tag == "adjoint_contribution" and op.attrs == {"out": "Y", "inp": "X"}
    body = op.body[0]
    assert isinstance(body, Reduce) and body.combiner.kind == "sum"
    assert [a.extent for a in body.axes] == [4, 3]  # i' mirrors Y's axis, k' mirrors k
    assert not isinstance(body.where, te.expr.Const)  # Y's where= carried over
    src = body.source[0]
    # the load indicator wraps head * dB/dX = H[p, i'] * W[k'] (the head inside the
    # select: an inf/NaN head never meets the structural zeros, see jacobian.head_times)
    assert isinstance(src, Select)
    prod = src.true_value
    assert isinstance(prod, Mul) and isinstance(prod.a, Load) and prod.a.tensor is head
    assert [ld.tensor.name for ld in loads(prod.b)] == ["W"]
    # the W term of the body does not depend on X: no trace of it in dX (symbolic zeros)
    assert len(loads(src, w)) == 1
    # identity head for head=None
    res = te.differentiate(y, [x], simplify=False)
    assert res.head.op.tag == "identity_head" and res.head.shape == (4, 4)
    feed = feed_for([x])
    np.testing.assert_array_equal(te.evaluate(res.head, feed), np.eye(4))
    # max reductions: an argmax stage, the indicator of its flat index outside the product
    m = te.compute((4,), lambda i: te.max(x[i, k], axis=k), name="M")
    (dm,) = te.differentiate(m, [x], head=ph((4,), "HM"), simplify=False)
    src = dm.op.body[0].source[0]
    assert isinstance(src, Select)
    arg = [ld.tensor for ld in loads(src.args[0])]
    assert len(arg) == 1 and arg[0].op.tag == "argmax" and arg[0].dtype == "int64"
