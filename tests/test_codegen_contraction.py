"""Contraction stages as GEMMs (texpr.codegen.analysis.contraction).

Plans are checked directly against ``te.evaluate`` (no numba) on the suite's
contraction cases at small sizes with their simplified gradients, on the
27-case conv sweep and on variants (batched, Gram, scaled, dot product,
broadcast, one-operand reduction axes), in float32 and float64; kernels run
both paths (``blas(True)`` / ``blas(False)``) against each other and the
evaluator; stages that are not contractions keep their loop nests.
"""

import itertools
import math
import pickle
import random
import re

import numpy as np
import pytest

import texpr as te
from texpr.codegen.backends import workers
from texpr import codegen, simplify
from texpr import expr as E
from texpr.codegen.analysis import contraction as C
from texpr.codegen.backends.numpy_host import gemm as G
from texpr.codegen.ir.schedule import create_schedule, default_materialized, inline_expand
from texpr.errors import ScheduleError
from texpr.tensor import ComputeOp, topo_order
from texpr.testing import random_feed
from texpr.visitor import post_order

from fork_testutil import FORKS_WITHOUT_JAX

nn = te.nn


def _in_threads(fn, n):
    """``fn(0)``, ..., ``fn(n - 1)`` on ``n`` threads at once; returns when all end."""
    import threading

    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _graph(outs):
    outs = list(simplify.simplify(outs))
    s = create_schedule(outs)
    mat, inl = default_materialized(s, simplify.materialized_stages)
    return outs, s, [op for op in s.ops if id(op) in mat], inl


def _tol(dtype, ref):
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
    return (2e-5 if dtype == "float32" else 1e-11) * scale


def _assert_close(got, ref, what):
    """Equal non-finite patterns (NaN, +inf, -inf), finite values within tolerance."""
    for f in (np.isnan, np.isposinf, np.isneginf):
        bad = f(got) != f(ref)
        assert not bad.any(), f"{what}: {f.__name__} differs at {np.argwhere(bad)[:3].tolist()}"
    fin = np.isfinite(ref)
    err = float(np.abs(got[fin].astype("float64") - ref[fin]).max()) if fin.any() else 0.0
    assert err <= _tol(ref.dtype.name, ref[fin] if fin.any() else ref), f"{what}: error {err}"


def check_plans(outs, feed):
    """Run the plan of every materialised stage that matches against the evaluator
    (after a pickle round trip); returns the names of the stages that matched."""
    _, _, ops, inl = _graph(outs)
    matched = []
    for op in ops:
        plan = C.match(op, inl, key=id)  # tensors may share a name (two layers' "dense")
        if plan is None:
            continue
        matched.append(op.name)
        plan = pickle.loads(pickle.dumps(plan))
        body = inline_expand(op.body[0], inl)
        loaded = {id(n.tensor): n.tensor for n in post_order(body) if isinstance(n, E.Load)}
        ts = [op.output(0)] + list(loaded.values())
        vals = te.evaluate(ts, feed)
        arrays = {id(t): v.reshape(-1) for t, v in zip(ts[1:], vals[1:])}
        ref = vals[0]
        arrays[id(op.output(0))] = np.full(max(ref.size, 1), np.nan, ref.dtype)
        plan.run(arrays)
        got = arrays[id(op.output(0))].reshape(ref.shape)
        _assert_close(got, ref, f"{op.name}: {plan.describe()}")
    return matched


def _with_grads(out, wrt, dtype):
    head = te.placeholder(out.shape, "H", dtype)
    grads = list(te.differentiate(out, wrt, head=head).result)
    return [out] + grads


def _case(name, dtype):
    """(output, differentiated inputs) of a suite case at a small size."""
    P = lambda shape, n: te.placeholder(shape, n, dtype)  # noqa: E731
    if name == "dense":
        x, w = P((6, 20), "X"), P((5, 20), "W")
        return nn.dense(x, w), [x, w]
    conv = {"conv2d_s1": dict(stride=1, padding=1), "conv2d_s2": dict(stride=2, padding=1),
            "conv2d_dil2": dict(stride=1, dilation=2, padding=2),
            "conv2d_s3_pad2": dict(stride=3, padding=2)}
    if name in conv:
        x, w = P((2, 3, 10, 10), "X"), P((4, 3, 3, 3), "W")
        return nn.conv2d(x, w, **conv[name]), [x, w]
    if name == "depthwise":
        x, w = P((2, 3, 10, 10), "X"), P((3, 1, 3, 3), "W")
        return nn.conv2d(x, w, padding=1, groups=3), [x, w]
    if name == "grouped":
        x, w = P((2, 4, 9, 9), "X"), P((6, 2, 3, 3), "W")
        return nn.conv2d(x, w, padding=1, groups=2), [x, w]
    if name == "conv2d_transpose_s2":
        x, w = P((2, 3, 5, 5), "X"), P((3, 2, 4, 4), "W")
        return nn.conv2d_transpose(x, w, stride=2, padding=1), [x, w]
    if name == "conv2d_transpose_s3":
        x, w = P((2, 3, 4, 4), "X"), P((3, 2, 5, 5), "W")
        return nn.conv2d_transpose(x, w, stride=3, padding=2), [x, w]
    if name == "causal_scores":
        q, k = P((2, 10, 4), "Q"), P((2, 10, 4), "K")
        d = te.reduce_axis(4, "d")
        return te.compute((2, 10, 10), lambda b, i, j: te.sum(q[b, i, d] * k[b, j, d], axis=d,
                                                              where=j <= i),
                          name="causal_scores"), [q, k]
    if name == "flatten_dense":
        x, w = P((2, 3, 4, 4), "X"), P((10, 48), "W")
        return nn.dense(nn.flatten(x), w), [x, w]
    raise KeyError(name)


CONTRACTIONS = ["dense", "conv2d_s1", "conv2d_s2", "conv2d_dil2", "conv2d_s3_pad2", "depthwise",
                "grouped", "conv2d_transpose_s2", "conv2d_transpose_s3", "causal_scores",
                "flatten_dense"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CONTRACTIONS)
def test_suite_contractions_and_gradients(case, dtype):
    """The forward and both simplified gradients of each case are contractions,
    and their plans give the evaluator's values."""
    out, wrt = _case(case, dtype)
    outs = _with_grads(out, wrt, dtype)
    feed = random_feed(outs, seed=3)
    matched = check_plans(outs, feed)
    assert len(matched) == 3, f"{case}: only {matched} matched"


@pytest.mark.parametrize("k,s,d", list(itertools.product([1, 2, 3], [1, 2, 3], [1, 2, 3])))
def test_conv_sweep_plans(k, s, d):
    """The suite's 27-case sweep (X 1x2x10x10, W 2x2xKxK, stride, dilation, pad 0):
    forward, dX and dW all run as GEMMs, with the evaluator's values."""
    x, w = te.placeholder((1, 2, 10, 10), "X", "float64"), te.placeholder((2, 2, k, k), "W",
                                                                           "float64")
    outs = _with_grads(nn.conv2d(x, w, stride=s, dilation=d), [x, w], "float64")
    matched = check_plans(outs, random_feed(outs, seed=k * 9 + s * 3 + d))
    assert len(matched) == 3, matched


