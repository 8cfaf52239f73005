"""Generated text nests at most ``codegen.loopnest.emit.TEXT_MAX_HEIGHT`` parentheses deep.

CPython's parser refuses more than 200 nested parentheses ("too many nested
parentheses") and its compiler about 1,000 nested nodes. A fuzzed gradient (seed
7007500472: a chain of selects inside a reduction, three loads of one input)
summed 216 terms, each computed in a branch of its own, in one line of 216
parentheses: the kernel did not build. A node at that height is now given a
variable, in the statement's order of evaluation (ExprEmitter.bind_shared for what
a statement always evaluates, _StageLowering._bind_branches inside a branch).
"""

import ast

import numpy as np
import pytest

import texpr as te
from texpr import expr as E
from texpr.codegen.loopnest.emit import TEXT_MAX_HEIGHT
from texpr.codegen.loopnest.stage import _StageLowering
from texpr.visitor import post_order

from emit_testutil import CheckFailed, emitter, namespace, nesting

F = "float64"


def _lowering():
    """A stage lowering with nothing but a line writer, to call _bind_branches."""
    low = _StageLowering.__new__(_StageLowering)
    low.k, low._temps, low.lines = 0, 0, []
    low.w = lambda d, text: low.lines.append("    " * d + text)
    return low


def _emit(stmt, em):
    """The lines a stage writes before a statement of value ``stmt``, and the
    statement's text (as _StageLowering does: shared bindings, then branches)."""
    low = _lowering()
    inner = []
    bound = em.bind_shared([stmt], lambda text: low.w(0, text), "let",
                           expand=lambda n: inner.extend(low._bind_branches(em, 0, n)))
    bound += inner + low._bind_branches(em, 0, stmt)
    return low.lines, em(stmt)


def _check_text(lines, text):
    source = "\n".join(lines + [f"out = {text}"])
    compile(ast.parse(source), "<unit>", "exec")  # parses and compiles
    assert nesting(source) <= TEXT_MAX_HEIGHT < 200
    return source


@pytest.mark.parametrize("terms", [60, 250])
def test_a_long_sum_is_written_as_partial_sums_in_its_order(terms):
    x = te.placeholder((terms,), "X", F)
    i = E.var("i")
    stmt = x[0] * 0.5
    for k in range(1, terms):
        stmt = stmt + x[(k * 7) % terms] * (0.5 + k)  # left to right, as written
    em = emitter(x)
    em.names[id(i)] = "i"
    lines, text = _emit(stmt, em)
    source = _check_text(lines, text)
    assert len(lines) >= (terms - 1) // TEXT_MAX_HEIGHT
    xv = np.random.default_rng(1).standard_normal(terms) * 1e3
    ns = namespace(bx=xv, i=0)
    exec(source, ns)
    want = xv[0] * 0.5
    for k in range(1, terms):
        want = want + xv[(k * 7) % terms] * (0.5 + k)
    assert ns["out"] == want  # the same sums in the same order: bit for bit


def test_a_long_sum_in_one_branch_behind_a_guarded_gather_keeps_its_checks():
    # the 216-term sum of the fuzzed gradient sat in a branch, its loads checked:
    # bind_shared cannot bind them, _bind_branches writes the branch as statements
    n, terms = 64, 220
    x = te.placeholder((n,), "X", F)
    idx = te.placeholder((4,), "I", "int64")
    i = E.var("i")
    j = idx[i]
    deep = x[j] * 0.5
    for k in range(1, terms):
        deep = deep + x[j + k % 5] * (0.25 * k)
    stmt = te.if_then_else(te.all(j >= 0, j < n - 2), deep, -1.0)
    em = emitter(x, idx)
    em.names[id(i)] = "i"
    em.checks = {id(e) for e in post_order(stmt) if isinstance(e, E.Load) and e.tensor is x}
    lines, text = _emit(stmt, em)
    source = _check_text(lines, text)
    xv = np.linspace(-2.0, 3.0, n)
    for iv, first_bad in (([5, 0, 60, 61], None), ([70, -3, 2, 100], None),
                          ([61, 0, 0, 0], 3)):  # 61 + 3 is out of range
        ns = namespace(bx=xv, bi=np.array(iv), i=0)
        if first_bad is not None:
            with pytest.raises(CheckFailed):
                exec(source, ns)
            continue
        exec(source, ns)
        jv = iv[0]
        if 0 <= jv < n - 2:
            want = xv[jv] * 0.5
            for k in range(1, terms):
                want = want + xv[jv + k % 5] * (0.25 * k)
        else:  # the guard is false: no load of X runs, none is checked
            want = -1.0
        assert ns["out"] == want


