"""A chain of selects in one body: ``v_{k+1} = select(v_k > c_k, f(v_k), g(v_k))``.

An attack's chain of depth 5 gave a gradient unit of 89 KB of source that numba
compiled in 265-352 s and 2.1 GB (depth 6: out of memory). Three causes, each
fixed and tested here:

* the simplifier split every such select into guarded terms, 2^d of them,
  and kept the mixed ones (``c && !c``) of products of two selects on one
  condition (simplify.terms: ``_value_condition``, ``_false``);
* the text-level CSE did not share what an ``if`` condition computes with its
  branches, nor what both branches of a conditional expression compute
  (codegen.loopnest.cse);
* the emitter wrote a DAG as a tree: a large statement now gets a variable for
  each shared subexpression it always evaluates (ExprEmitter.bind_shared).
"""

import ast

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr import expr as E
from texpr.codegen.loopnest.cse import hoist_common_subexpressions
from texpr.testing import numeric_gradient
from texpr.visitor import post_order
from simplify.terms import guarded_terms
from emit_testutil import emitter

F = "float64"


def _chain(x, i, depth, form):
    v = x[i]
    for d in range(depth):
        if form == "poly":
            v = te.if_then_else(v > 0.1 * d, v * v, v * 0.5 + 1.0)
        else:
            v = te.if_then_else(v > 0.1 * d, te.sin(v) * v, te.exp(-v) - v)
    return v


def _graph(depth, form="poly", n=8):
    x = te.placeholder((n,), "X", F)
    y = te.compute((n,), lambda i: _chain(x, i, depth, form), name="Y")
    r = te.reduce_axis(n, "r")
    loss = te.compute((), lambda: te.sum(y[r], axis=r), name="L")
    return x, loss


@pytest.mark.parametrize("form", ["poly", "trig"])
def test_the_simplified_gradient_grows_linearly_with_depth(form):
    sizes = []
    for depth in (3, 6, 9):
        x, loss = _graph(depth, form)
        (g,) = te.differentiate(loss, [x])
        sizes.append(sum(len(post_order(b)) for b in g.op.body))
    # DAG nodes per level stay constant (they were 2^d terms of d factors)
    step1, step2 = sizes[1] - sizes[0], sizes[2] - sizes[1]
    assert abs(step2 - step1) <= 3 and step2 <= 3 * 20, sizes


def test_a_select_between_two_float_values_stays_one_term():
    a = te.placeholder((4,), "A", F)
    b = te.placeholder((4,), "B", F)
    i = E.var("i")
    k = E.var("k")
    e = te.if_then_else(a[i] > b[i], a[i] * 2.0, b[i] - 1.0)
    assert len(guarded_terms(e * e)) == 1
    # a zero branch is a nonzeroness condition: it is still split off
    z = te.if_then_else(a[i] > 0.0, a[i], 0.0)
    assert [len(cs) for cs, _v in guarded_terms(z * e)] == [1]
    # an index condition inside a branch still reaches the top
    w = te.if_then_else(a[i] > 0.0, te.if_then_else(i == k, a[i], 0.0), b[i])
    terms = guarded_terms(w)
    assert len(terms) == 2 and any(any("==" in str(c) for c in cs) for cs, _v in terms)


def test_mixed_branches_of_one_condition_are_dropped():
    a = te.placeholder((4,), "A", F)
    i = E.var("i")
    c = a[i] > 0.0
    s1 = te.if_then_else(c, a[i], 0.0)
    s2 = te.if_then_else(E.logical_not(c), a[i] * 3.0, 0.0)
    assert guarded_terms(s1 * s2) == []  # c && !c: never both


def test_depth_8_builds_in_seconds_and_matches_the_evaluator_and_finite_differences():
    x, loss = _graph(8)
    (g,) = te.differentiate(loss, [x])
    kernel = codegen.build([loss, g], [x])
    code = "\n".join(ln for ln in kernel.source.splitlines() if not ln.lstrip().startswith("#"))
    assert len(code) < 12_000  # under 1 KB per level of the chain; it was 4x per level
    xv = np.array([-1.0, -0.63, -0.2, 0.05, 0.31, 0.52, 0.77, 0.9])  # values stay below 10
    feed = {x: xv}
    got = kernel(xv)
    want = te.evaluate([loss, g], feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-13)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-13)
    np.testing.assert_allclose(got[1], numeric_gradient(loss, x, feed), rtol=1e-6)