def _variant(name):
    A = te.placeholder((5, 7), "A", "float64")
    B = te.placeholder((7, 6), "B", "float64")
    k = te.reduce_axis(7, "k")
    if name == "batched":
        P, Q = te.placeholder((3, 5, 7), "P", "float64"), te.placeholder((3, 7, 6), "Q", "float64")
        return te.compute((3, 5, 6), lambda b, i, j: te.sum(P[b, i, k] * Q[b, k, j], axis=k),
                          name="bmm")
    if name == "gram":
        return te.compute((5, 5), lambda i, j: te.sum(A[i, k] * A[j, k], axis=k), name="gram")
    if name == "scaled":
        return te.compute((5, 6), lambda i, j: te.sum(0.5 * A[i, k] * B[k, j] * 3.0, axis=k),
                          name="scaled")
    if name == "dot":
        v = te.placeholder((7,), "v", "float64")
        return te.compute((), lambda: te.sum(A[2, k] * v[k], axis=k), name="dot")
    if name == "broadcast":
        return te.compute((5, 4, 6), lambda i, c, j: te.sum(A[i, k] * B[k, j], axis=k),
                          name="bcast")
    if name == "one_sided":
        q = te.reduce_axis(5, "q")
        return te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[q + 1, j], axis=[k, q]),
                          name="one_sided")
    if name == "offset_where":
        return te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                                      where=(k >= 2) & (k < 6)),
                          name="window")
    if name == "triangle_operand":
        return te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k, where=k <= i),
                          name="tri")
    if name == "residue":
        return te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                                      where=(k % 3) == 1),
                          name="every_third")
    if name == "guarded":
        return te.compute((5, 6), lambda i, j: te.sum(
            te.if_then_else(k > j, A[i, k], 0.0) * B[k, j], axis=k), name="guarded")
    M = te.placeholder((5, 7), "M", "float64")
    if name == "data_mask":  # a ReLU's adjoint: where= reads another tensor
        return te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                                      where=M[i, k] > 0), name="relu_like")
    if name == "data_mask_self":  # the condition reads the operand itself
        return te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                                      where=(B[k, j] > 0) & (k % 2 == 0)),
                          name="self_mask")
    if name == "data_guard":
        return te.compute((5, 6), lambda i, j: te.sum(
            te.if_then_else(M[i, k] > 0.25, A[i, k], 0.0) * B[k, j], axis=k), name="guard")
    raise KeyError(name)


VARIANTS = ["batched", "gram", "scaled", "dot", "broadcast", "one_sided", "offset_where",
            "triangle_operand", "residue", "guarded", "data_mask", "data_mask_self",
            "data_guard"]


@pytest.mark.parametrize("name", VARIANTS)
def test_variants(name):
    out = _variant(name)
    feed = random_feed([out], seed=5)
    assert check_plans([out], feed) == [out.op.name]


def test_gradient_of_variants_float32():
    """Gradients of a batched matmul with a mask and a scale, float32."""
    P = te.placeholder((3, 8, 9), "P", "float32")
    Q = te.placeholder((3, 9, 8), "Q", "float32")
    k = te.reduce_axis(9, "k")
    out = te.compute((3, 8, 8), lambda b, i, j: te.sum(2.0 * P[b, i, k] * Q[b, k, j], axis=k,
                                                       where=j >= i), name="masked_bmm")
    outs = _with_grads(out, [P, Q], "float32")
    assert len(check_plans(outs, random_feed(outs, seed=1))) == 3


def _no_match(out):
    _, _, ops, inl = _graph([out])
    why = []
    assert C.match(ops[-1], inl, why=why) is None
    return why[0]


def test_not_contractions():
    """Stages that are not a sum of a product of two affine loads keep their loops."""
    A = te.placeholder((5, 7), "A", "float32")
    B = te.placeholder((7, 6), "B", "float32")
    I = te.placeholder((5,), "I", "int64")
    k = te.reduce_axis(7, "k")
    assert "not a sum" in _no_match(
        te.compute((5, 6), lambda i, j: te.max(A[i, k] * B[k, j], axis=k), name="mx"))
    assert "two loads" in _no_match(
        te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j] * A[i, k], axis=k), name="t3"))
    assert "two loads" in _no_match(
        te.compute((5, 6), lambda i, j: te.sum(te.exp(A[i, k]) * B[k, j], axis=k), name="ex"))
    assert _no_match(te.compute((5, 6), lambda i, j: te.sum(A[I[i], k] * B[k, j], axis=k),
                                name="gather"))
    # a data-dependent condition on the axes of both operands
    M = te.placeholder((5, 6), "M", "float32")
    assert "not on one operand" in _no_match(
        te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k, where=M[i, j] + k > 3),
                   name="dm"))
    # a condition tying the axes of both operands
    assert "both operands" in _no_match(
        te.compute((5, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k, where=i + j + k < 9),
                   name="tie"))


@pytest.mark.parametrize("form", ["constant_loads", "one_operand_free_axis",
                                  "conditioned_free_axis"])
def test_reduction_axis_no_operand_reads_keeps_its_loops(form):
    """A reduction axis that neither load reads multiplies the term by its point
    count (a fuzzed program once lost that factor on the GEMM path): no match, and
    the kernel, with the cost rule off, agrees with te.evaluate."""
    X = te.placeholder((5,), "X", "float32")
    W = te.placeholder((3, 4), "W", "float32")
    k1, k2, k3 = te.reduce_axis(5, "k1"), te.reduce_axis(3, "k2"), te.reduce_axis(4, "k3")
    if form == "constant_loads":
        Y = te.compute((), lambda: te.sum(X[0] * 2.0 * W[0, 0], axis=k1), name="Y")
    elif form == "one_operand_free_axis":
        Y = te.compute((3,), lambda i: te.sum(X[k1] * W[i, 0], axis=[k2, k1]), name="Y")
    else:
        Y = te.compute((3, 4), lambda i, j: te.sum(X[k1] * W[i, j], axis=[k1, k3],
                                                    where=k3 <= j), name="Y")
    why = _no_match(Y)
    assert "neither operand" in why or form == "conditioned_free_axis", why
    feed = {X: np.arange(1, 6, dtype="float32"),
            W: np.linspace(0.5, 2.0, 12, dtype="float32").reshape(3, 4)}
    old = C.cost_ok
    C.cost_ok = lambda plan: True
    try:
        kern = codegen.build([Y], [X, W])
    finally:
        C.cost_ok = old
    np.testing.assert_allclose(kern(feed[X], feed[W])[0], te.evaluate(Y, feed), rtol=1e-6)


def _kernels(outs, inputs, force):
    """Kernels of ``outs`` with every contraction stage forced onto BLAS (``force``
    True) or onto its loop nest (False)."""
    outs = list(simplify.simplify(outs))
    s = create_schedule(outs)
    mat, inl = default_materialized(s, simplify.materialized_stages)
    n = 0
    for op in s.ops:
        if id(op) in mat and C.match(op, inl) is not None:
            s[op].blas(force)
            n += 1
    return codegen.build(outs, inputs, s), n


@pytest.mark.parametrize("case", ["conv2d_s2", "conv2d_transpose_s2", "causal_scores",
                                  "grouped"])
def test_kernel_paths_agree(case):
    """Both paths of the same graph agree with each other and the evaluator (float32)."""
    out, wrt = _case(case, "float32")
    outs = _with_grads(out, wrt, "float32")
    head = next(t for t in _placeholders(outs) if t.name == "H")
    inputs = wrt + [head]
    kb, n = _kernels(outs, inputs, True)
    kl, _ = _kernels(outs, inputs, False)
    assert n == 3 and kb.source.count("# BLAS:") == 3 and "# BLAS:" not in kl.source
    feed = random_feed(outs, seed=2)
    args = [feed[t] for t in inputs]
    refs = te.evaluate(outs, feed)
    kb2 = pickle.loads(pickle.dumps(kb))
    for got_b, got_l, got_p, ref in zip(kb(*args), kl(*args), kb2(*args), refs):
        tol = _tol("float32", ref)
        assert np.abs(got_b - ref).max() <= tol
        assert np.abs(got_l - ref).max() <= tol
        assert np.abs(got_b - got_l).max() <= tol
        np.testing.assert_array_equal(got_p, got_b)


