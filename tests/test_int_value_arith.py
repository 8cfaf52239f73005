"""Integer ``+ - * //`` on values never wraps around in a kernel.

``te.evaluate`` computes integer arithmetic exactly and raises where a result
leaves its dtype; the kernels wrapped around silently (``-N[i]`` at ``N[i] =
-2**63`` gave ``-2**63``, ``N[i] * 3`` gave ``-2**63`` too, an attack). Value
arithmetic whose interval may leave the dtype is now computed by checked helpers
(codegen.backends.numba_cpu.runtime ``_iadd``/``_isub``/``_imul``/``_ifloordiv``), which fail with the
evaluator's error. Index arithmetic is unchanged: it is proven in range at build time.
"""

import importlib
import itertools
import sys

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu import runtime
from texpr.codegen.loopnest import stage
from texpr.codegen.loopnest.emit import TEXT_MAX_HEIGHT

from emit_testutil import nesting

N = te.placeholder((3,), "N", "int64")
M = te.placeholder((3,), "M", "int32")
X = te.placeholder((6,), "X", "float64")

_CASES = {
    "neg": (lambda i: -N[i], [N]),
    "times3": (lambda i: N[i] * 3, [N]),
    "minus_one": (lambda i: N[i] * -1, [N]),
    "sum": (lambda i: N[i] + N[(i + 1) % 3], [N]),
    "diff": (lambda i: N[i] - N[(i + 2) % 3], [N]),
    "square32": (lambda i: M[i] * M[i], [M]),
}
_WRAPS = {N: np.array([-2**63, 5, 2**62], dtype=np.int64),
          M: np.array([2**16, 3, -7], dtype=np.int32)}
_FITS = {N: np.array([-2**40, 5, 2**40], dtype=np.int64),
         M: np.array([2**10, 3, -7], dtype=np.int32)}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_the_kernel_raises_where_the_evaluator_does_and_agrees_elsewhere(name):
    fn, inputs = _CASES[name]
    out = te.compute((3,), fn, name=name)
    kernel = codegen.build([out], inputs, parallel=False, blas=False)
    for feed in (_WRAPS, _FITS):
        args = [feed[t] for t in inputs]
        try:
            want = te.evaluate(out, {t: feed[t] for t in inputs})
        except te.TexprError:
            with pytest.raises(te.TexprError, match="would wrap around"):
                kernel(*args)
            continue
        np.testing.assert_array_equal(kernel(*args)[0], want)
    # the wrapping feeds do overflow (else the test checks nothing) except the sum:
    # -2**63 + 5 and 5 + 2**62 fit
    if name != "sum":
        with pytest.raises(te.TexprError):
            te.evaluate(out, {t: _WRAPS[t] for t in inputs})


def test_index_arithmetic_is_proven_not_checked_per_operation():
    I = te.placeholder((3,), "I", "int64")
    Y = te.compute((3,), lambda i: X[I[i] + 1] * 2.0, name="Y")
    kernel = codegen.build([Y], [X, I], parallel=False, blas=False)
    assert not any(f"{h}(" in kernel.source for h in ("_iadd", "_isub", "_imul"))
    xv = np.arange(6.0)
    np.testing.assert_array_equal(kernel(xv, np.array([0, 4, 2]))[0], [2.0, 10.0, 6.0])
    # a value bounded by its axis needs no check either
    Z = te.compute((3,), lambda i: i * 5 + 1, name="Z")
    kz = codegen.build([Z], [], parallel=False, blas=False)
    assert "_imul(" not in kz.source and "_iadd(" not in kz.source
    np.testing.assert_array_equal(kz()[0], [1, 6, 11])


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    d = tmp_path_factory.mktemp("rt")
    (d / "texpr_rt_test.py").write_text(runtime.SOURCE)
    sys.path.insert(0, str(d))
    try:
        yield importlib.import_module("texpr_rt_test")
    finally:
        sys.path.remove(str(d))


_EDGES = [0, 1, -1, 2, -2, 3, -3, 2**31, -2**31, 2**31 - 1, 2**32, 3037000499, 3037000500,
          -3037000500, 2**62, -2**62, 2**63 - 1, -2**63, -2**63 + 1, 2**62 + 1]


