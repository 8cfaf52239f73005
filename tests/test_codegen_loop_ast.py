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


def _isl_dropped_domain():
    # the iteration domain of a gradient stage (fuzz seed 7000600314): islpy
    # 2026.2.2's default AST generator returns a loop nest without its k = 1 points
    j0 = E.iter_var(0, 5, "j0", "spatial")
    j1 = E.iter_var(0, 3, "j1", "spatial")
    k = E.iter_var(0, 2, "k", "reduce")
    m = E.floormod(j0 + k, 3)
    where = te.all(m + j0 >= 2, m + 2 * k >= 2 * j1, 2 * j1 + 1 >= m + 2 * k, m + j0 <= 4)
    space = VarSpace([j0, j1, k])
    dom = box_set(space).intersect(to_set(where, space)[0])
    want = sorted(p for p in itertools.product(range(5), range(3), range(2))
                  if _ev(where, {id(j0): p[0], id(j1): p[1], id(k): p[2]}))
    return LA.Statement("U", (j0, j1, k), dom, [j0, j1, k]), want


def test_a_loop_nest_isl_gets_wrong_is_regenerated():
    st, want = _isl_dropped_domain()
    assert want == [(1, 0, 0), (1, 2, 1), (2, 1, 0), (2, 1, 1), (3, 0, 0), (3, 1, 1)]
    lv = _loop_vars(3)
    tree = LA.generate([st], lv)
    assert sorted(a for _, a in run(tree)) == want
    assert LA.runs_exactly(tree, [st], lv) is None


def test_runs_exactly_names_a_missing_a_duplicated_and_a_displaced_point():
    # translation validation of a loop nest against its statements: the nest of
    # a strided domain with half its points guarded away, run twice, or with a
    # statement argument shifted off its domain
    i = E.iter_var(0, 12, "i", "spatial")
    r = E.iter_var(0, 3, "r", "reduce")
    space = VarSpace([i, r])
    dom = box_set(space).intersect(to_set((i + r) % 3 == 0, space)[0])
    st = LA.Statement("U", (i, r), dom, [i, r])
    lv = _loop_vars(2)
    tree = LA.generate([st], lv)
    assert LA.runs_exactly(tree, [st], lv) is None
    stmts = [n for n in LA.walk(tree) if isinstance(n, LA.Stmt)]
    assert len(stmts) == 1
    node = stmts[0]
    assert "misses" in LA.runs_exactly(LA.If(lv[0] < 6, tree), [st], lv)
    assert "twice" in LA.runs_exactly(LA.Block([tree, tree]), [st], lv)
    args = node.args
    node.args = (args[0], E.floormod(args[1] + 1, 3))
    assert "of its domain" in LA.runs_exactly(tree, [st], lv)
    node.args = args
    extra = LA.Statement("U", (i, r), dom.intersect(to_set(i < 6, space)[0]), [i, r])
    assert "extra" in LA.runs_exactly(tree, [extra], lv)


def test_the_gradient_stage_isl_got_wrong_computes_every_term():
    # the same domain in a reduction stage: the kernel summed the k = 0 terms only
    import numpy as np
    from texpr import codegen
    X = te.placeholder((5, 3), "X", "float64")
    k = te.reduce_axis(2, "k")

    def body(j0, j1):
        m = (j0 + k) % 3
        return te.sum(X[j0, j1] + k * 10, axis=k, where=te.all(
            m + j0 >= 2, m + 2 * k >= 2 * j1, 2 * j1 + 1 >= m + 2 * k, m + j0 <= 4))
    D = te.compute((5, 3), body, name="D")
    x = np.arange(15.0).reshape(5, 3)
    (got,) = codegen.build([D], [X])(x)
    np.testing.assert_array_equal(got, te.evaluate(D, {X: x}))
    assert got[1, 2] == x[1, 2] + 10


