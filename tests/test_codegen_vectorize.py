"""codegen.backends.numba_cpu.vectorize: LLVM's loop vectoriser runs for units with an innermost loop
at unit stride, and is off where it would only cost compile time, or where it
would take exponential time (an inner loop that compares and does not depend on
an enclosing loop)."""

import numpy as np

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu.vectorize import invariant_comparison_loop, loop_vectorize_pays

_UNIT = '''
@njit(inline="always", cache=True)
def _fill(a, v):
    for i in range(a.size):
        a[i] = v


@njit(parallel=True, cache=True)
def unit(b0, b1, b2, err):
    for c0_0 in prange(0, 32):
        for c0_1 in range(1, 14):
            i0_0 = c0_0
            i0_1 = c0_1
            {body}
    return 0
'''


def _unit(body):
    return _UNIT.replace("{body}", body)


def test_unit_stride_innermost_loops_vectorise():
    assert loop_vectorize_pays(_unit("b0[np.uint64(i0_0 * 14 + i0_1)] = b1[np.uint64(i0_0 * 14 + i0_1)]"))
    # a reversed walk and a broadcast operand (stride 0) too
    assert loop_vectorize_pays(_unit(
        "b0[np.uint64(i0_0 * 14 + 13 - i0_1)] += b1[np.uint64(i0_0)] * b2[np.uint64(i0_1 - 1)]"))


def test_strided_gathers_and_data_dependent_indices_do_not():
    # avg_pool2d's forward: stride-2 loads in the innermost loop
    assert not loop_vectorize_pays(_unit(
        "b0[np.uint64(i0_0 * 14 + i0_1)] += b1[np.uint64(i0_0 * 28 + i0_1 * 2 - 1)]"))
    # the innermost loop runs over the batch axis: a stride of a whole image
    assert not loop_vectorize_pays(_unit("b0[np.uint64(i0_1 * 784 + i0_0)] = b1[np.uint64(i0_0)]"))
    # a gather through an index buffer: unknown stride
    assert not loop_vectorize_pays(_unit("b0[np.uint64(i0_1)] = b1[np.uint64(b2[np.uint64(i0_1)])]"))
    # a quasi-affine index (not affine in the loop variable)
    assert not loop_vectorize_pays(_unit("b0[np.uint64(i0_1)] = b1[np.uint64(i0_1 // 2)]"))
    # the helpers' unit-stride loops are not the unit's
    assert not loop_vectorize_pays(_unit("pass"))


def test_text_that_does_not_parse_keeps_numbas_default():
    assert loop_vectorize_pays("def unit(:\n")


def test_kernels_with_and_without_the_vectoriser_match_the_evaluator():
    # one stage at unit stride (vectorised), one pooling stage at stride 2 (not);
    # the choice changes machine code, never values
    X = te.placeholder((2, 4, 28, 28), "X", "float64")
    Y = te.compute(X.shape, lambda n, c, h, w: X[n, c, h, w] * 2.0 + 1.0, name="Y")
    P = te.nn.avg_pool2d(Y, 3, stride=2, padding=1)
    kernel = codegen.build([Y, P], [X])
    texts = [open(u.path).read() for u in kernel.units if getattr(u, "path", None)]
    assert len(texts) == 2 and [loop_vectorize_pays(t) for t in texts] == [True, False]
    x = np.random.default_rng(0).standard_normal(X.shape)
    for got, want in zip(kernel(x), te.evaluate([Y, P], {X: x})):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


_ARGMIN_BODY = """
acc0_0 = np.inf
acc0_1 = 9223372036854775807
for c0_3 in range(0, 5):
    for c0_4 in range(0, 5):
        r0_0 = c0_4
        r0_1 = c0_3
        y0_0 = b2[np.uint64(0)] * 1.5
        y0_1 = r0_0 * 5 + r0_1
        if (y0_0 < acc0_0) | (y0_0 == acc0_0) & (y0_1 < acc0_1):
            acc0_1 = y0_1
""".replace("\n", "\n            ")


def test_an_inner_comparing_loop_independent_of_its_enclosing_loop_is_found():
    # fuzz seed 7004500389's shape: the reduction reads neither c0_1 nor i0_1
    assert invariant_comparison_loop(_unit(_ARGMIN_BODY))
    # a max written with a conditional expression, in the outer loop's body
    assert invariant_comparison_loop(_unit(
        "for c0_3 in range(0, 9):\n"
        "                acc0_0 = b2[np.uint64(c0_3)] if b2[np.uint64(c0_3)] > acc0_0 else acc0_0"))


def test_inner_loops_that_depend_on_their_enclosing_loop_or_only_add_are_not():
    # the reduction reads i0_1 (assigned from c0_1): it depends on the loop (at
    # 3 x 3 points: below the bound on constant nests)
    small = _ARGMIN_BODY.replace("range(0, 5)", "range(0, 3)")
    assert not invariant_comparison_loop(_unit(small.replace(
        "b2[np.uint64(0)]", "b2[np.uint64(i0_1)]")))
    # its bounds depend on it
    assert not invariant_comparison_loop(_unit(_ARGMIN_BODY.replace(
        "for c0_3 in range(0, 5)", "for c0_3 in range(0, i0_1)")))
    # a sum invariant in the loop: a chain without comparisons (linear for LLVM)
    assert not invariant_comparison_loop(_unit(
        "for c0_3 in range(0, 9):\n                acc0_0 += b2[np.uint64(c0_3)]"))
    assert not invariant_comparison_loop("def unit(:\n")


