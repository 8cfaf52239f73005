"""codegen.vectorize: LLVM's loop vectoriser runs for units with an innermost loop
at unit stride, and is off where it would only cost compile time."""

import numpy as np

import texpr as te
from texpr import codegen
from texpr.codegen.vectorize import loop_vectorize_pays

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