def test_a_shallow_statement_keeps_its_text():
    # below the height and size bounds nothing is bound: the text is unchanged
    x = te.placeholder((8,), "X", F)
    stmt = x[0]
    for k in range(1, 20):
        stmt = stmt * 0.5 + x[k % 8]
    em = emitter(x)
    lines, text = _emit(stmt, em)
    assert lines == [] and nesting(text) >= 20


@pytest.mark.parametrize("levels,ndim", [(45, 2), (30, 5)])
def test_a_chain_of_checked_gathers_builds_and_matches(levels, ndim):
    # an attack: each checked load writes 5 parentheses or more (b[np.uint64((_ck(
    # np.int64(...), more on a 5-D table), so a bound of 48 nodes let 45 levels
    # write 225: SyntaxError "too many nested parentheses"
    from texpr import codegen
    table = te.placeholder((8,) + (2,) * (ndim - 1), "T", "int64")
    x = te.placeholder((8,), "X", F)

    def body(i):
        e = i
        for _ in range(levels):
            e = table[(e,) + (1,) * (ndim - 1)]
        return x[e]

    y = te.compute((8,), body, name="Y")
    tv = np.zeros(table.shape, dtype=np.int64)
    tv[(slice(None),) + (1,) * (ndim - 1)] = [3, 1, 4, 0, 5, 7, 2, 6]
    xv = np.arange(8.0) * 1.5
    kernel = codegen.build([y], [table, x], parallel=False, blas=False)
    np.testing.assert_array_equal(kernel(tv, xv)[0], te.evaluate(y, {table: tv, x: xv}))
    for line in kernel.source.splitlines():
        assert nesting(line) < 200


def test_a_deep_branch_of_a_large_statement_is_written_in_parts(monkeypatch):
    # an attack: select(X > 0, max(chain of 45 checked gathers, a max tree over 1,100
    # leaves), 0): the branch's text was too deep, and _bind_branches left every
    # statement of more than LET_MAX_DAG_NODES (2,000) nodes alone: a raw
    # SyntaxError. Here the bound is lowered to 60 (40 leaves) to build in seconds
    from texpr import codegen
    from texpr.codegen.loopnest import stage
    monkeypatch.setattr(stage, "LET_MAX_DAG_NODES", 60)
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    table = te.placeholder((3, 3), "T", "int64")
    x = te.placeholder((3, 3), "X", F)

    def body(i, j):
        e = i
        for _ in range(45):
            e = table[e, j]
        leaves = [te.min(x[i, j], te.const(-float(n), F)) for n in range(40)]
        while len(leaves) > 1:
            leaves = [te.max(leaves[a], leaves[a + 1]) for a in range(0, len(leaves) - 1, 2)] + (
                leaves[-1:] if len(leaves) % 2 else [])
        return te.if_then_else(x[i, j] > 0.0, te.max(te.cast(e, F), leaves[0]), 0.0)

    y = te.compute((3, 3), body, name="Y")
    feed = {table: np.array([[1, 2, 0]] * 3), x: np.arange(9.0).reshape(3, 3) - 4}
    kernel = codegen.build([y], [table, x], parallel=False, blas=False)
    assert all(nesting(line) <= TEXT_MAX_HEIGHT for line in kernel.source.splitlines())
    np.testing.assert_array_equal(kernel(feed[table], feed[x])[0], te.evaluate(y, feed))
    bad = dict(feed)
    bad[table] = np.array([[1, 2, 3]] * 3)  # a gather leaves T where X > 0
    with pytest.raises(te.OutOfBoundsError):
        kernel(bad[table], bad[x])