def _placeholders(outs):
    from texpr.tensor import PlaceholderOp, topo_order
    return [op.output(0) for op in topo_order(outs) if isinstance(op, PlaceholderOp)]


def test_cost_rule_and_mixed_kernel():
    """By default a large dense layer runs on BLAS and a tiny one on its loops;
    loop stages before and after a BLAS stage run in their own segments."""
    X = te.placeholder((128, 256), "X", "float32")
    W = te.placeholder((128, 256), "W", "float32")
    Y = nn.dense(X, W)
    j = te.reduce_axis(128, "j")
    Z = te.compute((128,), lambda i: te.sum(te.tanh(Y[i, j]), axis=j), name="Z")
    H = te.placeholder((128,), "H", "float32")
    outs = [Z] + list(te.differentiate(Z, [X, W], head=H).result)
    k = codegen.build(outs, [X, W, H])
    assert k.source.count("# BLAS:") == 3, k.source
    assert k.source.count("# ---- the driver") == 1  # Z and the adjoint of dense, between GEMMs
    feed = random_feed(outs, seed=4)
    for got, ref in zip(k(feed[X], feed[W], feed[H]), te.evaluate(outs, feed)):
        assert np.abs(got - ref).max() <= _tol("float32", ref)
    x, w = te.placeholder((4, 6), "x", "float32"), te.placeholder((3, 6), "w", "float32")
    small = codegen.build([nn.dense(x, w)], [x, w])
    assert "# BLAS:" not in small.source


def test_blas_override_errors():
    A = te.placeholder((5, 7), "A", "float32")
    k = te.reduce_axis(7, "k")
    Y = te.compute((5,), lambda i: te.sum(te.exp(A[i, k]), axis=k), name="rowexp")
    s = create_schedule([Y])
    s[Y].blas(True)
    with pytest.raises(ScheduleError, match="rowexp: blas\\(True\\), but it is not a contraction"):
        codegen.build([Y], [A], s)
    with pytest.raises(ScheduleError, match="takes True or False"):
        s[Y].blas("yes")



@pytest.mark.parametrize("case", ["conv2d_s1", "conv2d_s2", "conv2d_transpose_s2",
                                  "causal_scores", "dense"])
@pytest.mark.parametrize("pattern", ["inf_corner", "nan", "mixed"])
def test_non_finite_operands(case, pattern):
    """Infinities and NaNs give the loop nest's (the evaluator's) values: a padded
    or masked term is absent, never ``0 * inf``; an infinity times a real zero is
    NaN; +inf and -inf terms of one element give NaN."""
    out, wrt = _case(case, "float32")
    outs = _with_grads(out, wrt, "float32")
    feed = random_feed(outs, seed=7)
    first, second = wrt[0], wrt[1]
    a, b = feed[first].reshape(-1), feed[second].reshape(-1)
    if pattern == "inf_corner":  # an infinite weight (a convolution's border taps)
        b[0] = np.inf
    elif pattern == "nan":
        a[a.size // 2] = np.nan
    else:
        b[0], b[-1], a[1], a[2] = np.inf, -np.inf, -np.inf, 0.0
    assert len(check_plans(outs, feed)) == 3


def test_non_finite_kernels_agree():
    """Both kernel paths give the same non-finite pattern (conv2d, stride 2)."""
    out, wrt = _case("conv2d_s2", "float32")
    outs = _with_grads(out, wrt, "float32")
    head = next(t for t in _placeholders(outs) if t.name == "H")
    inputs = wrt + [head]
    feed = random_feed(outs, seed=8)
    feed[wrt[1]].reshape(-1)[0] = np.inf
    feed[head].reshape(-1)[5] = np.nan
    args = [feed[t] for t in inputs]
    kb, _ = _kernels(outs, inputs, True)
    kl, _ = _kernels(outs, inputs, False)
    # the simplified graph: a padded input's terms are absent (the unsimplified
    # one multiplies the padding's select(.., 0) by inf: docs/conventions.md)
    refs = te.evaluate(list(simplify.simplify(outs)), feed)
    assert all(np.isfinite(r).any() and not np.isfinite(r).all() for r in refs)
    for got_b, got_l, ref in zip(kb(*args), kl(*args), refs):
        _assert_close(got_b, ref, "blas")
        _assert_close(got_l, ref, "loops")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_relu_mlp_gradients(dtype):
    """A two-layer ReLU network: the adjoints under the ReLU's data-dependent mask
    (``where=dense[i, j] > 0``) are contractions too; finite and non-finite inputs."""
    x = te.placeholder((6, 20), "x", dtype)
    w1, w2 = te.placeholder((8, 20), "w1", dtype), te.placeholder((5, 8), "w2", dtype)
    out = nn.dense(nn.relu(nn.dense(x, w1)), w2)
    outs = _with_grads(out, [x, w1, w2], dtype)
    feed = random_feed(outs, seed=11)
    matched = check_plans(outs, feed)
    assert {"d_x__dense", "d_w1__dense"} <= set(matched), matched
    feed[w1].reshape(-1)[3] = np.inf
    feed[x].reshape(-1)[0] = np.nan
    check_plans(outs, feed)


@FORKS_WITHOUT_JAX
def test_plan_runs_in_a_forked_child():
    """The GEMM worker pool is made again in a forked process (the child inherits
    the pool object but not its threads)."""
    import os
    A = te.placeholder((256, 512), "A", "float32")
    B = te.placeholder((512, 256), "B", "float32")
    k = te.reduce_axis(512, "k")
    out = te.compute((256, 256), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="mm")
    _, _, ops, inl = _graph([out])
    plan = C.match(ops[-1], inl, key=id)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 512), "float32"), rng.standard_normal((512, 256), "float32")
    arrays = {id(A): a, id(B): b, id(out): np.empty(256 * 256, "float32")}
    plan.run(arrays)  # the parent's pool exists now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            plan.run(arrays)
            ok = np.abs(arrays[id(out)].reshape(256, 256) - a @ b).max() < 1e-3
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    import select
    import signal
    os.close(w)
    ready, _, _ = select.select([r], [], [], 120)
    got = os.read(r, 1) if ready else b"hung"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert got == b"1"


def test_gemm_threading_modes_give_the_same_values(monkeypatch):
    # GEMM_THREADS: one call on the BLAS's threads, or cut in parts on worker threads
    # with the BLAS held at one thread (the default picks by the machine's load);
    # every mode gives the same values, and the BLAS's thread count is restored
    from threadpoolctl import threadpool_info
    X = te.placeholder((128, 256), "X", "float32")
    W = te.placeholder((96, 256), "W", "float32")
    Y = te.nn.dense(X, W)
    H = te.placeholder(Y.shape, "H", "float32")
    dX, dW = te.differentiate(Y, [X, W], head=H).result
    kernel = codegen.build([Y, dX, dW], [X, W, H])
    assert kernel.source.count("# BLAS:") == 3
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(t.shape).astype("float32") for t in (X, W, H)]
    want = te.evaluate([Y, dX, dW], dict(zip((X, W, H), args)))
    blas_threads = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    monkeypatch.setattr(G, "GEMM_SPLIT_MIN", 1)
    seen = []
    for threads, loaded in ((1, False), (2, False), (3, False), (0, False), (0, True)):
        monkeypatch.setattr(G, "GEMM_THREADS", threads)
        monkeypatch.setattr(workers, "oversubscribed", lambda loaded=loaded: loaded)
        got = kernel(*args)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * np.abs(w).max())
        seen.append(got)
        assert [i["num_threads"] for i in threadpool_info()
                if i["user_api"] == "blas"] == blas_threads
    for got in seen[1:]:
        for g, r in zip(got, seen[0]):
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6 * np.abs(r).max())