def test_two_classes_in_one_strided_loop_are_accepted_and_a_repeat_is_not():
    # fuzz seed 7000802803: isl runs two residue classes of a reduction in one
    # stride-2 loop, U0(c, 2); U2(c + 1, 1) -- an instance at another iterator
    # value than its schedule's, still in schedule order, each point once (the
    # validator first refused it); a loop whose variable the body ignores runs
    # its points twice
    a = E.iter_var(0, 4, "a", "reduce")
    k = E.iter_var(1, 3, "k", "reduce")
    space = VarSpace([a, k])
    box = box_set(space)
    d0 = box.intersect(to_set((3 * a + k - 2) % 6 == 0, space)[0])
    d2 = box.intersect(to_set(3 * ((a + 1) % 2) == 1 - k, space)[0])
    sts = [LA.Statement("U0", (a, k), d0, [a, 0, k]), LA.Statement("U2", (a, k), d2, [a, 2, k])]
    lv = _loop_vars(3)
    tree = LA.generate(sts, lv)
    assert LA.runs_exactly(tree, sts, lv) is None
    trace = run(tree)
    assert [x for x in trace] == sorted(trace, key=lambda t: (t[1][0], t[0], t[1][1]))
    assert sorted(x for _, x in trace) == [(0, 2), (1, 1), (2, 2), (3, 1)]
    extra = E.var("c_extra")
    assert "twice" in LA.runs_exactly(LA.For(extra, 0, 2, 1, tree), sts, lv + [extra])


# ---- an integer where isl's AST has a condition (fuzz seed 7002200745) -------------------

#: the schedule of a gradient stage for which isl's default generator wrote the
#: guard ``if (4 * c0 + c1 <= 5 || 1 || 1)``: C's ``1`` is true; the converter
#: took it for an integer operand of ``||`` and the kernel failed to build
_OR_ONE_UMAP = (
    "{ F0[j0, j1] -> [c0 = j0, c1 = j1, c2 = 2, c3 = 0, c4 = 0, c5 = 0] : 0 <= j0 <= 4 and "
    "0 <= j1 <= 3; I0[j0, j1] -> [c0 = j0, c1 = j1, c2 = 0, c3 = 0, c4 = 0, c5 = 0] : "
    "0 <= j0 <= 4 and 0 <= j1 <= 3; U0[j0, j1, ra, rb, rk] -> [c0 = j0, c1 = j1, c2 = 1, "
    "c3 = ra, c4, c5 = rb] : 2rk = -1 + 4j0 + j1 - 3rb and 2c4 = -1 + 4j0 + j1 - 3rb and "
    "0 <= j1 <= 3 and ra <= 3 and 0 <= rb <= 1 and 3rb >= -5 + 4j0 + j1 and "
    "-1 + 4j0 + j1 - 2ra <= 3rb < 4j0 + j1; U0[j0, j1, ra, rb, rk] -> [c0 = j0, c1 = j1, "
    "c2 = 1, c3 = ra, c4 = rk, c5] : 3rb = j1 and 3c5 = j1 and (j0 + ra) mod 3 = 0 and "
    "j0 <= 4 and 0 <= j1 <= 3 and -2 + j0 <= ra <= 3 and ra <= j0 and 0 <= rk <= 2 and "
    "rk <= ra }")


def test_an_isl_guard_with_an_integer_operand_converts_and_runs_its_domain():
    import islpy as isl
    from texpr.simplify.isl_bridge import CTX

    umap = isl.UnionMap.read_from_str(CTX, _OR_ONE_UMAP)
    names = [f"c{d}" for d in range(6)]
    ids = isl.IdList.alloc(CTX, 6)
    for n in names:
        ids = ids.add(isl.Id(n))
    build = isl.AstBuild.from_context(isl.Set.universe(isl.Space.params_alloc(CTX, 0)))
    node = build.set_iterators(ids).node_from_schedule_map(umap)
    assert "|| 1" in node.to_C_str()  # (this isl's output: the case under test)
    lv = [E.var(n) for n in names]
    tree = LA._convert(node, dict(zip(names, lv)))
    conds = [n.cond for n in LA.walk(tree) if isinstance(n, LA.If)]
    assert conds and all(c.dtype == "bool" for c in conds)
    # the loop nest runs each statement instance of the map's domain once
    want = []
    umap.domain().foreach_set(lambda s: s.foreach_point(lambda p: want.append(
        (s.get_tuple_name(), tuple(p.get_coordinate_val(isl.dim_type.set, k).to_python()
                                   for k in range(s.dim(isl.dim_type.set)))))))
    got = run(tree)
    assert sorted(got) == sorted(want) and len(got) == len(set(got)) == len(want)


