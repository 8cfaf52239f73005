"""simplify.loop_ast: loop nests from isl's AST generator, checked by running them.

Each test builds statements over small domains, generates the loop AST and
interprets it in Python: the points each statement visits (and their order)
must be exactly the domain's points, in the schedule's lexicographic order.
No numba here: these are fast.
"""

import itertools

import pytest

import texpr as te
from texpr.simplify import loop_ast as LA
from texpr.simplify.isl_bridge import VarSpace, box_set, to_set
from texpr import expr as E


def _ev(e, env):
    """A tiny integer interpreter of IR expressions (Python floor semantics)."""
    if isinstance(e, E.Const):
        return e.value
    if isinstance(e, E.Var):
        return env[id(e)]
    a = [_ev(x, env) for x in e.args]
    ops = {E.Add: lambda x, y: x + y, E.Sub: lambda x, y: x - y, E.Mul: lambda x, y: x * y,
           E.FloorDiv: lambda x, y: x // y, E.FloorMod: lambda x, y: x % y,
           E.Min: min, E.Max: max, E.EQ: lambda x, y: x == y, E.NE: lambda x, y: x != y,
           E.LT: lambda x, y: x < y, E.LE: lambda x, y: x <= y, E.GT: lambda x, y: x > y,
           E.GE: lambda x, y: x >= y, E.And: lambda x, y: x and y, E.Or: lambda x, y: x or y}
    if type(e) in ops:
        return ops[type(e)](*a)
    if isinstance(e, E.Not):
        return not a[0]
    if isinstance(e, E.Select):
        return a[1] if a[0] else a[2]
    raise TypeError(type(e).__name__)


def run(tree):
    """[(statement name, args)] in execution order; also counts loop-body ``if`` tests."""
    trace, env = [], {}

    def go(n):
        if n is None:
            return
        if isinstance(n, LA.Block):
            for c in n.body:
                go(c)
        elif isinstance(n, LA.For):
            lo, hi = _ev(n.lo, env), _ev(n.hi, env)
            for v in range(lo, hi, n.stride):
                env[id(n.var)] = v
                go(n.body)
                if n.degenerate:
                    break
        elif isinstance(n, LA.If):
            if _ev(n.cond, env):
                go(n.then)
            else:
                go(n.orelse)
        else:
            trace.append((n.name, tuple(_ev(a, env) for a in n.args)))

    go(tree)
    return trace


def _loop_vars(n):
    return [E.var(f"c{d}") for d in range(n)]


def test_strided_conv_gradient_domain_has_strides_and_no_loop_for_solved_variable():
    # dI[h] = sum_{oh, r} dO[oh] W[r] where 2*oh + r - 1 == h (stride 2, pad 1)
    h = E.iter_var(0, 10, "h", "spatial")
    r = E.iter_var(0, 3, "r", "reduce")
    oh = E.iter_var(0, 5, "oh", "reduce")
    sp = VarSpace([h, r, oh])
    s, resid = to_set(2 * oh + r - 1 == h, sp)
    assert resid is None
    dom = box_set(sp).intersect(s)
    st = LA.Statement("U", [h, r, oh], dom, [h, r, oh])
    tree = LA.generate([st], _loop_vars(3))
    fors = [n for n in LA.walk(tree) if isinstance(n, LA.For) and not n.degenerate]
    assert len(fors) == 2  # h and r; oh is solved from the equality
    assert fors[1].stride == 2  # the parity of r is a stride, not a test
    assert not any(isinstance(n, LA.If) for n in LA.walk(tree))
    got = sorted(args for _, args in run(tree))
    want = sorted((hh, rr, o) for hh, rr, o in itertools.product(range(10), range(3), range(5))
                  if 2 * o + rr - 1 == hh)
    assert got == want


def test_reduction_statements_run_init_update_final_in_order():
    i = E.iter_var(0, 4, "i", "spatial")
    k = E.iter_var(0, 6, "k", "reduce")
    sp1, sp2 = VarSpace([i]), VarSpace([i, k])
    tri, _ = to_set(k <= i, sp2)
    sts = [LA.Statement("I", [i], box_set(sp1), [i, 0, 0]),
           LA.Statement("U", [i, k], box_set(sp2).intersect(tri), [i, 1, k]),
           LA.Statement("F", [i], box_set(sp1), [i, 2, 0])]
    trace = run(LA.generate(sts, _loop_vars(3)))
    want = []
    for ii in range(4):
        want.append(("I", (ii,)))
        want += [("U", (ii, kk)) for kk in range(ii + 1)]  # triangle: exact bounds
        want.append(("F", (ii,)))
    assert trace == want


def test_split_schedule_visits_every_point_once_in_tile_order():
    i = E.iter_var(0, 10, "i", "spatial")
    j = E.iter_var(0, 7, "j", "spatial")
    sp = VarSpace([i, j])
    st = LA.Statement("S", [i, j], box_set(sp), [i // 4, j // 3, i % 4, j % 3])
    trace = run(LA.generate([st], _loop_vars(4)))
    pts = [a for _, a in trace]
    assert sorted(pts) == sorted(itertools.product(range(10), range(7)))
    keys = [(a // 4, b // 3, a % 4, b % 3) for a, b in pts]
    assert keys == sorted(keys)


def test_empty_domain_gives_none_and_ast_str_is_readable():
    i = E.iter_var(0, 0, "i", "spatial")
    assert LA.generate([LA.Statement("S", [i], box_set(VarSpace([i])), [i])], _loop_vars(1)) is None
    j = E.iter_var(0, 5, "j", "spatial")
    tree = LA.generate([LA.Statement("S", [j], box_set(VarSpace([j])), [j])], _loop_vars(1))
    assert LA.ast_str(tree).startswith("for c0 in range(0, 5):")


def test_non_affine_schedule_is_a_texpr_error():
    i = E.iter_var(0, 5, "i", "spatial")
    with pytest.raises(te.TexprError, match="quasi-affine"):
        LA.generate([LA.Statement("S", [i], box_set(VarSpace([i])), [i * i])], _loop_vars(1))
