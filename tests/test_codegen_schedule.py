"""Hand-written schedules: every primitive gives the evaluator's values, and
impossible requests are ScheduleErrors (those need no compilation).

Graph: ``P = 2*A`` (elementwise producer), ``C = P @ B`` (a reduction),
``D = C + 1`` (elementwise), output ``E = D * D``.
"""

import numpy as np
import pytest

from texpr import codegen
import texpr as te

N, K, M = 7, 11, 10


def graph():
    A = te.placeholder((N, K), "A", "float64")
    B = te.placeholder((K, M), "B", "float64")
    P = te.compute((N, K), lambda i, k: A[i, k] * 2.0, name="P")
    k = te.reduce_axis(K, "k")
    C = te.compute((N, M), lambda i, j: te.sum(P[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((N, M), lambda i, j: C[i, j] + 1.0, name="D")
    E = te.compute((N, M), lambda i, j: D[i, j] * D[i, j], name="E")
    return A, B, P, C, D, E


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.uniform(-1, 1, (N, K)), rng.uniform(-1, 1, (K, M))


def _run(E, A, B, s, data, **kw):
    kernel = codegen.build([E], [A, B], s, **kw)
    a, b = data
    want = te.evaluate(E, {A: a, B: b})
    np.testing.assert_allclose(kernel(a, b)[0], want, rtol=1e-12, atol=1e-12)
    return kernel


def test_split_reorder_parallel_and_split_reduction(data):
    A, B, P, C, D, E = graph()
    s = codegen.create_schedule([E])
    i, j = C.op.axis
    (k,) = C.op.reduce_axis
    io, ii = s[C].split(i, 3)          # 7 is not a multiple of 3: a partial last tile
    ko, ki = s[C].split(k, 4)
    s[C].reorder(io, ko, j, ii, ki)    # reduction loops outside spatial ones
    s[C].parallel(io)
    kernel = _run(E, A, B, s, data)
    src = kernel.source
    block = src[src.index("stage C"):src.index("stage E")]
    assert "prange" in block and "_fill_" in block  # buffer mode: accumulate in C
    assert kernel.stages == ["C", "E"]


def test_tile_vectorize_and_compute_root(data):
    A, B, P, C, D, E = graph()
    s = codegen.create_schedule([E])
    s[P].compute_root()
    s[D].compute_inline()
    xo, yo, xi, yi = s[E].tile(E.op.axis[0], E.op.axis[1], 4, 3)
    s[E].parallel(xo)
    s[E].vectorize(yi)
    kernel = _run(E, A, B, s, data)
    assert kernel.stages == ["P", "C", "E"]


def test_scalar_accumulation_order_and_no_parallel(data):
    A, B, P, C, D, E = graph()
    s = codegen.create_schedule([E])
    i, j = C.op.axis
    (k,) = C.op.reduce_axis
    s[C].reorder(j, i, k)
    s[D].compute_root()
    kernel = _run(E, A, B, s, data, parallel=False, blas=False)
    assert "prange(" not in kernel.source and "parallel=False" in kernel.source
    assert "acc" in kernel.source and kernel.stages == ["C", "D", "E"]


def test_default_schedule_with_user_parallel_on_inner_axis(data):
    A, B, P, C, D, E = graph()
    s = codegen.create_schedule([E])
    s[E].parallel(E.op.axis[1])
    kernel = _run(E, A, B, s, data)
    src = kernel.source
    # a chunked unit (codegen.backends.numba_cpu.chunks) whose parts cut axis 1
    assert "part[0]" in src[src.index("stage E"):]
    assert [u.chunks for u in kernel.units if u.stage == "E"] == [E.shape[1]]


# ---- impossible requests ---------------------------------------------------------------

def test_schedule_errors():
    A, B, P, C, D, E = graph()
    s = codegen.create_schedule([E])
    i, j = C.op.axis
    (k,) = C.op.reduce_axis
    with pytest.raises(te.ScheduleError, match="cannot inline a reduction"):
        s[C].compute_inline()
    with pytest.raises(te.ScheduleError, match="output"):
        s[E].compute_inline()
    with pytest.raises(te.ScheduleError, match="placeholder"):
        s[A].compute_inline()
    with pytest.raises(te.ScheduleError, match="not an axis of this stage"):
        s[E].reorder(k, E.op.axis[0])          # a reduction axis of another stage
    with pytest.raises(te.ScheduleError, match="not an axis of this stage"):
        s[C].parallel(E.op.axis[0])            # a foreign axis
    with pytest.raises(te.ScheduleError, match="cannot be parallel"):
        s[C].parallel(k)
    with pytest.raises(te.ScheduleError, match="positive int"):
        s[C].split(i, 0)
    s[C].split(i, 2)
    with pytest.raises(te.ScheduleError, match="was split"):
        s[C].reorder(i, j)
    with pytest.raises(te.ScheduleError, match="twice"):
        s[C].reorder(j, j)
    with pytest.raises(te.ScheduleError, match="Tensor"):
        s["C"]
    other = codegen.create_schedule([D])
    with pytest.raises(te.ScheduleError, match="other outputs"):
        codegen.build([E], [A, B], other)


def test_scatter_stages_cannot_run_in_parallel_or_be_inlined():
    X = te.placeholder((4,), "X", "float64")
    I = te.placeholder((6,), "I", "int64")
    S = te.scatter_add((4,), "float64", (6,), lambda p: I[p], lambda p: X[p % 4], name="S")
    s = codegen.create_schedule([S])
    with pytest.raises(te.ScheduleError, match="parallel"):
        s[S].parallel(S.op.axis[0])
    with pytest.raises(te.ScheduleError, match="scatter"):
        s[S].compute_inline()


def test_every_adjoint_has_a_stage():
    X = te.placeholder((4, 6), "X", "float64")
    W1 = te.placeholder((5, 6), "W1", "float64")
    W2 = te.placeholder((3, 5), "W2", "float64")
    y = te.nn.dense(te.nn.relu(te.nn.dense(X, W1)), W2)
    res = te.differentiate(y, [W1, W2], head=te.placeholder(y.shape, "H", "float64"))
    s = codegen.create_schedule(list(res.result))
    for t, adj in res.adjoints.items():
        st = s[adj]
        assert st.op is adj.op
        if isinstance(adj.op, te.ComputeOp) and adj.op.axis:
            st.split(adj.op.axis[0], 2)