def test_an_integer_in_an_isl_condition_is_its_c_truth_value():
    import islpy as isl
    from texpr.simplify.isl_bridge import CTX, ast_cond_to_ir, ast_expr_to_ir

    c = E.var("c")
    by_name = {"c": c}
    cx = isl.AstExpr.from_id(isl.Id("c", context=CTX))

    def val(n):
        return isl.AstExpr.from_val(isl.Val.int_from_si(CTX, n))

    cases = [  # (isl expression, value at c = 0, 3, 7)
        (cx.le(val(5)).or_(val(1)), (True, True, True)),
        (cx.ge(val(2)).and_(val(1)), (False, True, True)),
        (val(0).or_else(cx.eq(val(3))), (False, True, False)),
        (cx.le(val(5)).and_then(val(0)), (False, False, False)),
    ]
    for ae, values in cases:
        e = ast_expr_to_ir(ae, by_name)
        assert e.dtype == "bool"
        assert tuple(bool(_ev(e, {id(c): v})) for v in (0, 3, 7)) == values, ae.to_C_str()
    for n, truth in ((1, True), (0, False), (-2, True)):
        e = ast_cond_to_ir(val(n), by_name)
        assert isinstance(e, E.Const) and e.dtype == "bool" and e.value is truth
    e = ast_cond_to_ir(cx, by_name)  # an integer expression: non-zero is true
    assert e.dtype == "bool"
    assert [bool(_ev(e, {id(c): v})) for v in (0, 3, -1)] == [False, True, True]


def test_a_division_isl_drops_a_loop_of_is_split_into_residue_classes():
    # isl's AST generator (islpy 2026.2) ran only j = 0 of this domain scheduled r
    # outer, j inner, under every option: generate retries with each division's
    # residue classes (a grouped convolution's input gradient, below)
    j = E.iter_var(0, 4, "j", "spatial")
    r = E.iter_var(0, 8, "r", "reduce")
    space = VarSpace([j, r])
    dom = box_set(space).intersect(to_set(te.all(
        4 * j - r <= 4 * ((1 + j) // 2), 4 * ((1 + j) // 2) <= 3 + 4 * j - r), space)[0])
    st = LA.Statement("U", (j, r), dom, [r, j])
    lv = _loop_vars(2)
    tree = LA.generate([st], lv)
    want = sorted((a, b) for a in range(4) for b in range(8) if b // 4 == a // 2)
    assert sorted(a for _, a in run(tree)) == want
    assert LA.runs_exactly(tree, [st], lv) is None


def test_a_grouped_convolution_input_gradient_builds_and_matches_the_evaluator():
    import numpy as np
    from texpr import codegen
    x = te.placeholder((2, 4, 6, 6), "X", "float64")
    w = te.placeholder((8, 2, 3, 3), "W", "float64")
    y = te.nn.conv2d(x, w, groups=2, padding=1)
    h = te.placeholder(y.shape, "H", "float64")
    grads = te.differentiate(y, [x, w], head=h).result
    rng = np.random.default_rng(5)
    vals = [rng.standard_normal(p.shape) for p in (x, w, h)]
    got = codegen.build(list(grads), [x, w, h])(*vals)
    want = te.evaluate(list(grads), dict(zip((x, w, h), vals)))
    for g, ref in zip(got, want):
        np.testing.assert_allclose(g, ref, rtol=1e-12, atol=1e-12)