_HEAD = "import numpy as np\n\n\ndef unit(b0, out):\n"


def _run(text, b0):
    ns = {"np": np}
    exec(text, ns)
    out = np.zeros(2)
    ns["unit"](b0, out)
    return out


def test_cse_shares_what_both_branches_compute_and_what_the_condition_computes():
    v = "np.tanh(b0[0] * 2.0 + b0[1])"
    d = "np.exp(b0[1] * 3.0 - b0[0])"
    text = _HEAD + f"    out[0] = {d} * {v} if {v} > 0.1 else {d} * 0.5\n    return 0\n"
    new = hoist_common_subexpressions(text, "unit")
    assert new.count("np.tanh(") == 1 and new.count("np.exp(") == 1
    for b0 in (np.array([0.3, 0.1]), np.array([-0.3, 0.1]), np.array([np.nan, 1.0])):
        np.testing.assert_array_equal(_run(new, b0), _run(text, b0))


def test_cse_keeps_what_one_branch_alone_computes_inside_it():
    # b0[7] is out of range: only the branch that is not taken reads it, twice
    guarded = "np.exp(b0[7] * 3.0 + 1.0)"
    v = "np.tanh(b0[0] * 2.0 + b0[1])"
    text = (_HEAD + f"    out[0] = {guarded} * {guarded} if {v} > 5.0 else {v} * {v} + 1.0\n"
            "    return 0\n")
    new = hoist_common_subexpressions(text, "unit")
    b0 = np.array([0.3, 0.1])
    np.testing.assert_array_equal(_run(new, b0), _run(text, b0))
    fn = next(n for n in ast.parse(new).body if isinstance(n, ast.FunctionDef))
    temps = [n for n in fn.body if isinstance(n, ast.Assign)
             and isinstance(n.targets[0], ast.Name) and n.targets[0].id.startswith("cse")]
    assert len(temps) == 1 and "b0[7]" not in ast.unparse(temps[0])


def _emitter(x, idx_tensor=None):
    return emitter(x) if idx_tensor is None else emitter(x, idx_tensor)


def _chain_expr(x, i, depth):
    v = x[i]
    for d in range(depth):
        v = te.if_then_else(v > 0.1 * d, v * v, v * 0.5 + 1.0)
    return v


def test_the_emitter_binds_what_a_large_statement_always_evaluates_or_safely_can():
    x = te.placeholder((8,), "X", F)

    def body(j):
        v = _chain_expr(x, j, 6)
        # used twice, in one branch only, reading a load the statement does not
        # always read (it might be guarded by the condition): stays in its branch
        guarded = te.exp(x[7 - j] * 3.0 + 1.0)
        return te.if_then_else(v > 2.0, guarded * guarded, v)

    i = E.var("i")
    em = _emitter(x)
    em.names[id(i)] = "i"
    stmt = body(i)
    lines = []
    bound = em.bind_shared([stmt], lines.append, "let")
    assert len(lines) == len(bound) >= 6  # each level of the chain once
    assert not any("np.exp" in ln for ln in lines)  # the branch-only repeat stays put
    text = em(stmt)
    assert text.count(" if ") == 1 and len(text) < 200
    # the bindings, then the statement, give the evaluator's value
    y = te.compute((8,), body, name="Y")
    for xv in (np.linspace(-1.0, 0.9, 8), np.full(8, np.nan)):
        want = te.evaluate(y, {x: xv})
        for k in range(8):
            ns = {"np": np, "bx": xv, "i": k}
            for ln in lines:
                exec(ln, ns)
            np.testing.assert_array_equal(eval(text, ns), want[k])
    em.unbind(bound)
    assert em(stmt).count(" if ") > 6  # unbound: the tree again


def _gather_chain(x, idx, i):
    v = x[idx[i]]  # a data-dependent index: checked
    for d in range(6):
        v = te.if_then_else(v > 0.1 * d, v * v, v * 0.5 + 1.0)
    return v