def test_oversubscribed_reads_the_load_average_at_most_every_second(monkeypatch):
    import os
    calls = []
    monkeypatch.setattr(os, "getloadavg", lambda: calls.append(1) or (99.0, 0.0, 0.0))
    monkeypatch.setattr(workers, "_LOAD", [float("-inf"), False])
    assert workers.oversubscribed() and workers.oversubscribed()
    assert len(calls) == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(workers, "_LOAD", [float("-inf"), True])
    assert not workers.oversubscribed()
    monkeypatch.setattr(G, "GEMM_THREADS", 0)  # the default: one part per numba thread
    assert G._gemm_parts() == workers.threads()


def test_concurrent_split_gemms_restore_the_blas_thread_count(monkeypatch):
    # the one-thread BLAS limit is process-wide: four threads entering and leaving
    # it out of order left numpy's BLAS at one thread for good (attack find)
    from threadpoolctl import threadpool_info

    def blas():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    X = te.placeholder((128, 256), "X", "float64")
    W = te.placeholder((96, 256), "W", "float64")
    kernel = codegen.build([te.nn.dense(X, W)], [X, W])
    assert "# BLAS:" in kernel.source
    rng = np.random.default_rng(0)
    args = [[rng.standard_normal(t.shape) for t in (X, W)] for _ in range(4)]
    single = [kernel(*a) for a in args]
    before = blas()
    monkeypatch.setattr(G, "GEMM_THREADS", 2)
    monkeypatch.setattr(G, "GEMM_SPLIT_MIN", 1)
    bad = []

    def work(i):
        for _ in range(15):
            if not np.allclose(kernel(*args[i]), single[i], rtol=1e-12, atol=1e-12):
                bad.append(i)
    _in_threads(work, 4)
    assert not bad
    assert blas() == before


@pytest.mark.parametrize("case", ["dense", "flatten_dense", "conv2d_s2"])
def test_recorded_views_repeat_the_first_run(case):
    """A plain GEMM piece records its operand and output views on its first run
    and later runs rebuild them from the new buffers (the fixed cost of a small
    GEMM stage); runs on fresh inputs, into ``out=`` arrays that are slices of
    larger ones (an offset buffer) and after a pickle round trip agree with the
    evaluator. Pieces with a packed copy (conv's im2col) or that add into their
    output (a strided conv's residue classes) record nothing."""
    out, wrt = _case(case, "float32")
    outs = _with_grads(out, wrt, "float32")
    head = next(t for t in _placeholders(outs) if t.name == "H")
    inputs = wrt + [head]
    k, n = _kernels(outs, inputs, True)
    assert n == 3
    pieces = [p for u in k.units if u.kind == "blas" for p in u.plan.pieces]
    for seed in (3, 4, 5):
        feed = random_feed(outs, seed=seed)
        args = [feed[t] for t in inputs]
        refs = te.evaluate(outs, feed)
        if seed == 5:  # outputs written into strided-free slices of larger arrays
            bigs = [np.full(r.size + 7, np.nan, "float32") for r in refs]
            given = [b[7:].reshape(r.shape) for b, r in zip(bigs, refs)]
            got = k(*args, out=given)
            assert all(np.isnan(b[:7]).all() for b in bigs)  # nothing before the slice
        else:
            got = k(*args)
        for g, ref in zip(got, refs):
            assert np.abs(g - ref).max() <= _tol("float32", ref)
        if seed == 3:
            recorded = [getattr(p, "_recorded", None) for p in pieces]
            if case == "conv2d_s2":  # residue classes add into their output, im2col copies
                assert all(r is None for r in recorded)
            else:
                assert all(r is not None for r in recorded), recorded
    k2 = pickle.loads(pickle.dumps(k))
    feed = random_feed(outs, seed=6)
    for g, ref in zip(k2(*[feed[t] for t in inputs]), te.evaluate(outs, feed)):
        assert np.abs(g - ref).max() <= _tol("float32", ref)


def test_recorded_views_refuse_a_different_buffer():
    """A recorded piece given a buffer of another dtype or size falls back to the
    general path (which casts or checks), never reads through stale views."""
    A = te.placeholder((16, 32), "A", "float32")
    B = te.placeholder((24, 32), "B", "float32")
    r = te.reduce_axis(32, "r")
    Y = te.compute((16, 24), lambda i, j: te.sum(A[i, r] * B[j, r], axis=r), name="Y")
    plan = C.match(Y.op, ())
    assert plan is not None
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 32)).astype("float32"), rng.standard_normal((24, 32)).astype("float32")
    out = np.empty(16 * 24, "float32")
    plan.run({"A": a.reshape(-1), "B": b.reshape(-1), "Y": out})
    piece = plan.pieces[0]
    assert piece._recorded is not None
    np.testing.assert_allclose(out.reshape(16, 24), a @ b.T, rtol=1e-5, atol=1e-5)
    a64 = rng.standard_normal((16, 32))  # float64: cast by the general path
    plan.run({"A": a64.reshape(-1), "B": b.reshape(-1), "Y": out})
    np.testing.assert_allclose(out.reshape(16, 24), a64.astype("float32") @ b.T, rtol=1e-5,
                               atol=1e-5)
    assert not G._run_recorded(piece._recorded, {"A": a[:8].reshape(-1), "B": b.reshape(-1)},
                               {"A": a[:8].reshape(-1), "B": b.reshape(-1)}, out, "float32")


@pytest.mark.parametrize("dtype, big, factor, other, want", [
    ("float32", 3e38, 10.0, -np.inf, "nan"),    # finite product overflows to +inf, then -inf
    ("float32", 3e38, -10.0, np.inf, "nan"),    # -inf overflow meets +inf
    ("float32", 3e38, 10.0, np.inf, "+inf"),    # same sign: the infinity
    ("float64", 1e308, 10.0, -np.inf, "nan"),
])
def test_non_finite_operand_meets_an_overflowed_finite_product(dtype, big, factor, other, want):
    """The exact non-finite path adds its infinity to the finite terms' GEMM result:
    a finite product that overflowed to an infinity of the other sign gives NaN,
    as the loop nest and te.evaluate do (it used to overwrite it: -inf)."""
    A = te.placeholder((32, 64), "A", dtype)
    B = te.placeholder((32, 64), "B", dtype)
    Y = nn.dense(A, B)
    kb = codegen.build([Y], [A, B])
    assert [u.kind for u in kb.units] == ["blas"]
    s = create_schedule([Y])
    s[Y].blas(False)
    kl = codegen.build([Y], [A, B], s)
    a, b = np.zeros((32, 64), dtype), np.zeros((32, 64), dtype)
    a[0, 0], b[0, 0] = big, factor
    a[0, 1], b[0, 1] = other, 1.0
    a[1, 5], b[3, 5] = 2.0, 3.0  # finite elements elsewhere
    with np.errstate(all="ignore"):
        ref = te.evaluate(Y, {A: a, B: b})
        got_b, got_l = kb(a, b)[0], kl(a, b)[0]
    expect = {"nan": np.nan, "+inf": np.inf}[want]
    np.testing.assert_array_equal(got_b[0, 0], expect)
    _assert_close(got_b, ref, "BLAS vs evaluate")
    _assert_close(got_l, ref, "loop nest vs evaluate")


