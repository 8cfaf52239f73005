"""Kernels are re-entrant and thread-safe: the temporaries a kernel keeps from
call to call (codegen.build.Kernel._execute, and the GEMM path's padded and
masked operand copies, codegen.backends.numpy_host.gemm.ContractionPlan._run_into) belong to one call
at a time. A call that re-enters the same kernel on the same thread (a signal
handler, a callback from inside a unit) gets buffers of its own, and the call it
interrupted still returns te.evaluate's values (issue 52, kind 1)."""

import signal
import threading

import numpy as np
import pytest

import texpr as te
from texpr.codegen import build, create_schedule


def _program():
    """Three stages, two units: ``S`` is a temporary (no output) that the unit of
    ``Y`` reads after the unit of ``S`` wrote it."""
    X = te.placeholder((6, 5), name="X", dtype="float64")
    k = te.reduce_axis(5, name="k")
    S = te.compute((6,), lambda i: te.sum(X[i, k] * X[i, k], axis=k), name="S")
    j = te.reduce_axis(6, name="j")
    T = te.compute((6,), lambda i: te.sum(S[j] * X[j, i % 5], axis=j), name="T")
    Y = te.compute((6,), lambda i: T[i] * S[i], name="Y")
    return X, Y


@pytest.fixture(scope="module")
def kernel():
    X, Y = _program()
    return X, Y, build(Y, [X])


def _nested_call_before(unit, inner, monkeypatch):
    """Make ``unit.run`` call ``inner()`` once, then run as before."""
    run = unit.run
    calls, entered = [], []

    def hooked(arrays, err):
        if not entered:
            entered.append(True)
            calls.append(inner())
        return run(arrays, err)
    monkeypatch.setattr(unit, "run", hooked)
    return calls


def test_a_nested_call_on_the_same_thread_leaves_the_outer_call_right(kernel, monkeypatch):
    X, Y, kern = kernel
    temps, _ = kern._make_plan()
    assert any(k is None for _s, _d, k in temps), "the program must keep a temporary"
    rng = np.random.default_rng(0)
    x, other = rng.standard_normal((6, 5)), 10 + rng.standard_normal((6, 5))
    kern(x)  # a first call leaves its temporaries in this thread's slot
    # the unit of Y runs after S's unit wrote the temporary S: the nested call
    # (another input) writes its own S before the outer Y reads the outer one
    calls = _nested_call_before(kern.units[-1], lambda: kern(other)[0], monkeypatch)
    (y,) = kern(x)
    assert len(calls) == 1
    np.testing.assert_allclose(y, te.evaluate(Y, {X: x}), rtol=1e-12)
    np.testing.assert_allclose(calls[0], te.evaluate(Y, {X: other}), rtol=1e-12)
    # the slot is usable afterwards: plain calls still give the right values
    monkeypatch.undo()
    np.testing.assert_allclose(kern(other)[0], te.evaluate(Y, {X: other}), rtol=1e-12)


def test_a_nested_call_from_a_signal_handler_leaves_the_outer_call_right(kernel):
    X, Y, kern = kernel
    rng = np.random.default_rng(1)
    x, other = rng.standard_normal((6, 5)), 5 + rng.standard_normal((6, 5))
    want, want_other = te.evaluate(Y, {X: x}), te.evaluate(Y, {X: other})
    inner, busy = [], []

    def handler(signum, frame):
        if busy:  # the timer fired again inside the handler: skip that one
            return
        busy.append(True)
        try:
            inner.append(kern(other)[0])
        finally:
            busy.pop()

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)
        outer = [kern(x)[0] for _ in range(3000)]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert inner, "the timer never fired"
    for y in outer:
        np.testing.assert_allclose(y, want, rtol=1e-12)
    for y in inner:
        np.testing.assert_allclose(y, want_other, rtol=1e-12)


def test_threads_calling_one_kernel_at_once_get_their_own_values(kernel):
    X, Y, kern = kernel
    rng = np.random.default_rng(2)
    xs = [t + rng.standard_normal((6, 5)) for t in range(4)]
    wants = [te.evaluate(Y, {X: x}) for x in xs]
    wrong = []

    def work(t):
        for _ in range(300):
            y = kern(xs[t])[0]
            if not np.allclose(y, wants[t], rtol=1e-12):
                wrong.append(t)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == []


def test_a_nested_call_during_a_gemm_stage_leaves_its_operand_copies_alone(monkeypatch):
    # the GEMM path keeps its zero-padded operand copies per thread and plan: a
    # nested run of the same plan (here from inside the stage's own run, between
    # building one operand and the GEMM, where a signal handler could run) must
    # not overwrite the copy the outer run reads
    from texpr import nn
    from texpr.codegen.backends.numpy_host import gemm

    X = te.placeholder((2, 3, 10, 10), name="X", dtype="float64")
    W = te.placeholder((4, 3, 3, 3), name="W", dtype="float64")
    Y = nn.conv2d(X, W, padding=1)
    s = create_schedule([Y])
    s[Y].blas(True)
    kern = build([Y], [X, W], s)
    assert "BLAS:" in kern.source
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3, 10, 10)), rng.standard_normal((4, 3, 3, 3))
    x2 = 100 + rng.standard_normal((2, 3, 10, 10))
    kern(x, w)  # leaves its padded copy of X in this thread's workspace
    real = gemm._operand
    nested, entered = [], []

    def operand(view, arrays, *a, **kw):
        v = real(view, arrays, *a, **kw)
        if not entered:
            entered.append(True)
            nested.append(kern(x2, w)[0])
        return v
    monkeypatch.setattr(gemm, "_operand", operand)
    (y,) = kern(x, w)
    monkeypatch.undo()
    assert nested
    np.testing.assert_allclose(y, te.evaluate(Y, {X: x, W: w}), rtol=1e-10)
    np.testing.assert_allclose(nested[0], te.evaluate(Y, {X: x2, W: w}), rtol=1e-10)