def test_the_emitter_binds_checked_subexpressions_in_order_only():
    x = te.placeholder((8,), "X", F)
    idx = te.placeholder((8,), "I", "int64")
    i = E.var("i")
    # alone, the chain over a checked load binds level by level, the checks inside
    em = _emitter(x, idx)
    em.names[id(i)] = "i"
    v = _gather_chain(x, idx, i)
    em.checks = {id(n) for n in post_order(v) if isinstance(n, E.Load) and n.tensor is x}
    lines = []
    em.bind_shared([v], lines.append, "let")
    assert len(lines) >= 5 and "_ck(" in lines[0]
    codes = [int(c) for ln in lines for c in __import__("re").findall(r"np\.int64\((\d+)\)\)", ln)]
    assert codes == sorted(codes)  # the checks keep their order of evaluation
    # another gather read first: its checked load is bound first, then the chain
    em = _emitter(x, idx)
    em.names[id(i)] = "i"
    first = x[idx[i + 1]]
    stmt = first * 2.0 + v
    em.checks = {id(n) for n in post_order(stmt) if isinstance(n, E.Load) and n.tensor is x}
    lines = []
    em.bind_shared([stmt], lines.append, "let")
    assert "i + 1" in lines[0] and len(lines) >= 6 and len(em(stmt)) < 300
    codes = [int(c) for ln in lines for c in __import__("re").findall(r"np\.int64\((\d+)\)\)", ln)]
    assert codes == sorted(codes)
    # a check inside one branch of a select, read first, holds the chain's checks back
    em = _emitter(x, idx)
    em.names[id(i)] = "i"
    cond_first = te.if_then_else(x[i] > 0.0, x[idx[i + 1]], 1.0)
    stmt = cond_first * 2.0 + v
    em.checks = {id(n) for n in post_order(stmt)
                 if isinstance(n, E.Load) and n.tensor is x and n is not x[i]}
    lines = []
    em.bind_shared([stmt], lines.append, "let")
    assert not any("_ck(" in ln for ln in lines)


def test_a_stacked_max_tangent_is_bound_where_it_cannot_fail():
    # the tie rule reads a max(v, 0)'s tangent in two of three branches: never
    # always evaluated, but it holds no check and reads only X[i], which the
    # statement always reads, so it is bound (an attack: 2^depth copies, 372 s and
    # 7 GB of numba at depth 10)
    x = te.placeholder((8,), "X", F)

    def chain(j):
        v = x[j]
        for _ in range(10):
            v = te.max(v * 0.9 + 0.1, 0.0)
        return v

    y = te.compute((8,), chain, name="Y")
    r = te.reduce_axis(8, "r")
    loss = te.compute((), lambda: te.sum(y[r], axis=r), name="L")
    (g,) = te.differentiate(loss, [x])
    (body,) = g.op.body
    em = _emitter(x)
    em.names[id(g.op.axis[0])] = "i"
    lines = []
    em.bind_shared([body], lines.append, "let")
    text = em(body)
    assert len(lines) >= 9 and len(text) < 600
    xv = np.linspace(-1.0, 1.0, 8)
    want = te.evaluate(g, {x: xv})
    for k in range(8):
        ns = {"np": np, "bx": xv, "i": k,
              "_fmax_float64": max, "_fmin_float64": min}
        for ln in lines:
            exec(ln, ns)
        np.testing.assert_allclose(eval(text, ns), want[k], rtol=1e-15)


