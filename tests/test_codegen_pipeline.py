"""codegen as a pipeline: the build switches, the rewrite passes under the pass
tools, the target dialect, and the old module paths."""

import numpy as np
import pytest

import texpr as te
from dense_testutil import dense_grad
from texpr import codegen
from texpr.codegen.loopnest import dialect


def _dense_grad(n=64, k=96, m=48):
    return dense_grad(n, k, m, "float64")


def _values(kernel):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 96)), rng.standard_normal((48, 96))
    loss, dw = kernel(x, w)
    y = x @ w.T
    np.testing.assert_allclose(loss, (y * y).sum(), rtol=1e-12)
    np.testing.assert_allclose(dw, 2 * y.T @ x, rtol=1e-12, atol=1e-9)


def test_a_serial_build_keeps_its_gemms_and_only_its_loop_nests_are_sequential():
    X, W, L, dW = _dense_grad()
    k = codegen.build([L, dW], [X, W], parallel=False)
    kinds = [u.kind for u in k.units]
    assert "blas" in kinds
    assert not any(getattr(u, "parallel", False) or getattr(u, "chunks", 0) for u in k.units)
    assert "prange(" not in k.source and "part[" not in k.source
    _values(k)


def test_blas_false_makes_every_stage_a_loop_nest():
    X, W, L, dW = _dense_grad()
    k = codegen.build([L, dW], [X, W], blas=False)
    assert {u.kind for u in k.units} == {"numba"}
    assert "blas=False" in k.explain()
    _values(k)


def test_the_rewrites_are_passes_the_pass_tools_see(monkeypatch, capsys):
    # a convolution's weight gradient: the operand packing, tap split and window
    # passes run, each printed by TEXPR_PRINT_PASSES and checked by TEXPR_VERIFY
    monkeypatch.setenv("TEXPR_PRINT_PASSES", "1")
    monkeypatch.setenv("TEXPR_VERIFY", "1")
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    X, W, L, dW = _dense_grad(8, 12, 6)
    k = codegen.build([L, dW], [X, W])
    err = capsys.readouterr().err
    for name in ("pack_operands", "split_taps", "window_operands", "split_reductions"):
        assert f"--- after {name}:" in err
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 12)), rng.standard_normal((6, 12))
    y = x @ w.T
    np.testing.assert_allclose(k(x, w)[1], 2 * y.T @ x, rtol=1e-12, atol=1e-12)


def test_the_rewrite_passes_follow_the_switches():
    from texpr.codegen.rewrite.passes import Rewritten, rewrite_passes

    names = lambda **kw: [p.__name__ for p in rewrite_passes(Rewritten(), **kw)]  # noqa: E731
    assert names() == ["pack_operands", "split_taps", "window_operands", "split_reductions"]
    assert names(gemms=False) == ["split_reductions"]
    assert names(parallel=False) == ["pack_operands", "split_taps", "window_operands"]


def test_the_lowering_writes_through_the_active_dialect():
    # a dialect of our own, spelling the parallel loop and the decorator its way:
    # the unit text follows it (it is not compiled: the text is what is checked)
    from texpr.codegen.backends.numba_cpu.dialect import NUMBA_CPU, NumbaCpuDialect
    from texpr.codegen.loopnest.lower import lower
    from texpr.simplify import materialized_stages

    class Marked(NumbaCpuDialect):
        parallel_range = "marked_range"

        def decorator(self, parallel):
            return "# marked\n" + super().decorator(parallel)

    assert dialect.current() is NUMBA_CPU and "numba_cpu" in dialect.registered()
    X = te.placeholder((256, 512), name="X", dtype="float64")
    Y = te.compute((256, 512), lambda i, j: te.exp(X[i, j]) * 2.0, name="Y")
    s = codegen.create_schedule([Y])
    s[Y].parallel(Y.op.axis[0])
    s[Y].parallel(Y.op.axis[1])  # a second parallel axis: parallel loops, not chunks
    mat, inl = codegen.ir.schedule.default_materialized(s, materialized_stages)
    with dialect.using(Marked()):
        program = lower(s, [X], mat, inl, parallel=True)
    text = program.units[0].module_source
    assert "# marked\n@njit(" in text
    assert "marked_range(" in text and "prange(" not in text.split("@njit(")[1]
    with pytest.raises(te.TexprError, match="no backend 'nope'"):
        with dialect.using("nope"):
            pass


def test_old_module_paths_are_the_new_modules():
    import texpr.codegen.stage as old_stage
    from texpr.codegen import gemm as old_gemm
    from texpr.codegen.backends.numpy_host import gemm
    from texpr.codegen.loopnest import stage

    assert old_stage is stage and old_gemm is gemm and codegen.lower is codegen.loopnest.lower
    with pytest.raises(AttributeError):
        codegen.no_such_module