@pytest.mark.parametrize("fn,op", [("_iadd", lambda a, b: a + b),
                                   ("_isub", lambda a, b: a - b),
                                   ("_imul", lambda a, b: a * b)])
def test_the_checked_helpers_fail_exactly_where_the_result_leaves_the_dtype(helpers, fn, op):
    # LLVM assumes signed arithmetic does not wrap: a test of the result after the
    # operation (a * b // b == a) was folded away, so the helpers test operands
    f = getattr(helpers, fn)
    rng = np.random.default_rng(5)
    pairs = list(itertools.product(_EDGES, _EDGES))
    pairs += [(int(a), int(b)) for a, b in rng.integers(-2**63, 2**63 - 1, (200, 2))]
    for a, b in pairs:
        for narrow in (0, 1):
            lim = 2**31 if narrow else 2**63
            if narrow and not (-lim <= a < lim and -lim <= b < lim):
                continue
            err = np.zeros(2, np.int64)
            r = f(np.int64(a), np.int64(b), np.int64(narrow), err, np.int64(7))
            exact = op(a, b)
            if -lim <= exact < lim:
                assert err[0] == 0 and int(r) == exact, (fn, a, b, narrow)
            else:
                assert err[0] == 7 and err[1] == a, (fn, a, b, narrow)


def _agree(outs, inputs, feed):
    """The kernel raises "would wrap around" where te.evaluate does, else equals it."""
    kernel = codegen.build(outs, inputs, parallel=False, blas=False)
    args = [feed[t] for t in inputs]
    try:
        want = te.evaluate(outs, feed)
    except te.TexprError as exc:
        assert "would wrap around" in str(exc)
        with pytest.raises(te.TexprError, match="would wrap around"):
            kernel(*args)
        return False
    for got, w in zip(kernel(*args), want):
        np.testing.assert_array_equal(got, w)
    return True


def test_value_arithmetic_under_a_cast_in_a_comparison_or_an_index_is_checked():
    # an attack: the index proof follows integer operands only, so a cast to float
    # hid N[i] * N[i] from it, and the value walk stopped at the comparison or
    # load: 2**62 * 2**62 wrapped to 0, the select and the gather silently wrong
    y1 = te.compute((3,), lambda i: te.if_then_else(
        te.cast(N[i] * N[i], "float64") > 1.0, 1.0, 0.0), name="Y1")
    y2 = te.compute((3,), lambda i: X[te.cast(te.cast(N[i] * N[i], "float64"), "int64") % 6],
                    name="Y2")
    k = te.reduce_axis(3, "k")
    y3 = te.compute((), lambda: te.sum(X[k], axis=k,
                                       where=te.cast(N[k] * 3, "float64") > 0.0), name="Y3")
    for y, ins in ((y1, [N]), (y2, [N, X]), (y3, [N, X])):
        xs = np.arange(6.0)
        assert not _agree([y], ins, {N: np.array([2**62, 3, -5]), X: xs})
        assert _agree([y], ins, {N: np.array([2**10, 3, -5]), X: xs})


