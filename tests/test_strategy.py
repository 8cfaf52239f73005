"""codegen.strategy: one StagePlan per stage from an ordered rule list, and one
contraction.match per contraction stage across a build (issue 49)."""

import collections

import numpy as np
import pytest

import texpr as te
from dense_testutil import dense_grad
from texpr import codegen
from texpr.codegen import strategy
from texpr.codegen.analysis import contraction, matches


def _dense_grad(n=64, k=96, m=48):
    X, W, L, dW = dense_grad(n, k, m)
    return [L, dW], [X, W]


def _conv_grad():
    X = te.placeholder((8, 16, 28, 28), name="X")
    W = te.placeholder((32, 16, 3, 3), name="W")
    Y = te.nn.conv2d(X, W, stride=1, padding=1, name="Y")
    n, c, h, w = [te.reduce_axis(s, nm) for s, nm in zip(Y.shape, "nchw")]
    L = te.compute((), lambda: te.sum(Y[n, c, h, w] * Y[n, c, h, w], axis=[n, c, h, w]),
                   name="L")
    dX, dW = te.differentiate(L, [X, W])
    return [L, dX, dW], [X, W]


@pytest.fixture
def counted(monkeypatch):
    """The stages contraction.match is called on in this test: ``[(name, structure)]``."""
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")  # (a cached lowering matches nothing)
    calls = []
    real = contraction.match

    def match(op, *args, **kwargs):
        calls.append((op.name, matches._structure(op)[0]))
        return real(op, *args, **kwargs)

    monkeypatch.setattr(contraction, "match", match)
    return calls


def _check_values(kernel, outs, ins):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=t.shape).astype(t.dtype) for t in ins]
    got = kernel(*arrays)
    want = te.evaluate(outs, dict(zip(ins, arrays)))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-3)


def _final_contractions(kernel):
    """The kernel's stages the GEMM rule decided (a shift plan's tap sum is not asked)."""
    program = kernel._program
    return [op for op, plan in zip(program.ops, program.plans) if plan.rule == "gemm"]


def test_a_dense_gradient_matches_each_contraction_stage_once(counted):
    outs, ins = _dense_grad()
    k = codegen.build(outs, ins)
    names = sorted(op.name for op in _final_contractions(k))
    assert names == ["L", "Y", "d_W__Y"]
    # the rewrites (pack_operands, split_taps, window_operands, split_reductions) and
    # the strategy asked 10 times before the memo; now once per contraction stage
    assert sorted(name for name, _ in counted) == names
    assert [p.kind for p in k._program.plans] == ["gemm", "loopnest", "loopnest", "gemm"]
    _check_values(k, outs, ins)


def test_a_conv_gradient_matches_each_stage_form_once(counted):
    outs, ins = _conv_grad()
    k = codegen.build(outs, ins)
    assert "X_window" in k.stages and "d_X__Y_taps" in k.stages  # the rewrites ran
    # no stage is analysed twice in the same form ...
    assert len({s for _, s in counted}) == len(counted)
    # ... every contraction stage of the kernel was analysed once in its final form
    # (a stage only re-pointed at a rewritten producer shares its analysis) ...
    final = [matches._structure(op)[0] for op in _final_contractions(k)]
    assert all(sum(s == f for _, s in counted) == 1 for f in final)
    # ... and the other calls are the forms a rewrite replaced: Y and d_W__Y before
    # window_operands gave them X's window, d_X__Y before split_taps split it
    by_name = collections.Counter(name for name, _ in counted)
    assert by_name == {"Y": 2, "d_W__Y": 2, "L": 1, "d_X__Y": 1, "d_X__Y_taps": 1}
    _check_values(k, outs, ins)


