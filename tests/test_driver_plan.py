"""One kernel driver (issue 49): the DriverPlan a kernel is built with is what its
Python driver interprets, what the bridges' compiled driver runs (its
descriptor serialises the plan), and what the end of Kernel.source shows."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu import native_call
from texpr.codegen.ir.driver import DriverPlan
from test_codegen_native_call import _run as _run_native


def _kernel():
    # a temporary (S, read by two stages), a unit that can fail (G: a
    # data-dependent gather) with a unit after it (H), an input listed as an
    # output and an output listed twice (two copies)
    X = te.placeholder((5, 3), name="X", dtype="float64")
    I = te.placeholder((4,), name="I", dtype="int32")
    j = te.reduce_axis(3, name="j")
    r = te.reduce_axis(4, name="r")
    S = te.compute((5,), lambda a: te.sum(X[a, j] * X[a, j], axis=j), name="S")
    G = te.compute((4, 3), lambda i, c: X[I[i], c] / (1.0 + S[I[i]]), name="G")
    H = te.compute((3,), lambda c: te.sum(G[r, c], axis=r) + S[c], name="H")
    return codegen.build([H, X, G, G], [X, I])


def _decode(desc):
    """The descriptor's words back as (kinds, sizes, items, unit args, copies)."""
    head = desc[:8]
    nb, nu, nc = int(head[1]), int(head[2]), int(head[3])
    body = desc[8:]
    kinds, sizes, items = body[:nb], body[2 * nb:3 * nb], body[3 * nb:4 * nb]
    per = 2 + native_call.MAX_ARGS
    units = body[4 * nb:4 * nb + per * nu]
    args = [tuple(int(a) for a in units[per * u + 2:per * u + 1 + int(units[per * u + 1])])
            for u in range(nu)]
    cw = body[4 * nb + per * nu:]
    copies = [(int(cw[3 * c]), int(cw[3 * c + 1])) for c in range(nc)]
    return list(kinds), list(sizes), list(items), args, copies


_native = _run_native  # (outputs into fresh buffers by the compiled driver)


def test_the_python_and_the_native_driver_run_one_plan_and_agree():
    kernel = _kernel()
    plan = kernel.driver_plan
    assert isinstance(plan, DriverPlan)
    assert {"S", "G", "H"} <= set(kernel.stages)
    # the plan is the kernel's: its calls are the units, in order, on their buffers
    assert [(c.stage, c.args) for c in plan.calls] == [(u.stage, u.args) for u in kernel.units]
    assert [s.kind for s in plan.slots[:2]] == ["input", "input"]
    assert [o.own for o in plan.outputs] == [True, False, True, False]
    assert plan.copies == ((1, 0), (3, plan.outputs[2].slot))
    assert any(s.kind == "temp" and s.tensor == "S" for s in plan.slots)
    # the descriptor is the plan serialised: the same buffers, calls and copies
    kinds, sizes, items, args, copies = _decode(native_call.describe(kernel))
    assert kinds == [{"input": 0, "result": 1, "temp": 2}[s.kind] for s in plan.slots]
    assert sizes == [s.size for s in plan.slots]
    assert items == [s.itemsize for s in plan.slots]
    assert args == [c.args for c in plan.calls]
    assert copies == list(plan.copies)
    # the source ends with the plan's text
    assert kernel.source.endswith("\n".join(plan.lines()) + "\n")
    assert kernel.source.count("# ---- the driver") == 1
    # the same values, bit for bit
    rng = np.random.default_rng(0)
    x, i = rng.standard_normal((5, 3)), np.array([4, 0, 2, 4], np.int32)
    want = kernel(x, i)
    got = _native(kernel, [x, i])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(want[1], x)
    np.testing.assert_array_equal(want[2], want[3])
    assert want[2] is not want[3]
    # and the same error, from the failing unit (G), whichever driver runs the plan
    bad = np.array([0, 1, 9, 2], np.int32)
    with pytest.raises(te.OutOfBoundsError) as py:
        kernel(x, bad)
    with pytest.raises(te.OutOfBoundsError) as nat:
        _native(kernel, [x, bad])
    assert str(nat.value) == str(py.value)
    assert "index value 9" in str(py.value) and "G" in str(py.value)
    # after the error, both drivers still run the plan right
    np.testing.assert_array_equal(_native(kernel, [x, i])[0], want[0])
    np.testing.assert_array_equal(kernel(x, i)[0], want[0])


def test_the_plan_names_the_buffers_of_the_source():
    X = te.placeholder((4,), name="X", dtype="float32")
    Y = te.compute((4,), lambda a: X[a] * 2.0, name="Y")
    kernel = codegen.build([Y, X], [X])
    lines = kernel.driver_plan.lines()
    assert "# unit0(Y_, X_, err)" in lines
    assert "# output 1 = copy of X_" in lines
    assert lines[-1] == "# return (Y_, output 1)"
    assert "# X_: input X, shape (4,), float32" in kernel.source
