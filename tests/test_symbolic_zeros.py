"""Symbolic zeros read the same way by a decision and by its derivative
(simplify/zeros.py, docs/conventions.md "Zeros").

A ``select(c, a, 0) * b`` with a NaN or inf ``b`` where ``c`` fails is 0 to the
simplifier (a symbolic zero) and NaN to IEEE arithmetic. The simplified graph
used to compute such a product in IEEE arithmetic where it fed a decision (the
argmax of a max, a comparison) and read the chosen term's derivative
symbolically, so its gradient was neither the unsimplified graph's IEEE
gradient nor its symbolic one (fuzz seed 7001702771). Every test here failed
before the products were written ``select(c, a * b, 0)``.
"""

import numpy as np

import fuzz
import texpr as te
from texpr import codegen, simplify
from texpr.testing import symbolic_zero_products

NAN = np.nan


def _values(outs, inputs, feed):
    """te.evaluate of the simplified graph and its compiled kernel (float64)."""
    simp = list(simplify.simplify(outs))
    ref = te.evaluate(simp, feed)
    got = codegen.build(outs, inputs)(*[feed[t] for t in inputs])
    return ref, got


def _max_of_guarded_products():
    A = te.placeholder((3,), "A", "float64")
    B = te.placeholder((3,), "B", "float64")
    k = te.reduce_axis(3, "k")
    Y = te.compute((), lambda: te.max(te.if_then_else(k >= 1, A[k], 0.0) * B[k], axis=k),
                   name="Y")
    return A, B, Y


def test_a_max_chooses_among_the_symbolic_values():
    # k = 0 is a symbolic zero (B[0] is NaN there): the maximum is 2 at k = 1,
    # which receives the whole adjoint, as the symbolic reading of the
    # unsimplified graph says; the simplified gradient was 0 everywhere (its
    # argmax fell on k = 0, the IEEE NaN)
    A, B, Y = _max_of_guarded_products()
    feed = {A: np.array([1.0, 2.0, 3.0]), B: np.array([NAN, 1.0, 0.5])}
    dA, dB = te.differentiate(Y, [A, B]).result
    with symbolic_zero_products():
        sym = te.evaluate([Y, *te.differentiate(Y, [A, B], simplify=False).result], feed)
    np.testing.assert_array_equal(sym[1], [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(sym[2], [0.0, 2.0, 0.0])
    for vals in _values([Y, dA, dB], [A, B], feed):
        np.testing.assert_array_equal(vals[0], 2.0)
        np.testing.assert_array_equal(vals[1], sym[1])
        np.testing.assert_array_equal(vals[2], sym[2])


def test_a_min_behind_a_materialised_guarded_product():
    # the guarded product is a stage of its own (read by a min and by a sum), so
    # the choice is made on that stage's values: they must be symbolic too
    A = te.placeholder((4,), "A", "float64")
    B = te.placeholder((4,), "B", "float64")
    E = te.compute((4,), lambda i: te.if_then_else(i % 2 == 1, A[i], 0.0) * te.exp(B[i]),
                   name="E")
    k, j = te.reduce_axis(4, "k"), te.reduce_axis(4, "j")
    M = te.compute((), lambda: te.min(E[k], axis=k), name="M")
    S = te.compute((), lambda: te.sum(E[j], axis=j), name="S")
    L = te.compute((), lambda: M[()] + S[()], name="L")
    feed = {A: np.array([5.0, -1.0, 7.0, -3.0]), B: np.array([NAN, 0.0, np.inf, 1.0])}
    dA, dB = te.differentiate(L, [A, B]).result
    e = np.exp(1.0)
    # symbolically E = [0, -1, 0, -3e]: min -3e at 3, sum -1 - 3e
    for vals in _values([L, dA, dB], [A, B], feed):
        np.testing.assert_allclose(vals[0], -1.0 - 6.0 * e)
        np.testing.assert_allclose(vals[1], [0.0, 1.0, 0.0, 2.0 * e])
        np.testing.assert_allclose(vals[2], [0.0, -1.0, 0.0, -6.0 * e])


def test_a_comparison_reads_the_symbolic_zero():
    # select(E >= 0, ..) on E = select(c, a, 0) * b with b = inf where c fails:
    # symbolically E = 0 and E >= 0 holds; the gradient follows that branch
    A = te.placeholder((3,), "A", "float64")
    B = te.placeholder((3,), "B", "float64")
    E = te.compute((3,), lambda i: te.if_then_else(i >= 1, A[i], 0.0) * B[i], name="E")
    Z = te.compute((3,), lambda i: te.if_then_else(E[i] >= 0.0, 2.0 * A[i], -A[i]), name="Z")
    r = te.reduce_axis(3, "r")
    L = te.compute((), lambda: te.sum(Z[r], axis=r), name="L")
    feed = {A: np.array([1.5, -2.0, 3.0]), B: np.array([np.inf, 1.0, 1.0])}
    (dA,) = te.differentiate(L, [A]).result
    for vals in _values([L, dA], [A, B], feed):
        np.testing.assert_allclose(vals[0], 2.0 * 1.5 + 2.0 + 6.0)
        np.testing.assert_array_equal(vals[1], [2.0, -1.0, 2.0])


def test_the_fuzz_seed_that_found_it():
    findings = fuzz.check_programs([7001702771], batch=1)
    assert not findings, "\n".join(map(str, findings))


def test_products_become_guarded_selects():
    from texpr import expr as E
    from texpr.simplify.zeros import explicit_zeros

    X = te.placeholder((4,), "X", "float64")
    i = E.iter_var(0, 4, "i", "spatial")
    c = i >= 1
    guarded = E.mul(E.select(c, X[i], E.const(0.0, "float64")), te.exp(X[i]))
    out = explicit_zeros(guarded)
    assert isinstance(out, E.Select) and out.cond is c
    assert isinstance(out.true_value, E.Mul) and out.false_value.value == 0
    assert explicit_zeros(out) is out  # nothing left to push
    # nested: both selects end up outside the product; a quotient too
    two = E.mul(E.select(c, X[i], E.const(0.0, "float64")),
                E.select(i <= 2, X[i], E.const(0.0, "float64")))
    nested = explicit_zeros(two)
    assert isinstance(nested, E.Select) and isinstance(nested.true_value, E.Select)
    quo = explicit_zeros(E.div(E.select(c, X[i], E.const(0.0, "float64")), X[i]))
    assert isinstance(quo, E.Select) and isinstance(quo.true_value, E.Div)
    # a zero the user wrote as a number keeps its IEEE meaning, integers are left
    written = E.mul(X[i], E.const(0.0, "float64"))
    assert explicit_zeros(written) is written
    ints = E.mul(E.select(c, i, E.const(0, "int64")), i)
    assert explicit_zeros(ints) is ints