def test_the_memo_gives_a_rewritten_stage_its_own_analysis(counted):
    A = te.placeholder((32, 40), name="A")
    B = te.placeholder((40, 24), name="B")
    C = te.placeholder((40, 24), name="C")
    k1, k2 = te.reduce_axis(40, "k"), te.reduce_axis(40, "k")
    P = te.compute((32, 24), lambda i, j: te.sum(A[i, k1] * B[k1, j], axis=k1), name="P")
    Q = te.compute((32, 24), lambda i, j: te.sum(A[i, k2] * C[k2, j] * 2.0, axis=k2), name="P")
    with matches.build_scope():
        first = matches.match(P.op, key=lambda t: t.name)
        again = matches.match(P.op, key=lambda t: ("buf", t.name))
        other = matches.match(Q.op)
    assert len(counted) == 2  # P once, the stage of the same name and another body once
    assert first is not again and first.keys() == {"P", "A", "B"}
    assert again.keys() == {("buf", "P"), ("buf", "A"), ("buf", "B")}
    assert other.keys() == {"P", "A", "C"} and other.scale == 2.0
    matches.match(P.op)
    assert len(counted) == 3  # outside a build every call runs the matcher


def test_explain_and_source_print_one_plan_per_stage():
    outs, ins = _dense_grad()
    k = codegen.build(outs, ins)
    text = k.explain()
    source = k.source
    for plan in k._program.plans:
        assert f"plan ({plan.rule}): {plan.line()}" in text
        assert f"#   {plan.stage}: {plan.line()}" in source
    assert "plan (gemm): gemm: 1 GEMM (64x96 @ 96x48)" in text
    # a loop nest's plan has the lowering's choices: its loop order at least
    d_y = next(p for p in k._program.plans if p.stage == "d_Y__L")
    assert d_y.kind == "loopnest" and d_y.loop_order and d_y.execution


def test_a_rule_in_front_decides_and_changes_the_cached_lowering(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))  # the symbolic cache stays on

    def y_stays_a_loop_nest(op, ctx):
        if op.name == "Y":
            return strategy.StagePlan(op.name, True, "loopnest", reason="a test keeps it")
        return None

    outs, ins = _dense_grad()
    before = codegen.build(outs, ins)
    assert before.units[0].kind == "blas"
    monkeypatch.setattr(strategy, "RULES", [y_stays_a_loop_nest] + strategy.RULES)
    outs, ins = _dense_grad()
    k = codegen.build(outs, ins)
    assert k.units[0].kind == "numba"  # not the cached lowering of the same graph
    assert "loop nest (" in k.explain() and "a test keeps it" in k.explain()
    _check_values(k, outs, ins)


def test_blas_true_on_a_stage_that_does_not_match_names_the_stage():
    X = te.placeholder((16, 16), name="X")
    k = te.reduce_axis(16, "k")
    S = te.compute((16,), lambda i: te.sum(te.exp(X[i, k]), axis=k), name="S")
    sched = codegen.create_schedule([S])
    sched[S].blas(True)
    with pytest.raises(te.ScheduleError, match="stage S: blas\\(True\\), but it is not"):
        codegen.build([S], [X], sched)


def test_a_loop_nest_plan_records_what_the_lowering_wrote():
    Z = te.placeholder((4096, 40), name="Z")
    k = te.reduce_axis(40, "k")
    T = te.compute((4096,), lambda i: te.sum(te.exp(Z[i, k]), axis=k), name="T")
    Q = te.placeholder((4096, 64, 6), name="Q")
    k3 = te.reduce_axis(6, "k3")
    U = te.compute((4096, 64), lambda i, j: te.sum(te.exp(Q[i, j, k3]), axis=k3), name="U")
    kern = codegen.build([T, U], [Z, Q])
    plans = {p.stage: p for p in kern._program.plans}
    units = {u.stage: u for u in kern._program.units}
    t, u = plans["T"], plans["U"]
    assert t.kind == u.kind == "loopnest" and t.rule == u.rule == "gemm"
    assert t.reason.startswith("not a GEMM: the summand is not a product of two loads")
    assert t.loop_order == ("i", "k") and u.loop_order == ("i", "j", "k3")
    # T's 40-term sums: written as N partial sums (acc0_0_p0 .. acc0_0_p<N-1>)
    n = int(t.unroll.split()[1])
    assert t.unroll == f"unroll {n}" and n > 1
    assert f"acc0_0_p{n - 1} = " in units["T"].module_source
    assert f"acc0_0_p{n} = " not in units["T"].module_source
    # U: its rows run in parallel, in chunks of i (codegen.backends.numba_cpu.chunks)
    assert u.execution == ("chunked" if units["U"].chunks else "prange")
    assert u.parallel_axes == ("i",) and units["U"].parallel == (u.execution == "prange")
    _check_values(kern, [T, U], [Z, Q])
