"""The passes one by one: equivalence under fuzzing (Hypothesis), the
environment switches, explain, the materialisation rule, the bridges, errors,
and the symbolic speed of a small CNN."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

import texpr as te
from texpr.errors import TexprError

from texpr import simplify
from texpr.simplify import PIPELINE, SimplifyError, run_passes, verify_equal
from texpr.simplify.materialize import materialized_stages
from texpr.testing import random_feed as feed_for

# ---- fuzzing: random quasi-affine domains and index maps ---------------------------


@st.composite
def index_expr(draw, vars):
    """A random quasi-affine index: c + a*v + b*w, then maybe // d, % d, or a clamp."""
    v = draw(st.sampled_from(vars))
    w = draw(st.sampled_from(vars))
    a = draw(st.integers(-2, 3))
    b = draw(st.integers(-1, 2))
    c = draw(st.integers(-2, 3))
    e = a * v + b * w + c if (a or b) else v + c
    kind = draw(st.sampled_from(["plain", "div", "mod", "clamp", "divmod", "gather"]))
    d = draw(st.integers(2, 3))
    if kind == "div":
        e = e // d
    elif kind == "mod":
        e = e % d + v
    elif kind == "divmod":
        e = (e // d) * 2 + e % d
    elif kind == "clamp":
        e = te.max(te.min(e, draw(st.integers(1, 5))), 0)
    elif kind == "gather":  # a data-dependent index (the fed index list is all zeros)
        e = GATHER_INDEX[v % 4] + c
    return e


#: the int tensor the fuzzed gathers read their indices from
GATHER_INDEX = te.placeholder((4,), "I", dtype="int64")


@st.composite
def stage(draw):
    """A random stage Y reading X (guarded or clamped loads, strides, where=)."""
    n = draw(st.integers(2, 7))
    m = draw(st.integers(1, 5))
    kext = draw(st.integers(0, 4))
    two_d = draw(st.booleans())
    X = te.placeholder((n, 3) if two_d else (n,), "X")
    W = te.placeholder((max(kext, 1),), "W")
    guard_kind = draw(st.sampled_from(["select", "clamp"]))
    where_kind = draw(st.sampled_from(["none", "tri", "mod", "lin"]))
    mod_d = draw(st.integers(2, 3))
    lin = draw(st.integers(-1, 2))
    seed_ = draw(st.integers(0, 2**16))

    def body(i):
        k = te.reduce_axis(kext, "k") if kext else None
        vars = [i, k] if k is not None else [i]
        e = draw(index_expr(vars))

        def load(e):
            if guard_kind == "clamp":
                idx = te.max(te.min(e, n - 1), 0)
                return X[(idx, i % 3) if two_d else idx]
            inb = te.all(e >= 0, e < n)
            return te.if_then_else(inb, X[(e, i % 3) if two_d else e], 0.0)

        src = load(e)
        if draw(st.booleans()):
            src = src + load(draw(index_expr(vars)))
        if k is None:
            return src * 2.0
        src = src * W[k]
        where = None
        if where_kind == "tri":
            where = k <= i
        elif where_kind == "mod":
            where = (i + k) % mod_d == 0
        elif where_kind == "lin":
            where = k * lin + i < m
        return te.sum(src, axis=k, where=where)

    Y = te.compute((m,), body, name="Y")
    return Y, X, seed_


@seed(20261129)
@settings(max_examples=120, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(stage())
def test_fuzz_each_pass_preserves_values(case):
    Y, X, seed_ = case
    H = te.placeholder(Y.shape, "H")
    raw = list(te.differentiate(Y, [X], head=H, simplify=False))
    note(te.graph_str(raw))
    tensors = raw
    for rnd in range(2):
        for p in PIPELINE:
            before = tensors
            tensors = p(tensors)
            note(f"after {p.__name__}:\n{te.graph_str(tensors)}")
            verify_equal(before, tensors, p.__name__, seed=seed_)
    final = simplify.simplify(raw)
    verify_equal(raw, final, "simplify", seed=seed_ + 1)
    assert simplify.iteration_count(final) <= simplify.iteration_count(raw)


# ---- the switches, explain, errors -----------------------------------------------


def _dense():
    X = te.placeholder((4, 6), "X")
    W = te.placeholder((3, 6), "W")
    Y = te.nn.dense(X, W)
    H = te.placeholder(Y.shape, "H")
    return Y, X, W, H


def test_print_passes(monkeypatch, capsys):
    Y, X, W, H = _dense()
    raw = list(te.differentiate(Y, [X], head=H, simplify=False))
    monkeypatch.setenv("TEXPR_PRINT_PASSES", "1")
    simplify.simplify(raw)
    err = capsys.readouterr().err
    for p in PIPELINE:
        assert f"after {p.__name__}" in err


def test_verify_catches_a_wrong_pass(monkeypatch):
    Y, X, W, H = _dense()
    raw = list(te.differentiate(Y, [X], head=H, simplify=False))

    def wrong_pass(tensors):
        t = tensors[0]
        return [te.compute(t.shape, lambda i, j: t[i, j] * 2.0, name="wrong")]

    monkeypatch.setenv("TEXPR_VERIFY", "1")
    run_passes(raw, PIPELINE)  # the real passes verify fine
    with pytest.raises(SimplifyError, match="wrong_pass"):
        run_passes(raw, (wrong_pass,))


def test_explain_records_each_pass():
    Y, X, W, H = _dense()
    raw = te.differentiate(Y, [X], head=H, simplify=False)[0]
    text = simplify.explain(raw)
    assert "1,728 (input)" in text  # 4*6 outputs x 4*3*6 reduction points
    assert "lift_conditions" in text and "final: iteration count 72" in text
    assert "sum(H[j0, r_j] * W[r_j, j1]" in text


def _explain_table(text):
    """The per-pass lines of an explain text: {(round, pass): (before, after) or None}."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"  round (\d+) (\w+)\s+(?:([\d,]+) ->\s+([\d,]+)|=)$", line)
        if m:
            nums = None if m.group(3) is None else (int(m.group(3).replace(",", "")),
                                                   int(m.group(4).replace(",", "")))
            rows[(int(m.group(1)), m.group(2))] = nums
    return rows


def test_explain_after_differentiate_keeps_the_record():
    # the case: explain of a simplified result used to re-run the pipeline
    # on an already simplified graph and print "no pass changed the graph" only
    Y, X, W, H = _dense()
    res = te.differentiate(Y, [X, W], head=H)
    raw = te.differentiate(Y, [X, W], head=H, simplify=False)
    for t, r in ((res[0], raw[0]), (res[1], raw[1])):
        text = simplify.explain(t)
        rows = _explain_table(text)
        assert {name for _r, name in rows} == {p.__name__ for p in PIPELINE}
        changed = [v for v in rows.values() if v is not None]
        assert changed, text
        first = text.splitlines()[0]
        assert f"{simplify.iteration_count([r]):,} (input)" in first
        assert f"final: iteration count {simplify.iteration_count([t]):,}" in text
        # the counts chain: each changed pass starts where the previous one ended
        counts = [c for v in changed for c in v]
        assert counts[0] == simplify.iteration_count([r])
        assert changed[-1][1] == simplify.iteration_count([t])
        assert rows[(1, "lift_conditions")][1] < rows[(1, "lift_conditions")][0]
    assert simplify.explain(res[0]) == res.explain(res[0])


def test_result_explain_counts_all_results_together():
    Y, X, W, H = _dense()
    res = te.differentiate(Y, [X, W], head=H)
    text = res.explain()
    assert text.startswith(f"explain {res[0].name}, {res[1].name}: iteration count "
                           f"{24 * 72 + 18 * 72:,} (input)")  # dX, dW: 24 and 18 outputs x 72
    assert f"final: iteration count {simplify.iteration_count(list(res)):,}" in text


def test_explain_of_an_intermediate_adjoint():
    X = te.placeholder((3, 4), "X")
    Y = te.compute((12,), lambda i: X[i // 4, i % 4] * X[i // 4, i % 4], name="Y")
    k = te.reduce_axis(12, "k")
    L = te.compute((), lambda: te.sum(Y[k], axis=k), name="L")
    res = te.differentiate(L, [X])
    text = simplify.explain(res.adjoints[Y])
    assert text.startswith(f"explain {res.adjoints[Y].name}:")
    assert _explain_table(text)
    # the gradient's record shows the flatten's sum solved away
    rows = _explain_table(res.explain())
    assert any(v is not None and v[1] < v[0] for v in rows.values())
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    np.testing.assert_allclose(te.evaluate(res[0], {X: x}), 2 * x, rtol=1e-6)


def test_explain_without_a_record():
    Y, X, W, H = _dense()
    raw = te.differentiate(Y, [X], head=H, simplify=False)
    with pytest.raises(TexprError, match="simplify=False"):
        raw.explain()
    res = te.differentiate(Y, [X], head=H)
    with pytest.raises(TexprError, match="not one of the tensors"):
        res.explain(W)
    # a tensor simplify did not return (a forward stage) is simplified on the spot
    assert simplify.explain(Y).startswith(f"explain {Y.name}: iteration count 72 (input)")


def test_errors_are_texpr_errors():
    with pytest.raises(TexprError):
        simplify.simplify(te.placeholder((2,), "x"))
    with pytest.raises(TexprError):
        simplify.simplify([1, 2])
    with pytest.raises(TexprError):
        simplify.iteration_count(["x"])
    with pytest.raises(TexprError):
        simplify.explain("x")


def test_placeholders_and_order_preserved():
    Y, X, W, H = _dense()
    raw = list(te.differentiate(Y, [X, W], head=H, simplify=False))
    out = simplify.simplify(raw)
    assert [t.shape for t in out] == [X.shape, W.shape]
    from texpr.tensor import PlaceholderOp, topo_order
    phs = {op.output(0) for op in topo_order(out) if isinstance(op, PlaceholderOp)}
    assert phs == {H, X, W}
    assert simplify.simplify([X]) == [X]


# ---- the materialisation rule ----------------------------------------------------------


def test_materialized_stages_rule():
    X = te.placeholder((8, 8), "X")
    cheap = te.compute((8, 8), lambda i, j: X[j, i] + 1.0, name="cheap")
    costly = te.compute((8, 8), lambda i, j: te.exp(X[i, j]), name="costly")
    k = te.reduce_axis(8, "k")
    A = te.compute((8, 8), lambda i, j: te.sum(cheap[i, k] * costly[k, j], axis=k), name="A")
    B = te.compute((8,), lambda i: costly[i, i] * 2.0, name="B")
    ops = materialized_stages([A, B])
    names = [op.name for op in ops]
    # costly is read at different indices by two consumers (and along a reduction);
    # cheap does float work and A's reduction re-reads it (8 times per element): the
    # policy stores it (materialize.stored_is_cheaper) rather than add 1.0 at every tap
    assert names == ["cheap", "costly", "A", "B"]
    # 64 (cheap) + 64 (costly) + 512 (A) + 8 (B)
    assert simplify.iteration_count([A, B]) == 64 + 64 + 512 + 8
    # a transpose alone does no work: inlined into the reduction, a view of X
    view = te.compute((8, 8), lambda i, j: X[j, i], name="view")
    A2 = te.compute((8, 8), lambda i, j: te.sum(view[i, k] * costly[k, j], axis=k), name="A2")
    assert [op.name for op in materialized_stages([A2])] == ["costly", "A2"]
    # an expensive stage read once, injectively, by an elementwise stage is inlined
    C = te.compute((8,), lambda i: te.exp(X[i, 0]), name="C")
    D = te.compute((8,), lambda i: C[i] * 3.0, name="D")
    assert [op.name for op in materialized_stages([D])] == ["D"]
    assert [op.name for op in materialized_stages([C, D])] == ["C", "D"]


def test_iteration_count_is_symbolic():
    X = te.placeholder((4096, 4096), "X")
    k = te.reduce_axis(4096, "k")
    Y = te.compute((4096, 4096), lambda i, j: te.sum(X[i, k], axis=k, where=k <= j), name="cs")
    assert simplify.iteration_count([Y]) == 4096 * 4096 * 4097 // 2


# ---- bridges -------------------------------------------------------------------------


def test_sympy_bridge_canonical_forms():
    from texpr.simplify.sympy_bridge import canonical_index, proves_equal
    from texpr import expr as E

    h = E.iter_var(0, 10, "h", "spatial")
    r = E.iter_var(0, 3, "r", "reduce")
    assert repr(canonical_index(E.const(0) - r + (h + r) // 3)) == "(h + r) // 3 - r"
    assert repr(canonical_index((2 * h + 1) % 2)) == "1"
    assert proves_equal((h * 4 + 2) // 2, 2 * h + 1)
    assert not proves_equal(h // 2, h)
    x = te.placeholder((3,), "x")
    assert canonical_index(x[h % 3] * 2.0) is not None  # not index arithmetic: unchanged


def test_isl_bridge_solving_and_counting():
    from texpr.simplify import isl_bridge as B
    from texpr import expr as E

    h = E.iter_var(0, 10, "h", "spatial")
    r = E.iter_var(0, 3, "r", "reduce")
    oh = E.iter_var(0, 2, "oh", "reduce")
    sp = B.VarSpace([h, r, oh])
    s, resid = B.to_set(3 * oh + 2 * r == h, sp)
    s = s.intersect(B.box_set(sp))
    assert resid is None and B.card(s) == 6
    pa, proj, score = B.solve_last_dims(s, 2)
    assert B.card(proj) == 6
    assert B.solve_last_dims(B.box_set(sp), 2) is None


# ---- symbolic speed -------------------------------------------------------------------


def test_small_cnn_symbolic_speed_and_values():
    X = te.placeholder((4, 1, 12, 12), "X")
    W1 = te.placeholder((4, 1, 3, 3), "W1")
    b1 = te.placeholder((4,), "b1")
    W2 = te.placeholder((8, 4, 3, 3), "W2")
    W3 = te.placeholder((10, 72), "W3")
    L = te.placeholder((4,), "L", dtype="int64")
    h = te.nn.relu(te.nn.conv2d(X, W1, b1, padding=1))
    h = te.nn.max_pool2d(h, 2)
    h = te.nn.relu(te.nn.conv2d(h, W2, stride=2, padding=1))
    logits = te.nn.dense(te.nn.flatten(h), W3)
    loss = te.nn.cross_entropy(logits, L)
    grads = te.differentiate(loss, [W1, b1, W2, W3])
    counts = [simplify.iteration_count([g]) for g in grads]
    raw = te.differentiate(loss, [W1, b1, W2, W3], simplify=False)
    raw_counts = [simplify.iteration_count([g]) for g in raw]
    assert all(c * 50 < r for c, r in zip(counts, raw_counts)), (counts, raw_counts)
    again = simplify.simplify(list(grads))
    assert te.graph_str(again, canonical=True) == te.graph_str(list(grads), canonical=True)
    feed = feed_for([loss] + list(grads) + list(raw))
    feed[L] = np.array([1, 0, 3, 9])
    for a, b in zip(te.evaluate(list(raw), feed), te.evaluate(list(grads), feed)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@st.composite
def stage2d(draw):
    """A random 2-D stage with up to two reduction axes: conv-like strided,
    dilated, padded (guarded) reads, divisions and moduli, triangular domains."""
    n0, n1 = draw(st.integers(2, 6)), draw(st.integers(2, 6))
    m0, m1 = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    k0, k1 = draw(st.integers(1, 3)), draw(st.integers(0, 3))
    X = te.placeholder((n0, n1), "X")
    s0, d0 = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    p0 = draw(st.integers(0, 2))
    div = draw(st.integers(1, 3))
    tri = draw(st.booleans())
    reducer = draw(st.sampled_from(["sum", "max"]))
    seed_ = draw(st.integers(0, 2**16))

    def make(kind):
        def body(i, j):
            r = te.reduce_axis(k0, "r")
            q = te.reduce_axis(k1, "q") if k1 else None
            e0 = i * s0 + r * d0 - p0
            e1 = (j + q) // div if q is not None else j % n1
            inb = te.all(e0 >= 0, e0 < n0, e1 >= 0, e1 < n1)
            src = te.if_then_else(inb, X[e0, e1], 0.0)
            axes = [r] + ([q] if q is not None else [])
            where = (r <= i) if tri else None
            if kind == "max":
                return te.max(src * 1.5, axis=axes, where=where)
            return te.sum(src * 1.5, axis=axes, where=where)

        return te.compute((m0, m1), body, name="Y")

    return make(reducer), X, seed_, reducer, make("sum")


@seed(1129)
@settings(max_examples=60, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(stage2d())
def test_fuzz_2d_stages(case):
    Y, X, seed_, reducer, Ysum = case
    H = te.placeholder(Y.shape, "H")
    raw = list(te.differentiate(Y, [X], head=H, simplify=False))
    note(te.graph_str(raw))
    tensors = raw
    for p in PIPELINE:
        before = tensors
        tensors = p(tensors)
        verify_equal(before, tensors, p.__name__, seed=seed_)
    final = simplify.simplify(raw)
    note(te.graph_str(final))
    verify_equal(raw, final, "simplify", seed=seed_)
    # work-optimal: the gradient visits the (input, reduction point) pairs -- the
    # forward's in-bounds reads, counted by evaluating it on ones -- or writes X once
    # (max: plus one pass over the windows, the argmax stage)
    pairs = int(round(float(te.evaluate(Ysum, {X: np.ones(X.shape, "float32")}).sum()) / 1.5))
    windows = simplify.stage_count(Y.op) if reducer == "max" else 0
    assert simplify.iteration_count(final) <= max(pairs, X.size) + windows, \
        te.graph_str(final)


def test_max_stage_reads_its_argmax_stage():
    X = te.placeholder((2, 3, 8, 8), "X")
    W = te.placeholder((4, 3, 3, 3), "W")
    P = te.nn.max_pool2d(X, 2)
    Y = te.nn.conv2d(P, W)
    H = te.placeholder(Y.shape, "H")
    raw = list(te.differentiate(Y, [X, W], head=H, simplify=False))
    grads = simplify.simplify(raw)
    names = [op.name for op in materialized_stages(grads)]
    assert P.op.name not in names and any(n.endswith("_argmax") for n in names)
    verify_equal(raw, grads, "simplify")
