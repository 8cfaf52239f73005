"""isl's output is checked before texpr uses it (translation validation): a loop
nest against its statements' domains (tests/test_codegen_loop_ast.py), and a
condition or piecewise expression isl writes for a set or PwAff against that
set or PwAff. A wrong answer from isl falls back to another form or raises a
TexprError, never becomes a wrong domain."""

import pytest

import texpr as te
from texpr import expr as E
from texpr.simplify import isl_bridge as B


def _space():
    i = E.iter_var(0, 10, "i", "spatial")
    k = E.iter_var(0, 4, "k", "reduce")
    return i, k, B.VarSpace([i, k])


def _corrupt_first(monkeypatch, n_bad, space, lie):
    # isl's AST builder told a context that is not true (``lie`` too) for the
    # first n_bad calls: its expressions are then right only where ``lie`` holds
    real = B._ast_build_on
    calls = [0]

    def bad(sp, context):
        calls[0] += 1
        if calls[0] <= n_bad:
            known = sp.universe() if context is None else context
            return real(sp, known.intersect(lie))
        return real(sp, context)
    monkeypatch.setattr(B, "_ast_build_on", bad)
    return calls


def test_a_wrong_condition_falls_back_then_raises(monkeypatch):
    i, k, space = _space()
    s = B.box_set(space).intersect(B.to_set((i + k) % 3 == 0, space)[0])
    ctx = B.to_set(i >= 2, space)[0]
    good = B.set_to_expr(s, space, ctx)
    assert B.to_set(good, space)[0].intersect(ctx).is_equal(s.intersect(ctx))
    lie = B.to_set(i <= 5, space)[0]
    _corrupt_first(monkeypatch, 1, space, lie)
    again = B.set_to_expr(s, space, ctx)  # the context's form was wrong: without it
    assert B.to_set(again, space)[0].is_equal(s)
    _corrupt_first(monkeypatch, 2, space, lie)
    with pytest.raises(te.TexprError, match="not equal"):
        B.set_to_expr(s, space, ctx)


def test_a_wrong_piecewise_expression_falls_back_then_raises(monkeypatch):
    i, k, space = _space()
    pa = B.to_pwaff(E.maximum(i - 2 * k, E.const(0)) + E.floordiv(i, 3), space)
    ctx = B.to_set(k <= 1, space)[0]
    e = B.pwaff_to_expr(pa, space, ctx)
    assert ctx.is_subset(B.to_pwaff(e, space).eq_set(pa))
    lie = B.to_set(E.logical_and(i >= 8, k <= 1), space)[0]  # i - 2k > 0: no max
    _corrupt_first(monkeypatch, 1, space, lie)
    e = B.pwaff_to_expr(pa, space, ctx)
    assert B.to_pwaff(e, space).eq_set(pa).is_equal(space.universe())
    _corrupt_first(monkeypatch, 2, space, lie)
    with pytest.raises(te.TexprError, match="not equal"):
        B.pwaff_to_expr(pa, space, ctx)