@pytest.mark.parametrize("cond", [
    lambda a, i, k: a[i, k] > k / 3,            # int / int is float32 in texpr
    lambda a, i, k: a[i, k] * 3 >= k,           # a float32 product, not float64
    lambda a, i, k: a[i, k] - k / 3 == 0.0,
])
def test_data_masks_follow_the_evaluators_dtypes(cond):
    """A condition that reads data is evaluated on the GEMM path with texpr's dtype
    rules (each node in its dtype, a float operation's constants at its
    precision, '/' on operands cast first), not numpy's promotion to float64:
    values on the float32 boundary (A = float32(k) / 3) keep or drop the same
    terms as the loop nest and te.evaluate."""
    A = te.placeholder((32, 64), "A", "float32")
    B = te.placeholder((64, 32), "B", "float32")
    k = te.reduce_axis(64, "k")
    Y = te.compute((32, 32), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                                 where=cond(A, i, k)), name="Y")
    kb = codegen.build([Y], [A, B])
    assert [u.kind for u in kb.units] == ["blas"]
    s = create_schedule([Y])
    s[Y].blas(False)
    kl = codegen.build([Y], [A, B], s)
    ks = np.arange(64)
    a = np.empty((32, 64), "float32")
    a[:] = (ks.astype("float32") / np.float32(3))[None, :]
    a[1::3] = np.nextafter(a[1::3], np.float32(np.inf))   # one ulp above
    a[2::3] = np.nextafter(a[2::3], np.float32(-np.inf))  # one ulp below
    b = np.ones((64, 32), "float32")
    ref = te.evaluate(Y, {A: a, B: b})
    np.testing.assert_allclose(kl(a, b)[0], ref, rtol=1e-6)
    np.testing.assert_allclose(kb(a, b)[0], ref, rtol=1e-6)


def test_integer_data_masks_refuse_and_skip_as_the_evaluator():
    """A condition with integer arithmetic on data, on the GEMM path: INT_MIN // -1
    raises "would wrap around" (it wrapped to INT_MIN, and the term was dropped
    silently), a zero divisor in a select's untaken branch does not raise (both
    branches were computed everywhere), and an int32 result of 2**30 is not an
    overflow (a check at 2**(bits-2) refused it). An attack, 2026-12-03."""
    lo = -2**63
    A = te.placeholder((4, 3), "A", "float64")
    B = te.placeholder((3, 5), "B", "float64")
    N = te.placeholder((4, 3), "N", "int64")
    D = te.placeholder((4, 3), "D", "int64")
    M = te.placeholder((4, 3), "M", "int32")
    k = te.reduce_axis(3, "k")
    Y = te.compute((4, 5), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k, where=te.all(
        te.if_then_else(D[i, k] != 0, N[i, k] // D[i, k], te.const(1, "int64")) > 0,
        M[i, k] * 2 > 0)), name="Y")
    s = create_schedule([Y])
    s[Y].blas(True)
    kernel = codegen.build([Y], [A, B, N, D, M], s, parallel=False, blas=False)
    assert [u.kind for u in kernel.units] == ["blas"]
    base = {A: np.arange(12.0).reshape(4, 3), B: np.arange(15.0).reshape(3, 5),
            N: np.full((4, 3), 6, np.int64), D: np.full((4, 3), 2, np.int64),
            M: np.full((4, 3), 2**29, np.int32)}
    base[N][1, 2], base[D][2, 1], base[M][3, 0] = -6, 0, -1
    args = lambda f: [f[t] for t in (A, B, N, D, M)]  # noqa: E731
    want = te.evaluate(Y, base)
    np.testing.assert_array_equal(kernel(*args(base))[0], want)
    assert not np.array_equal(want, base[A] @ base[B])  # the mask drops terms
    wraps = {t: v.copy() for t, v in base.items()}
    wraps[N][0, 0], wraps[D][0, 0] = lo, -1
    with pytest.raises(te.TexprError, match="^stage Y: .*would wrap around"):
        te.evaluate(Y, wraps)
    # the GEMM path names the stage as the evaluator and the loop nest do (it said
    # "contraction: ...": issue 52, kind 6)
    with pytest.raises(te.TexprError, match="^stage Y: .*would wrap around"):
        kernel(*args(wraps))


def _guarded_gemm(where):
    """Y = sum_k A[i, k] * B[k, j] under ``where(i, j, k, N, D, B)`` (N, D int64 (4, 3)),
    with its feed: D is 0 at (0, 2), where k > i."""
    A = te.placeholder((4, 3), "A", "float64")
    B = te.placeholder((3, 5), "B", "float64")
    N = te.placeholder((4, 3), "N", "int64")
    D = te.placeholder((4, 3), "D", "int64")
    k = te.reduce_axis(3, "k")
    Y = te.compute((4, 5), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                               where=where(i, j, k, N, D, B)), name="Y")
    feed = {A: np.arange(12.0).reshape(4, 3), B: np.arange(15.0).reshape(3, 5) - 3,
            N: np.full((4, 3), 6, np.int64), D: np.full((4, 3), 2, np.int64)}
    feed[N][1, 0] = -6
    feed[D][0, 2] = 0
    return Y, [A, B, N, D], feed