def test_integer_arithmetic_in_a_custom_combine_is_checked():
    # the combine is written by an emitter of its own, which had no checks
    P = te.placeholder((2, 3), "P", "int64")
    k = te.reduce_axis(3, "k")
    mul = te.comm_reducer(lambda a, b: a * b, lambda d: te.const(1, d), name="mymul")
    add = te.comm_reducer(lambda a, b: a - (0 - b), lambda d: te.const(0, d), name="myadd")
    prod = te.compute((2,), lambda i: mul(P[i, k], axis=k), name="Prod")
    total = te.compute((2,), lambda i: add(P[i, k], axis=k), name="Total")
    for out in (prod, total):
        wraps = np.full((2, 3), 3037000500 if out is prod else 2**62, dtype=np.int64)
        assert not _agree([out], [P], {P: wraps})
        assert _agree([out], [P], {P: np.array([[1, -2, 3], [4, 5, -6]])})


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_int_min_floor_divided_by_minus_one_raises_in_kernel_and_evaluator(dtype):
    # INT_MIN // -1 is the one floor division that leaves its dtype: numba gave 0
    # (int64), numpy INT_MIN, neither raised. Variants: a divisor from data, a
    # constant -1, and one inside a custom combine
    low = np.iinfo(dtype).min
    A = te.placeholder((3,), "A", dtype)
    B = te.placeholder((3,), "B", dtype)
    q = te.compute((3,), lambda i: A[i] // B[i], name="Q")
    neg = te.compute((3,), lambda i: A[i] // te.const(-1, dtype), name="Neg")
    rem = te.compute((3,), lambda i: A[i] % B[i], name="Rem")
    bad = {A: np.array([5, low, low], dtype), B: np.array([2, -1, 3], dtype)}
    good = {A: np.array([5, low, low], dtype), B: np.array([-2, 2, 3], dtype)}
    assert not _agree([q], [A, B], bad)
    assert _agree([q], [A, B], good)
    assert not _agree([neg], [A], {A: bad[A]})
    assert _agree([neg], [A], {A: np.array([5, -7, low + 1], dtype)})
    # the remainder never leaves the dtype: INT_MIN % -1 is 0 everywhere
    assert _agree([rem], [A, B], bad)
    P = te.placeholder((2, 3), "P", dtype)
    k = te.reduce_axis(3, "k")
    div = te.comm_reducer(lambda a, b: a // (b - 2), lambda d: te.const(low, d), name="mydiv")
    out = te.compute((2,), lambda i: div(P[i, k], axis=k), name="Div")
    assert not _agree([out], [P], {P: np.ones((2, 3), dtype)})
    assert _agree([out], [P], {P: np.full((2, 3), 4, dtype)})


def test_index_floor_division_by_minus_one_of_a_loaded_value_is_proven():
    # in an index, a loaded int is range-checked to +-2**31: its // -1 is proven
    I = te.placeholder((3,), "I", "int64")
    Y = te.compute((3,), lambda i: X[(I[i] // -1) % 6], name="Yd")
    kernel = codegen.build([Y], [X, I], parallel=False, blas=False)
    assert "_ifloordiv(" not in kernel.source
    np.testing.assert_array_equal(kernel(np.arange(6.0), np.array([1, -2, 7]))[0],
                                  te.evaluate(Y, {X: np.arange(6.0), I: np.array([1, -2, 7])}))


def _wide_combine(chain, leaves):
    """A combine ``select(a > b, max(a -+ b ... (chain checked ops), a tree of
    max/min over leaves), b)``: deep text, and with 1,100 leaves a DAG of more
    than codegen's LET_MAX_DAG_NODES nodes."""
    def combine(a, b):
        e = a
        for j in range(chain):
            e = e + b if j % 2 else e - b
        lv = [te.min(a, te.const(-j, "int64")) for j in range(leaves)]
        while len(lv) > 1:
            lv = [te.max(lv[i], lv[i + 1]) for i in range(0, len(lv) - 1, 2)] + (
                lv[-1:] if len(lv) % 2 else [])
        return te.if_then_else(a > b, te.max(e, lv[0]), b)
    return combine


def test_a_deep_custom_combine_builds_and_agrees(monkeypatch):
    # a combine's text nested 105 levels of checked operations in one line: a raw
    # SyntaxError from the parser (the height bound did not reach combines, and
    # then not a select over a DAG of more than LET_MAX_DAG_NODES = 2,000 nodes: an
    # attack's 1,100 leaves; here the bound is lowered to 60 to build in seconds)
    monkeypatch.setattr(stage, "LET_MAX_DAG_NODES", 60)
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    P = te.placeholder((2, 3), "P", "int64")
    k = te.reduce_axis(3, "k")
    pv = np.arange(6).reshape(2, 3)
    for chain, leaves in ((60, 4), (60, 40)):
        red = te.comm_reducer(_wide_combine(chain, leaves), lambda d: te.const(-2**63, d),
                              name="deep")
        out = te.compute((2,), lambda i: red(P[i, k], axis=k), name="Deep")
        kernel = codegen.build([out], [P], parallel=False, blas=False)
        assert all(nesting(line) <= TEXT_MAX_HEIGHT for line in kernel.source.splitlines())
        assert _agree([out], [P], {P: pv})
        assert not _agree([out], [P], {P: np.array([[2**62, -2**62, -2**62], [0, 1, 2]])})


def test_a_combine_deeper_than_the_limit_is_refused_where_it_is_written():
    # te.evaluate recursed past Python's limit on a 300-level combine (RecursionError):
    # a combine is held to a compute body's depth limit
    P = te.placeholder((2, 3), "P", "float64")
    k = te.reduce_axis(3, "k")

    def combine(a, b):
        e = a + b
        for j in range(300):
            e = e * 1.0 + (b if j % 2 else a) * 0.0
        return e
    red = te.comm_reducer(combine, lambda d: te.const(0.0, d), name="toodeep")
    with pytest.raises(te.TexprError, match="MAX_DEPTH") as info:
        te.compute((2,), lambda i: red(P[i, k], axis=k), name="Deep")
    assert "toodeep" in str(info.value) and "Deep" in str(info.value)


def test_a_zero_dimensional_stage_that_wraps_raises_a_texpr_error():
    # te.evaluate located the offending point with np.nonzero, which refuses 0-d
    # arrays: a ValueError from numpy instead of the error (found by the fuzzer)
    for make in (lambda: N[0] * 3, lambda: N[2] - N[0], lambda: -N[2]):
        out = te.compute((), make, name="S")
        assert not _agree([out], [N], {N: np.array([2**62, 1, -2**63])})
    fits = te.compute((), lambda: N[1] * 3, name="T")
    assert _agree([fits], [N], {N: np.array([2**62, 1, -2**63])})


def test_a_custom_combine_runs_only_where_the_condition_holds():
    # te.evaluate applied a user combine at every point and masked afterwards: it
    # raised "would wrap around" / "division by zero" at points where= excludes,
    # where the kernels (and the definition) never combine. An attack
    P = te.placeholder((1, 3), "P", "int64")
    k = te.reduce_axis(3, "k")
    mul = te.comm_reducer(lambda a, b: a * b, lambda d: te.const(1, d), name="mymul")
    div = te.comm_reducer(lambda a, b: a // b, lambda d: te.const(1000, d), name="mydiv")
    low = te.comm_reducer(lambda a, b: a // b, lambda d: te.const(-2**63, d), name="lowdiv")
    a = te.compute((1,), lambda i: mul(P[i, k], axis=k, where=P[i, k] < 100), name="A")
    b = te.compute((1,), lambda i: div(P[i, k], axis=k, where=P[i, k] != 0), name="B")
    c = te.compute((1,), lambda i: low(P[i, k], axis=k, where=P[i, k] != -1), name="C")
    for out, row, want in ((a, [3, 2**62, 5], 15), (b, [3, 0, 5], 66),
                           (c, [-1, 2, 5], -922337203685477581)):
        feed = {P: np.array([row])}
        assert _agree([out], [P], feed)
        assert te.evaluate(out, feed)[0] == want
    # where the condition holds, the combine still refuses
    a2 = te.compute((1,), lambda i: mul(P[i, k], axis=k, where=P[i, k] != 0), name="A2")
    assert not _agree([a2], [P], {P: np.array([[2**40, 0, 2**40]])})
    c2 = te.compute((1,), lambda i: low(P[i, k], axis=k, where=P[i, k] != 0), name="C2")
    assert not _agree([c2], [P], {P: np.array([[-1, 2, 5]])})  # INT_MIN // -1


def test_an_index_form_with_a_constant_outside_int64_is_not_chosen():
    # ISL's form of (C - i) * -1 - 1 at C = 2**63 - 1 is i - 2**63, written with the
    # constant 2**63: building it raised DTypeError and codegen.build refused a
    # program te.evaluate computes (an attack). The written form is kept
    y = te.compute((3,), lambda i: (te.const(2**63 - 1) - i) * -1 - 1, name="Yc")
    kernel = codegen.build([y], [], parallel=False, blas=False)
    want = te.evaluate(y, {})
    np.testing.assert_array_equal(want, [-2**63, -2**63 + 1, -2**63 + 2])
    np.testing.assert_array_equal(kernel()[0], want)