def test_an_inner_comparing_loop_of_more_than_twelve_constant_points_is_found():
    # it reads the enclosing loop's i0_1, but LLVM may still find it uniform
    body = _ARGMIN_BODY.replace("b2[np.uint64(0)]", "b2[np.uint64(i0_1)]")
    assert invariant_comparison_loop(_unit(body))  # 5 x 5 points
    assert invariant_comparison_loop(_unit(body.replace("range(0, 5)", "range(1, 5)", 1)))
    # max_pool2d's windows: 2 x 2 and 3 x 3 points
    small = body.replace("range(0, 5)", "range(0, 2)")
    assert not invariant_comparison_loop(_unit(small))
    assert not invariant_comparison_loop(_unit(body.replace("range(0, 5)", "range(0, 3)")))
    # two sibling nests of 3 x 3 and 2 x 3 points carry the same accumulator
    # (a where= of two pieces): one chain of 15
    split = small.replace("for c0_3 in range(0, 2)", "for c0_3 in range(0, 3)").replace(
        "range(0, 2)", "range(0, 3)")
    twice = split + split.split("acc0_1 = 9223372036854775807", 1)[1].replace(
        "range(0, 3):\n", "range(4, 6):\n", 1)
    assert invariant_comparison_loop(_unit(twice))
    # bounds that are not constant: LLVM does not unroll them fully
    assert not invariant_comparison_loop(_unit(body.replace(
        "for c0_3 in range(0, 5)", "for c0_3 in range(0, b0.shape[0])")))


def _broadcast_reduction(kind, n=5):
    # the gradient of a min (max) over n x n points of a value that does not
    # depend on the output's axis j (broadcast along it), where the value is
    # above a bound that depends on k: its argmin (argmax) stage's loop over j
    # holds an inner loop that compares and does not read j
    X = te.placeholder((n,), "X", "float64")
    k, l = te.reduce_axis((0, n), "k"), te.reduce_axis((0, n), "l")
    red = te.max if kind == "max" else te.min

    def where(a, j):
        bound = X[a] * 1.5 > k / 7 - 1.0
        # "min_or": a condition that reads j but is false for every j < 4; the
        # simplifier keeps it, LLVM folds it (the text depends on j, the code not)
        return te.any(bound, j > 100) if kind == "min_or" else bound

    Y = te.compute((1, 4), lambda a, j: red(X[a] * 1.5, axis=[k, l], where=where(a, j)),
                   name="Y")
    s = te.reduce_axis((0, 4), "s")
    L = te.compute((), lambda: te.sum(Y[0, s], axis=s), name="L")
    return X, [L] + list(te.differentiate(L, [X]).result)


def test_broadcast_max_and_argmax_reductions_build_in_seconds():
    import sys, os
    sys.path.insert(0, os.path.dirname(__file__))
    import fuzz

    x = np.array([0.3, -0.7, 2.0, 1.0, 0.0])
    for kind in ("min", "max", "min_or"):
        X, outs = _broadcast_reduction(kind)
        with fuzz.build_time_bounded(f"a broadcast {kind}", 300):
            kernel = codegen.build(outs, [X])
        texts = [open(u.path).read() for u in kernel.units if getattr(u, "path", None)]
        assert any(invariant_comparison_loop(t) for t in texts), kind
        for got, want in zip(kernel(x), te.evaluate(outs, {X: x})):
            np.testing.assert_array_equal(got, want)


def test_a_min_over_a_domain_of_two_pieces_builds_in_seconds():
    # an attack on the rule: where= of two pieces (k < 12 or k >= 24) gives two
    # sibling loops of 12 points carrying one accumulator, and `j > 100` makes
    # the text read j; the build ran for more than 300 s when each loop was
    # judged alone
    import os
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    import fuzz

    p = 12
    X = te.placeholder((3 * p,), "X", "float64")
    k = te.reduce_axis((0, 3 * p), "k")
    Y = te.compute((4,), lambda j: te.min(X[0] * 1.5, axis=k, where=te.all(
        te.any(k < p, k >= 2 * p), te.any(X[0] * 1.5 > k / 7 - 1.0, j > 100))), name="Y")
    s = te.reduce_axis((0, 4), "s")
    L = te.compute((), lambda: te.sum(Y[s], axis=s), name="L")
    outs = [L] + list(te.differentiate(L, [X]).result)
    with fuzz.build_time_bounded("a min over two pieces", 300):
        kernel = codegen.build(outs, [X])
    x = np.linspace(-1, 1, 3 * p)
    for got, want in zip(kernel(x), te.evaluate(outs, {X: x})):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