@pytest.mark.parametrize("where", [
    # the divisor tested first on the same operand's axes
    lambda i, j, k, N, D, B: te.all(D[i, k] != 0, N[i, k] // D[i, k] > 0),
    # an affine mask of the operand first (the causal kind)
    lambda i, j, k, N, D, B: te.all(k <= i, N[i, k] // D[i, k] > 0),
    # both, and a second condition that may raise (INT_MIN // -1) behind them
    lambda i, j, k, N, D, B: te.all(k <= i, D[i, k] != 0, N[i, k] // D[i, k] > 0,
                                 N[i, k] // -1 < 100),
], ids=["guard", "triangle", "both"])
def test_a_condition_that_may_raise_is_evaluated_where_the_evaluator_evaluates_it(where):
    """A data-dependent condition that can raise (a divisor of 0) behind conjuncts
    that exclude the point: te.evaluate's `&&` never evaluates it there, and the
    GEMM path evaluated every data condition on the operand's whole grid and
    raised "division by zero" (an attack on the GEMM path, 2026-12-03). Where the
    evaluator does evaluate it, both raise."""
    Y, ins, feed = _guarded_gemm(where)
    s = create_schedule([Y])
    s[Y].blas(True)
    kernel = codegen.build([Y], ins, s, parallel=False, blas=False)
    assert [u.kind for u in kernel.units] == ["blas"]
    want = te.evaluate(Y, feed)
    np.testing.assert_array_equal(kernel(*[feed[t] for t in ins])[0], want)
    assert np.any(want != 0)
    bad = {t: v.copy() for t, v in feed.items()}
    bad[ins[3]][3, 0] = 0  # k = 0 <= i = 3: the triangle lets it through, the guard not
    bad[ins[2]][3, 0] = 1
    try:
        te.evaluate(Y, bad)
        raised = None
    except te.TexprError as exc:
        raised = exc
    if raised is None:  # the guard variant: D == 0 is excluded wherever it occurs
        np.testing.assert_array_equal(kernel(*[bad[t] for t in ins])[0], te.evaluate(Y, bad))
    else:
        assert str(raised).startswith("stage Y: ")
        with pytest.raises(te.TexprError, match="^stage Y: integer division by zero"):
            kernel(*[bad[t] for t in ins])


@pytest.mark.parametrize("where, reason", [
    # the affine mask comes after: te.evaluate evaluates the division everywhere
    (lambda i, j, k, N, D, B: te.all(N[i, k] // D[i, k] > 0, k <= i), "applies after it"),
    # behind an output mask, the other operand's mask, the other operand's data
    (lambda i, j, k, N, D, B: te.all(j < 3, N[i, k] // D[i, k] > 0), "applies after it"),
    (lambda i, j, k, N, D, B: te.all(j + k < 6, N[i, k] // D[i, k] > 0), "applies after it"),
    (lambda i, j, k, N, D, B: te.all(B[k, j] > 0, N[i, k] // D[i, k] > 0), "applies after it"),
], ids=["mask-after", "output-mask", "other-mask", "other-data"])
def test_a_condition_that_may_raise_out_of_order_keeps_the_loop_nest(where, reason):
    """Where the GEMM path cannot evaluate a condition that may raise exactly where
    te.evaluate does, the stage is no contraction (the loop nest evaluates it in
    order), and ``blas(True)`` says why."""
    Y, ins, feed = _guarded_gemm(where)
    why = []
    assert C.match(Y.op, why=why) is None
    assert reason in why[0]
    s = create_schedule([Y])
    s[Y].blas(True)
    with pytest.raises(ScheduleError, match="not a contraction"):
        codegen.build([Y], ins, s, parallel=False, blas=False)


@pytest.mark.parametrize("where, shape", [
    # the whole domain empty (i + k > 100) behind a read of N at k + 1 = 3
    (lambda i, k, N: te.all(N[i, k + 1] > 0.0, i + k > 100), 3),
    # residue classes: the classes of odd i are empty; te.evaluate reads N[1, 4]
    (lambda i, k, N: te.all((i + k) % 2 == 0, N[i, k + 1] > 0.0, i % 2 == 0), 4),
], ids=["empty", "empty-classes"])
def test_a_data_condition_read_outside_its_tensor_in_an_empty_domain(where, shape):
    """te.evaluate's `&&` evaluates a data condition where the conjuncts before it
    hold, also where later ones empty the domain: a read there outside the tensor
    is an OutOfBoundsError. The GEMM path dropped the empty pieces without looking
    at their conditions: zeros, or values for the non-empty classes (an attack,
    2026-12-03). Now such a stage keeps its loop nest, whose build refuses it."""
    A = te.placeholder((4, shape), "A", "float64")
    B = te.placeholder((shape, 5), "B", "float64")
    N = te.placeholder((4, shape), "N", "float64")
    k = te.reduce_axis(shape, "k")
    Y = te.compute((4, 5), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                               where=where(i, k, N)), name="Y")
    feed = {A: np.ones((4, shape)), B: np.ones((shape, 5)), N: np.ones((4, shape))}
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(Y, feed)
    s = create_schedule([Y])
    s[Y].blas(True)
    with pytest.raises(ScheduleError, match="outside its shape"):
        codegen.build([Y], [A, B, N], s, parallel=False, blas=False)
    s = create_schedule([Y])
    with pytest.raises(te.OutOfBoundsError):
        codegen.build([Y], [A, B, N], s, parallel=False, blas=False)


def test_a_select_condition_that_may_raise_keeps_the_loop_nest():
    """``select(c1, A, 0) * select(c2, B, 0)``: te.evaluate evaluates ``c2`` whatever
    ``c1`` is, so a ``c2`` that may raise is not evaluated behind ``c1`` on the GEMM
    path: the stage stays a loop nest, which raises where te.evaluate of the graph
    it computes (the simplified one) does, and agrees with it elsewhere."""
    A = te.placeholder((4, 3), "A", "float64")
    B = te.placeholder((3, 5), "B", "float64")
    N = te.placeholder((4, 3), "N", "int64")
    D = te.placeholder((4, 3), "D", "int64")
    k = te.reduce_axis(3, "k")
    Y = te.compute((4, 5), lambda i, j: te.sum(
        te.if_then_else(A[i, k] > 1, A[i, k], 0.0)
        * te.if_then_else(N[i, k] // D[i, k] > 0, B[k, j], 0.0), axis=k), name="Y")
    why = []
    assert C.match(Y.op, why=why) is None and "select condition" in why[0]
    kernel = codegen.build([Y], [A, B, N, D], parallel=False, blas=False)
    (Ys,) = simplify.simplify([Y])
    for at in ((0, 0), (3, 2)):  # A there is 0 (c1 fails), 11 (c1 holds)
        feed = [np.arange(12.0).reshape(4, 3), np.ones((3, 5)), np.full((4, 3), 6, np.int64),
                np.full((4, 3), 2, np.int64)]
        feed[3][at] = 0
        try:
            want = te.evaluate(Ys, dict(zip([A, B, N, D], feed)))
        except te.TexprError:
            with pytest.raises(te.TexprError, match="division by zero"):
                kernel(*feed)
            assert at == (3, 2)
        else:
            np.testing.assert_array_equal(kernel(*feed)[0], want)
            assert at == (0, 0)


#: conjuncts of a random where (:func:`test_gemm_conditions_refuse_where_the_evaluator_does`):
#: affine masks of either operand or the output, data conditions of either operand,
#: integer arithmetic on data that can raise (a divisor of 0, INT_MIN // -1, a
#: product or sum leaving int64 or int32)
_CONJUNCTS = [
    lambda i, j, k, t: k <= i,
    lambda i, j, k, t: j < 3,
    lambda i, j, k, t: i + k < 4,
    lambda i, j, k, t: j + k > 1,
    lambda i, j, k, t: (i + k) % 2 == 0,
    lambda i, j, k, t: t["A"][i, k] > 0.5,
    lambda i, j, k, t: t["B"][k, j] < 1.0,
    lambda i, j, k, t: t["D"][i, k] != 0,
    lambda i, j, k, t: t["N"][i, k] // t["D"][i, k] > 0,
    lambda i, j, k, t: t["N"][i, k] % t["D"][i, k] == 1,
    lambda i, j, k, t: te.cast(t["N"][i, k] * 3, "float64") > 0.0,
    lambda i, j, k, t: t["N"][i, k] // -1 < 5,
    lambda i, j, k, t: t["M"][k, j] * 2 > 0,
    lambda i, j, k, t: t["M"][k, j] + t["M"][k, j] != 3,
    lambda i, j, k, t: te.if_then_else(t["D"][i, k] != 0, t["N"][i, k] // t["D"][i, k],
                                       te.const(1, "int64")) > 0,
]


def test_gemm_conditions_refuse_where_the_evaluator_does():
    """Random wheres of 1-3 conjuncts (:data:`_CONJUNCTS`) on a GEMM stage built with
    ``blas(True)``, on integer data at the limits: where the GEMM path runs the
    stage, it raises exactly where te.evaluate of the same stage does, and gives
    its values elsewhere (integer-valued operands: the sums are exact). Stages it
    does not take must say why (ScheduleError). No numba compile: seconds. (At
    2026-12-03: 215 of 300 stages taken, 264 of their 645 runs raised; before
    the fix, the first stage whose division was evaluated out of order failed.)"""
    rng = random.Random(20261203)
    nrng = np.random.default_rng(20261203)
    lo64, hi64, lo32, hi32 = -2**63, 2**63 - 1, -2**31, 2**31 - 1
    taken = raised = 0
    for case in range(300):
        t = {"A": te.placeholder((4, 3), "A", "float64"),
             "B": te.placeholder((3, 5), "B", "float64"),
             "N": te.placeholder((4, 3), "N", "int64"),
             "D": te.placeholder((4, 3), "D", "int64"),
             "M": te.placeholder((3, 5), "M", "int32")}
        picks = [rng.randrange(len(_CONJUNCTS)) for _ in range(rng.randint(1, 3))]
        k = te.reduce_axis(3, "k")
        Y = te.compute((4, 5), lambda i, j: te.sum(
            t["A"][i, k] * t["B"][k, j], axis=k,
            where=te.all(*[_CONJUNCTS[c](i, j, k, t) for c in picks]) if len(picks) > 1
            else _CONJUNCTS[picks[0]](i, j, k, t)), name="Y")
        s = create_schedule([Y])
        s[Y].blas(True)
        names = ["A", "B", "N", "D", "M"]
        try:
            kernel = codegen.build([Y], [t[n] for n in names], s, parallel=False, blas=False)
        except ScheduleError as exc:
            assert "not a contraction" in str(exc)
            continue
        taken += 1
        for _ in range(3):
            feed = {t["A"]: nrng.integers(-2, 3, (4, 3)).astype(np.float64),
                    t["B"]: nrng.integers(-2, 3, (3, 5)).astype(np.float64),
                    t["N"]: nrng.choice(np.array([lo64, hi64, 2**62, 0, 1, -1, 6, -6]), (4, 3)),
                    t["D"]: nrng.choice(np.array([0, 1, 1, 2, 2, -1, -3]), (4, 3)),
                    t["M"]: nrng.choice(np.array([lo32, hi32, 2**30, 0, 1, -1, 5],
                                                 dtype=np.int32), (3, 5))}
            args = [feed[t[n]] for n in names]
            try:
                want = te.evaluate(Y, feed)
            except te.TexprError as exc:
                assert re.search("wrap around|division by zero", str(exc)), exc
                with pytest.raises(te.TexprError, match="wrap around|division by zero"):
                    kernel(*args)
                raised += 1
                continue
            np.testing.assert_array_equal(kernel(*args)[0], want,
                                          err_msg=f"case {case}: conjuncts {picks}")
    assert taken >= 100 and raised >= 30, (taken, raised)


def test_an_overflowing_gemm_gives_inf_without_numpy_warnings(monkeypatch):
    # finite operands whose products overflow: inf as in the loop nest (which
    # never warns), with no RuntimeWarning from numpy, in one call and cut in
    # parts on worker threads (which do not inherit the caller's np.errstate)
    import warnings
    A = te.placeholder((64, 64), "A", "float32")
    B = te.placeholder((64, 64), "B", "float32")
    k = te.reduce_axis(64, "k")
    C_ = te.compute((64, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    kernel = codegen.build([C_], [A, B])
    assert kernel.source.count("# BLAS:") == 1
    a = np.full((64, 64), 1e37, np.float32)
    b = np.full((64, 64), 2.0, np.float32)
    monkeypatch.setattr(G, "GEMM_SPLIT_MIN", 1)
    for threads in (1, 2):
        monkeypatch.setattr(G, "GEMM_THREADS", threads)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (c,) = kernel(a, b)
        assert np.isposinf(c).all()


def _count_chunked(monkeypatch):
    """The chunk plans of every chunked GEMM run from now on (a list it fills)."""
    runs = []
    orig = G._run_chunked

    def spy(chunks, *args):
        runs.append(chunks)
        return orig(chunks, *args)
    monkeypatch.setattr(G, "_run_chunked", spy)
    return runs


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["conv2d_s1", "conv2d_s2", "conv2d_dil2", "conv2d_s3_pad2",
                                  "grouped", "conv2d_transpose_s2", "conv2d_transpose_s3",
                                  "causal_scores", "flatten_dense"])
def test_chunked_packing_gives_the_evaluators_values(case, threads, monkeypatch):
    """Every packing copy cut into the smallest chunks (an image, a row of taps),
    on one thread and on two: the plans give the evaluator's values, forward and
    gradients, with prefix chunks (disjoint output slices) and reduction chunks
    (summed partial products) both taken."""
    runs = _count_chunked(monkeypatch)
    monkeypatch.setattr(G, "CHUNK_BYTES", 1)
    monkeypatch.setattr(G, "CHUNK_MIN_BYTES", 0)
    monkeypatch.setattr(G, "GEMM_THREADS", threads)
    for dtype in ("float32", "float64"):
        out, wrt = _case(case, dtype)
        outs = _with_grads(out, wrt, dtype)
        assert len(check_plans(outs, random_feed(outs, seed=11))) == 3
    if case.startswith("conv2d_s") or case == "conv2d_dil2":
        modes = {m for _, m, _, _ in runs}
        assert modes == {"prefix", "k"}, runs


@pytest.mark.parametrize("k,s,d", [(3, 1, 1), (2, 2, 3), (3, 3, 2), (1, 2, 1)])
def test_chunked_packing_on_the_conv_sweep(k, s, d, monkeypatch):
    """Sweep cases with every packing copy chunked, two threads."""
    monkeypatch.setattr(G, "CHUNK_BYTES", 1)
    monkeypatch.setattr(G, "CHUNK_MIN_BYTES", 0)
    monkeypatch.setattr(G, "GEMM_THREADS", 2)
    x = te.placeholder((3, 2, 10, 10), "X", "float64")
    w = te.placeholder((2, 2, k, k), "W", "float64")
    outs = _with_grads(nn.conv2d(x, w, stride=s, dilation=d), [x, w], "float64")
    assert len(check_plans(outs, random_feed(outs, seed=k + s + d))) == 3


@pytest.mark.parametrize("pattern", ["inf_corner", "nan", "mixed"])
def test_chunked_packing_with_non_finite_operands(pattern, monkeypatch):
    """The non-finite cases of test_non_finite_operands with chunked packing (the
    output-side check of a gradient's small output included)."""
    monkeypatch.setattr(G, "CHUNK_BYTES", 1)
    monkeypatch.setattr(G, "CHUNK_MIN_BYTES", 0)
    monkeypatch.setattr(G, "GEMM_THREADS", 2)
    test_non_finite_operands("conv2d_s2", pattern)


def test_padded_buffers_kept_between_runs_hold_each_runs_values(monkeypatch):
    """A plan's zero-padded operand buffer is reused from run to run (its border
    stays zero) and from two threads at once (each its own): every run gives the
    evaluator's values for its own inputs."""
    monkeypatch.setattr(G, "CHUNK_BYTES", 1)
    monkeypatch.setattr(G, "CHUNK_MIN_BYTES", 0)
    x = te.placeholder((2, 3, 10, 10), "X")
    w = te.placeholder((4, 3, 3, 3), "W")
    y = nn.conv2d(x, w, padding=1)
    s = codegen.create_schedule([y])
    s[y].blas(True)
    k = codegen.build([y], [x, w], s)
    assert "BLAS:" in k.source
    rng = np.random.default_rng(5)
    feeds = [(rng.standard_normal((2, 3, 10, 10)).astype("float32"),
              rng.standard_normal((4, 3, 3, 3)).astype("float32")) for _ in range(6)]
    refs = [te.evaluate(y, {x: a, w: b}) for a, b in feeds]
    _check_runs_and_threads(k, feeds, refs)


def _check_runs_and_threads(k, feeds, refs):
    """``k`` (two inputs) gives ``refs`` for ``feeds``: twice in turn, then from four
    threads at once, each calling it 20 times with its own inputs."""
    for (a, b), ref in zip(feeds * 2, refs * 2):
        _assert_close(k(a, b)[0], ref, "sequential")
    errors = []

    def run(j):
        try:
            for _ in range(20):
                a, b = feeds[j]
                _assert_close(k(a, b)[0], refs[j], f"thread {j}")
        except AssertionError as exc:
            errors.append(exc)
    _in_threads(run, 4)
    assert not errors, errors[0]


def _pooled_relu_weight_gradient(ci):
    """A convolution's weight gradient behind a relu and a 2x2 max pool (the main
    job's conv1 with ``ci == 1``): the masks read the convolution and the
    pool's argmax at every (n, c, h, w), and each masked element meets
    ``ci * 9`` weights."""
    n, c, s = 16, 8, 8
    G = te.placeholder((n, c, s, s), "G", "float32")
    conv = te.placeholder((n, c, s, s), "conv", "float32")
    bias = te.placeholder((c,), "bias", "float32")
    arg = te.placeholder((n, c, s // 2, s // 2), "arg", "int64")
    X = te.placeholder((n, ci, s, s), "X", "float32")
    r_n, r_h, r_w = te.reduce_axis(n, "r_n"), te.reduce_axis(s, "r_h"), te.reduce_axis(s, "r_w")

    def body(o, i, kh, kw):
        h, w = r_h + kh - 1, r_w + kw - 1
        return te.sum(G[r_n, o, r_h, r_w] * X[r_n, i, h, w], axis=[r_n, r_h, r_w],
                      where=(h >= 0) & (h < s) & (w >= 0) & (w < s)
                      & (conv[r_n, o, r_h, r_w] + bias[o] > 0.0)
                      & (2 * (r_h % 2) + r_w % 2 == arg[r_n, o, r_h // 2, r_w // 2]))
    dW = te.compute((c, ci, 3, 3), body, name="dW")
    return dW, [G, conv, bias, arg, X]


@pytest.mark.parametrize("ci, blas", [(1, False), (16, True)])
def test_data_masks_evaluated_per_run_weigh_in_the_cost_rule(ci, blas):
    # the main job's conv1 weight gradient ran 1.9 ms on BLAS (its masks, evaluated
    # by numpy node by node on every run, cost more than its GEMMs save) and 0.19
    # ms as a loop nest; with 16 input channels each masked element meets 144
    # weights and BLAS pays again
    dW, ins = _pooled_relu_weight_gradient(ci)
    _, _, ops, inl = _graph([dW])
    plan = C.match(next(op for op in ops if op.name == "dW"), inl, key=id)
    assert plan is not None and C.mask_passes(plan) > 0
    assert (plan.flop / 2 >= C.MASK_MACS * C.mask_passes(plan)) == blas
    assert C.cost_ok(plan) == blas
    feed = random_feed([dW], seed=3)
    feed[ins[3]] = np.random.default_rng(4).integers(0, 4, ins[3].shape).astype("int64")
    ref, = te.evaluate([dW], feed)
    k = codegen.build([dW], ins)
    assert ("# BLAS:" in k.source) == blas
    got, = k(*[feed[t] for t in ins])
    assert np.abs(got - ref).max() <= _tol("float32", ref)
    s = create_schedule([dW])
    s[dW].blas(True)  # the override still runs it on BLAS, to the same values
    forced, = codegen.build([dW], ins, s)(*[feed[t] for t in ins])
    assert np.abs(forced - ref).max() <= _tol("float32", ref)


def test_masked_operands_kept_between_runs_hold_each_runs_values():
    """A masked operand (causal scores' head under ``j <= i``) is written into a
    buffer the plan keeps from run to run, one per thread: every run, sequential
    or from four threads at once, gives the evaluator's values for its own
    inputs, and an infinity at a masked-out point stays absent."""
    Hh = te.placeholder((3, 16, 16), "H")
    K = te.placeholder((3, 16, 8), "K")
    j = te.reduce_axis(16, "j")
    dQ = te.compute((3, 16, 8), lambda b, i, d: te.sum(Hh[b, i, j] * K[b, j, d], axis=j,
                                                       where=j <= i), name="dQ")
    s = codegen.create_schedule([dQ])
    s[dQ].blas(True)
    k = codegen.build([dQ], [Hh, K], s)
    assert "BLAS:" in k.source
    rng = np.random.default_rng(9)
    feeds = [(rng.standard_normal((3, 16, 16)).astype("float32"),
              rng.standard_normal((3, 16, 8)).astype("float32")) for _ in range(5)]
    feeds[2][0][1, 2, 9] = np.inf  # j = 9 > i = 2: masked out
    refs = [te.evaluate(dQ, {Hh: a, K: b}) for a, b in feeds]
    assert np.isfinite(refs[2]).all()
    _check_runs_and_threads(k, feeds, refs)


# ---- allocations sized by the user's extents (issue 52, kind 3) -------------------------

EXTREME_CONVS = [dict(stride=10 ** 6, padding=10 ** 6), dict(stride=1, padding=600),
                 dict(stride=10 ** 5, padding=10 ** 5, dilation=3),
                 dict(stride=(1, 10 ** 6), padding=(1, 10 ** 6)),
                 dict(stride=7, padding=50, dilation=40)]


@pytest.mark.parametrize("cfg", EXTREME_CONVS, ids=lambda c: "-".join(f"{k}{v}" for k, v in
                                                                      c.items()))
def test_a_plan_never_pads_an_operand_beyond_its_bound(cfg):
    # every padded copy a plan makes is bounded by its operand, what the GEMMs read
    # and the output (C.PAD_MAX_RATIO), or the stage is no contraction and keeps its
    # loop nest: extreme strides, paddings and dilations, the stage and its gradients
    x = te.placeholder((1, 2, 5, 5), "X", "float64")
    w = te.placeholder((3, 2, 3, 3), "W", "float64")
    y = nn.conv2d(x, w, **cfg)
    head = te.placeholder(y.shape, "H", "float64")
    dx, dw = te.differentiate(y, [x, w], head=head)
    for t in (y, dx, dw):
        for op in topo_order([t]):
            if not isinstance(op, ComputeOp):
                continue
            plan = C.match(op)
            if plan is None:
                continue
            out = math.prod(op.output(0).shape)
            for p in plan.pieces:
                for v in (p.a, p.b):
                    if v.pad is None:
                        continue
                    reads = math.prod(p.axes[q][1] for q in v.axes)
                    # (the defaults of C.PAD_MAX_RATIO and C.PAD_MIN_ELEMENTS)
                    bound = 4 * (math.prod(v.shape) + reads + out)
                    assert math.prod(v.padded_shape()) <= max(1 << 20, bound), \
                        (op.name, v.key, v.padded_shape())


def test_huge_padding_under_blas_true_is_refused_at_build_and_the_default_is_right():
    # conv2d(stride=10**6, padding=10**6) asked a 175 TiB padded copy of numpy at
    # call time (a raw _ArrayMemoryError); now blas(True) is refused at build time
    # naming the stage and the copy, and the default build runs the loop nest
    x = te.placeholder((1, 2, 5, 5), "X", "float64")
    w = te.placeholder((3, 2, 3, 3), "W", "float64")
    y = nn.conv2d(x, w, stride=10 ** 6, padding=10 ** 6)
    s = create_schedule([y])
    s[y].blas(True)
    with pytest.raises(ScheduleError, match=r"stage conv2d: blas\(True\).*zero-padded to "
                                            r"\(.*2000005.*PAD_MAX_RATIO"):
        codegen.build([y], [x, w], s)
    k = codegen.build([y], [x, w])
    assert "BLAS:" not in k.source
    feed = random_feed([x, w], seed=3)
    np.testing.assert_allclose(k(feed[x], feed[w])[0], te.evaluate(y, feed), rtol=1e-12)
