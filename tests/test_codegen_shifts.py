"""Shift plans (codegen/analysis/shifts.py): window and tap-sum stages run as strided moves
by one precompiled function -- their units, their fallback to a loop nest, and
their checks."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.errors import TexprError
from texpr.codegen.backends.numba_cpu.shift_units import run_moves

from fuzz import every_contraction_on_blas as blas_at_any_size  # the cost rule off

nn = te.nn


def _conv_grads(cin=3, cout=5, size=7):
    X = te.placeholder((2, cin, size, size), "X", "float32")
    W = te.placeholder((cout, cin, 3, 3), "W", "float32")
    y = nn.conv2d(X, W, padding=1, name="conv")
    H = te.placeholder(y.shape, "H", "float32")
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    return L, [X, W, H], list(te.differentiate(L, [X, W]).result)


def test_window_and_tap_sum_stages_run_as_shift_units():
    L, ins, grads = _conv_grads()
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    kinds = {u.stage: u.kind for u in kernel.units}
    assert kinds["X_window"] == "shift" and kinds["d_X__conv"] == "shift", kinds
    assert kinds["d_X__conv_taps"] == "blas" and kinds["d_W__conv"] == "blas", kinds
    assert "strided moves" in kernel.source
    rng = np.random.default_rng(0)
    feed = {t: rng.standard_normal(t.shape).astype("float32") for t in ins}
    got = kernel(*[feed[t] for t in ins])
    for g, w in zip(got, te.evaluate([L] + grads, feed)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)


def test_a_tap_sum_whose_where_is_no_box_keeps_its_loop_nest():
    # the where ties two output axes (i + j < 10): for fixed taps it is a triangle,
    # not a box, so the tap sum stays a loop nest (numba), with the same values
    A = te.placeholder((4, 9, 9), "A", "float64")
    B = te.placeholder((4, 3, 2, 2), "B", "float64")
    o, ki, kj = te.reduce_axis(4, "o"), te.reduce_axis(2, "ki"), te.reduce_axis(2, "kj")
    out = te.compute((8, 8, 3), lambda i, j, c: te.sum(
        A[o, i + ki, j + kj] * B[o, c, ki, kj], axis=[o, ki, kj], where=i + j < 10), name="out")
    with blas_at_any_size():
        kernel = codegen.build([out], [A, B])
    kinds = {u.stage: u.kind for u in kernel.units}
    assert kinds.get("out_taps") == "blas" and kinds["out"] == "numba", kinds
    rng = np.random.default_rng(1)
    feed = {A: rng.standard_normal(A.shape), B: rng.standard_normal(B.shape)}
    np.testing.assert_allclose(kernel(feed[A], feed[B])[0], te.evaluate(out, feed),
                               rtol=1e-10, atol=1e-10)


def test_a_buffer_not_as_planned_is_refused():
    L, ins, grads = _conv_grads()
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    unit = next(u for u in kernel.units if u.kind == "shift")
    arrays = {k: np.zeros(3, "float32") for k in unit.args}
    with pytest.raises(TexprError, match="not as planned"):
        run_moves(unit.plan, arrays)


def test_the_shared_moves_are_compiled_with_the_kernel(monkeypatch):
    # made inside codegen.build, so a kernel's compile_seconds holds them (not the
    # first call); the first shift unit of a dtype in the process reports it
    import texpr.codegen.backends.numba_cpu.shift_units as shifts
    monkeypatch.setattr(shifts, "_FUNCTIONS", {})
    L, ins, grads = _conv_grads()
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    assert "float32" in shifts._FUNCTIONS
    units = [u for u in kernel.units if u.kind == "shift"]
    assert units[0].compiled or units[0].from_disk_cache
    assert not units[1].compiled and units[1].compile_seconds == 0.0


def test_the_knobs_turn_each_rewrite_off(monkeypatch):
    # benchmarks/bench_variants.py times the variants: with shift plans off the
    # window and tap sum are loop nests; with both rewrites off neither stage exists
    import texpr.codegen.analysis.shifts as shifts
    import texpr.codegen.rewrite.tap_split as tap_split
    import texpr.codegen.rewrite.windows as windows
    L, ins, grads = _conv_grads()
    rng = np.random.default_rng(2)
    feed = [rng.standard_normal(t.shape).astype("float32") for t in ins]
    with blas_at_any_size():
        want = codegen.build([L] + grads, ins)(*feed)
    monkeypatch.setattr(shifts, "ENABLED", False)
    with blas_at_any_size():
        k = codegen.build([L] + grads, ins)
    kinds = {u.stage: u.kind for u in k.units}
    assert kinds["X_window"] == "numba" and kinds["d_X__conv"] == "numba", kinds
    for g, w in zip(k(*feed), want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    monkeypatch.setattr(tap_split, "ENABLED", False)
    monkeypatch.setattr(windows, "ENABLED", False)
    with blas_at_any_size():
        k = codegen.build([L] + grads, ins)
    assert not [s for s in k.stages if s.endswith(("_window", "_taps"))], k.stages
    for g, w in zip(k(*feed), want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