def test_a_chain_over_a_guarded_gather_builds_linear_code_and_matches():
    # the chain reads X at a data index, only where the index is in range: its loads
    # are checked and sit in one branch, so ExprEmitter.bind_shared left them alone;
    # the gradient scatter's where test and value were trees of O(3^d) text (a fuzzed
    # program, seed 7007400007: 430 KB, numba out of memory at 23 GB; depth 5 here
    # built in 217 s with 103 KB, depth 6 ran out of memory). Now each select is an
    # if statement whose branches bind what they compute (_StageLowering._bind_branches)
    n, depth = 8, 4
    x = te.placeholder((n,), "X", F)
    idx = te.placeholder((n,), "I", "int64")
    y = te.compute((n,), lambda i: te.if_then_else(
        te.all(idx[i] >= 0, idx[i] < n), _chain(x, idx[i], depth, "poly"), 0.0), name="Y")
    r = te.reduce_axis(n, "r")
    loss = te.compute((), lambda: te.sum(y[r] * y[r], axis=r), name="L")
    (g,) = te.differentiate(loss, [x])
    kernel = codegen.build([loss, g], [x, idx])
    code = "\n".join(ln for ln in kernel.source.splitlines() if not ln.lstrip().startswith("#"))
    assert len(code) < 20_000  # 47 KB before at depth 4 (and 103 KB at 5)
    xv = np.array([-1.0, -0.63, -0.2, 0.05, 0.31, 0.52, 0.77, 0.9])
    iv = np.array([3, 9, 0, 7, -1, 2, 2, 5])
    feed = {x: xv, idx: iv}
    got = kernel(xv, iv)
    want = te.evaluate([loss, g], feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    # an index out of range where the guard does not hold is no error; inside it is
    bad = np.array([3, 9, 0, 7, -1, 2, 2, 5])
    bad[0] = 8
    kernel(xv, bad)  # guarded: I = 8 is outside [0, 8) and never read


def _argmax_over_a_padded_chain(depth):
    # the chain reads X through a zero-padded window (an index condition), then a
    # max picks one point per row: the gradient is a scatter under an equality
    # with the argmax, its value the chain's derivative at the gathered point
    x = te.placeholder((3, 4), "X", F)
    c = te.placeholder((3,), "C", F)
    k = te.reduce_axis(4, "k")

    def chain(i, k):
        v = te.if_then_else(te.all(i + k - 1 >= 0, i + k - 1 < 3), x[i + k - 1, k], 0.0)
        v = te.if_then_else(v > 0.25, v * 2.0, v - 1.0)
        for d in range(depth):
            v = te.if_then_else(v > 0.25 * (d % 2), te.tanh(v) * v, v * 0.5 - 0.1)
        return v

    m = te.compute((3,), lambda i: te.max(chain(i, k), axis=k), name="M")
    r = te.reduce_axis(3, "r")
    loss = te.compute((), lambda: te.sum(c[r] * m[r], axis=r), name="L")
    return x, c, loss


def test_a_chain_behind_an_index_guard_stays_one_guarded_term():
    # fuzz seed 7016100177: the chain's derivative carried the padding's index
    # condition into every level, so no level was "value conditions only" and each
    # split in two: 72 guarded terms at depth 6, a 439 KB unit, 6 minutes of numba.
    # Terms told apart by value conditions alone are one term (simplify.terms._compact)
    # (and lift_conditions keeps the summand as written when its terms are more
    # than twice its size)
    depths = (4, 6, 8, 10, 12)
    sizes = []
    for depth in depths:
        x, c, loss = _argmax_over_a_padded_chain(depth)
        (g,) = te.differentiate(loss, [x])
        sizes.append(len(te.graph_str(g)))  # (let-bound: the DAG's size, not a tree's)
    # linear in depth: 2,054 ... 4,259 characters (6,407 at depth 4 and 9,576 at 10 before)
    assert all(s <= 1000 + 450 * d for d, s in zip(depths, sizes)), sizes
    x, c, loss = _argmax_over_a_padded_chain(6)
    raw = te.differentiate(loss, [x], simplify=False)
    (g,) = te.differentiate(loss, [x])
    rng = np.random.RandomState(3)
    for _ in range(3):
        feed = {x: rng.randn(3, 4), c: np.array([1.0, -2.0, 0.5])}
        want = te.evaluate(list(raw)[0], feed)
        np.testing.assert_allclose(te.evaluate(g, feed), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(want, numeric_gradient(loss, x, feed), rtol=1e-5, atol=1e-7)


def test_a_guarded_chain_over_an_argmax_compiles_small_and_matches():
    x, c, loss = _argmax_over_a_padded_chain(6)
    (g,) = te.differentiate(loss, [x])
    kernel = codegen.build([loss, g], [x, c])
    code = "\n".join(ln for ln in kernel.source.splitlines() if not ln.lstrip().startswith("#"))
    assert len(code) < 30_000, len(code)
    feed = {x: np.random.RandomState(4).randn(3, 4), c: np.array([1.0, -2.0, 0.5])}
    got = kernel(feed[x], feed[c])
    want = te.evaluate([loss, g], feed)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-14)
