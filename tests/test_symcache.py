"""The symbolic cache (texpr.symcache): a warm result is the cold one, bound to the caller.

"Warm" here is a second graph built the same way in this process (new Tensor,
Operation and variable objects): the result is loaded from the disk entry the
first call wrote, and must be indistinguishable in use from a fresh result --
same names, adjoints keyed by the caller's tensors, stages reading the
caller's placeholders, ``explain()``, equal values through ``te.evaluate``
(checked against float64 finite differences) and through a built kernel.
Every test uses its own cache directory.
"""

import io
import os
import pickle
import warnings

import numpy as np
import pytest

import texpr as te
from texpr import codegen, symcache
from texpr.printer import graph_str
from texpr.tensor import PlaceholderOp, topo_order
from texpr.testing import numeric_gradient, random_feed

nn = te.nn


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(d))
    monkeypatch.delenv("TEXPR_SYMBOLIC_CACHE", raising=False)
    symcache._WARNED.clear()
    return d


def _counts():
    return dict(symcache.stats)


def _delta(before):
    return {k: symcache.stats[k] - before[k] for k in before}


def _model(c=0.5, n=4, name="Y", dtype="float64", lo=0):
    """A dense layer, tanh, a max over a strided window and a scalar loss:
    placeholders X (n, 6), W (3, 6 - lo) -- the reduce axis runs over [lo, 6)."""
    X = te.placeholder((n, 6), "X", dtype)
    W = te.placeholder((3, 6), "W", dtype)
    k = te.reduce_axis((lo, 6), "k")
    Y = te.compute((n, 3), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name=name)
    T = te.compute((n, 3), lambda i, j: te.tanh(Y[i, j]) * c, name="T")
    r = te.reduce_axis(2, "r")
    M = te.compute((n // 2, 3), lambda i, j: te.max(T[2 * i + r, j], axis=r), name="M")
    a, b = te.reduce_axis(n // 2, "a"), te.reduce_axis(3, "b")
    L = te.compute((), lambda: te.sum(M[a, b] * M[a, b], axis=[a, b]), name="L")
    return L, X, W, Y


def _differentiate(c=0.5, **kw):
    L, X, W, Y = _model(c, **kw)
    return te.differentiate(L, [X, W]), (L, X, W, Y)


def test_warm_result_equals_cold_and_is_bound_to_the_caller(cache_dir):
    before = _counts()
    cold, (L0, X0, W0, Y0) = _differentiate()
    assert _delta(before)["store"] >= 1 and _delta(before)["hit"] == 0
    before = _counts()
    warm, (L, X, W, Y) = _differentiate()
    assert _delta(before) == dict(hit=1, miss=0, store=0, discard=0, uncacheable=0)

    # same names, same structure
    assert [t.name for t in warm.result] == [t.name for t in cold.result] == ["d_X__Y", "d_W__Y"]
    assert graph_str(warm.result, canonical=True) == graph_str(cold.result, canonical=True)
    assert graph_str(warm.result) == graph_str(cold.result)
    # the adjoints dict is keyed by the caller's own tensors, in the same order
    assert [k.name for k in warm.adjoints] == [k.name for k in cold.adjoints]
    fwd = {id(op.output(0)) for op in topo_order([L])}
    assert all(id(k) in fwd for k in warm.adjoints)
    assert warm.adjoints[Y] is not None and warm.adjoints[L] is warm.head
    assert not any(k is Y0 for k in warm.adjoints)
    # every placeholder the loaded stages read is one of the caller's
    phs = [op for op in topo_order(list(warm.result)) if isinstance(op, PlaceholderOp)]
    assert phs and all(op is X.op or op is W.op for op in phs)
    # explain() works on the loaded record and prints what the cold one did
    assert warm.explain() == cold.explain()
    assert te.simplify.explain(warm.result[1]) == te.simplify.explain(cold.result[1])

    # values: the evaluator (equal to the cold result, and to finite differences)
    feed = random_feed([L], seed=3)
    feed0 = {X0: feed[X], W0: feed[W]}
    for tw, tc, wrt in zip(warm.result, cold.result, (X, W)):
        got = te.evaluate(tw, feed)
        np.testing.assert_array_equal(got, te.evaluate(tc, feed0))
        np.testing.assert_allclose(got, numeric_gradient(L, wrt, feed), rtol=1e-6, atol=1e-8)
    # values: a kernel built from the loaded result (its lowering is loaded too)
    before = _counts()
    k_warm = codegen.build([L] + list(warm.result), [X, W], parallel=False, blas=False)
    out = k_warm(feed[X], feed[W])
    for t, v in zip([L] + list(warm.result), out):
        np.testing.assert_allclose(v, te.evaluate(t, feed), rtol=1e-12, atol=1e-12)
    k_cold = codegen.build([L0] + list(cold.result), [X0, W0], parallel=False, blas=False)
    assert k_cold.source == k_warm.source
    for a, b in zip(k_cold(feed[X], feed[W]), out):
        np.testing.assert_array_equal(a, b)
    d = _delta(before)
    assert d["hit"] >= 2 and d["discard"] == 0  # the cold kernel's simplify and lowering


def test_lowering_is_cached_and_bound_to_the_kernel_tensors(cache_dir):
    """A Program loaded for a second graph names that graph's tensors in its
    buffers (the kernel maps arrays to buffers by tensor identity)."""
    kernels = []
    for _ in range(2):
        X = te.placeholder((5,), "X", "float64")
        Y = te.compute((5,), lambda i: X[i] * 3.0 + 1.0, name="Y")
        Z = te.compute((5,), lambda i: Y[4 - i] - X[i], name="Z")
        before = _counts()
        k = codegen.build([Z, Y], [X], parallel=False, blas=False)
        kernels.append((k, X, Y, Z, _delta(before)))
    (k0, *_r, d0), (k1, X, Y, Z, d1) = kernels
    assert d0["hit"] == 0 and d1["hit"] == 2  # simplify and lower
    bufs = [b.tensor for b in k1._program.buffers]
    assert bufs[0] is X and all(a is b for a, b in zip(bufs[1:3], k1.outputs))
    assert k1.outputs[1] is Y  # simplify kept Y: the caller's own tensor
    x = np.arange(5.0)
    z, y = k1(x)
    np.testing.assert_array_equal(y, x * 3 + 1)
    np.testing.assert_array_equal(z, (x * 3 + 1)[::-1] - x)
    assert k1.source == k0.source


def test_a_schedule_decision_is_part_of_the_lowering_key(cache_dir):
    def build(factor):
        X = te.placeholder((8, 6), "X", "float64")
        Y = te.compute((8, 6), lambda i, j: X[i, j] * 2.0, name="Y")
        s = codegen.create_schedule([Y])
        if factor:
            s[Y].split(Y.op.axis[0], factor)
        return codegen.build([Y], [X], s, parallel=False, blas=False), X

    plain, _ = build(0)
    before = _counts()
    split, _ = build(4)
    assert _delta(before)["hit"] == 0 and split.source != plain.source
    x = np.arange(48.0).reshape(8, 6)
    np.testing.assert_array_equal(split(x)[0], 2 * x)
    before = _counts()
    again, _ = build(4)
    assert _delta(before)["hit"] == 1 and again.source == split.source


@pytest.mark.parametrize("variant", [
    dict(c=0.75),            # a constant
    dict(n=6),               # a shape
    dict(name="Z"),          # a name that ends up in the results (d_X__Z)
    dict(dtype="float32"),   # a dtype
    dict(lo=1),              # a reduction domain
])
def test_graphs_that_differ_in_one_detail_never_share_an_entry(cache_dir, monkeypatch, variant):
    _differentiate()  # the base graph, stored
    before = _counts()
    res, (L, X, W, Y) = _differentiate(**variant)
    assert _delta(before)["hit"] == 0 and _delta(before)["miss"] == 1
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    fresh, (L2, X2, W2, Y2) = _differentiate(**variant)
    assert graph_str(res.result) == graph_str(fresh.result)
    assert f"d_X__{Y.name}" == res.result[0].name
    feed = random_feed([L], seed=1)
    for a, b in zip(res.result, fresh.result):
        np.testing.assert_array_equal(te.evaluate(a, feed),
                                      te.evaluate(b, {X2: feed[X], W2: feed[W]}))


def test_canonical_text_is_structural_and_complete():
    a, b = _model()[0], _model()[0]
    ta, tb = symcache.canonical([a]).text, symcache.canonical([b]).text
    assert ta == tb
    assert symcache.canonical([_model(c=0.5000001)[0]]).text != ta
    assert symcache.canonical([_model(name="Q")[0]]).text != ta
    # -0.0 and 0.0 are different constants, and so are 1e-300 and 1.0000000000000002e-300
    X = te.placeholder((2,), "X", "float64")
    texts = {symcache.canonical([te.compute((2,), lambda i: X[i] * v, name="Y")]).text
             for v in (0.0, -0.0, 1e-300, 1.0000000000000002e-300)}
    assert len(texts) == 4
    # a shared subexpression is written once (the text grows linearly, not 2**depth)
    e = X[0]
    for _ in range(12):
        e = e * e
    deep = te.compute((), lambda: e, name="D")
    assert len(symcache.canonical([deep]).text) < 1000


def test_an_attribute_it_cannot_describe_is_not_cached(cache_dir):
    X = te.placeholder((3,), "X", "float64")
    Y = te.compute((3,), lambda i: X[i] * X[i], name="Y", attrs={"obj": object()})
    k = te.reduce_axis(3, "k")
    L = te.compute((), lambda: te.sum(Y[k], axis=k), name="L")
    before = _counts()
    (dX,) = te.differentiate(L, [X])
    assert _delta(before)["uncacheable"] >= 1 and _delta(before)["store"] == 0
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(te.evaluate(dX, {X: x}), 2 * x)


def _entry(cache_dir, kind):
    files = sorted((cache_dir / "symbolic").glob(f"{kind}-*.pkl"))
    assert len(files) == 1, files
    return files[0]


@pytest.mark.parametrize("damage", ["truncated", "empty", "random", "foreign", "unbindable"])
def test_a_damaged_entry_is_discarded_with_one_warning_and_recomputed(cache_dir, damage):
    cold, _ = _differentiate()
    path = _entry(cache_dir, "differentiate")
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "random":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif damage == "foreign":  # the valid entry of another graph, under this name
        path.unlink()
        _differentiate(0.9)
        other = _entry(cache_dir, "differentiate")
        other.rename(path)
    else:  # checksummed and of this key, but naming an object the graph has not
        key = data.split(b"\n", 2)[1].decode()
        path.write_bytes(symcache._entry_bytes(key, _pickle_with_pid(10 ** 6)))
    for rnd in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res, (L, X, W, Y) = _differentiate()
        ours = [w for w in caught if issubclass(w.category, symcache.SymbolicCacheWarning)]
        assert len(ours) == (1 if rnd == 0 else 0), [str(w.message) for w in ours]
        if rnd == 0:
            assert "discarded" in str(ours[0].message)
        feed = random_feed([L], seed=2)
        np.testing.assert_allclose(te.evaluate(res.result[0], feed),
                                   numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)
        assert graph_str(res.result) == graph_str(cold.result)
    assert path.read_bytes() != b"" and path.read_bytes()[:5] == b"TEXPR"


def _pickle_with_pid(pid):
    """A pickle whose only object is the persistent id ``pid``."""
    import io

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return pid if obj == "x" else None

    buf = io.BytesIO()
    P(buf, protocol=4).dump("x")
    return buf.getvalue()


def test_an_unusable_directory_degrades_to_no_cache_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(blocker))
    symcache._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for c in (0.5, 0.25):
            res, (L, X, W, Y) = _differentiate(c)
            feed = random_feed([L], seed=0)
            np.testing.assert_allclose(te.evaluate(res.result[1], feed),
                                       numeric_gradient(L, W, feed), rtol=1e-6, atol=1e-8)
    ours = [w for w in caught if issubclass(w.category, symcache.SymbolicCacheWarning)]
    assert len(ours) == 1 and "cannot be used" in str(ours[0].message)
    assert blocker.read_text() == "x"


def test_a_read_only_directory_is_left_untouched(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(ro))
    symcache._WARNED.clear()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
        False if os.path.abspath(p) == str(ro) and mode & os.W_OK else real(p, mode, **kw)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res, (L, X, W, Y) = _differentiate()
    assert len([w for w in caught if issubclass(w.category, symcache.SymbolicCacheWarning)]) == 1
    assert os.listdir(ro) == []
    feed = random_feed([L], seed=0)
    np.testing.assert_allclose(te.evaluate(res.result[0], feed),
                               numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)


def test_writes_that_fail_degrade_with_one_warning(cache_dir, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(cache_dir))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _differentiate(0.5)
        res, (L, X, W, Y) = _differentiate(0.3)
    assert len([w for w in caught if issubclass(w.category, symcache.SymbolicCacheWarning)]) == 1
    assert not (cache_dir / "symbolic").exists()
    feed = random_feed([L], seed=0)
    np.testing.assert_allclose(te.evaluate(res.result[0], feed),
                               numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)


def test_the_environment_switch_turns_it_off(cache_dir, monkeypatch):
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    before = _counts()
    _differentiate()
    _differentiate()
    assert _delta(before) == dict(hit=0, miss=0, store=0, discard=0, uncacheable=0)
    assert not (cache_dir / "symbolic").exists()


def test_simplify_and_jvp_results_are_cached(cache_dir):
    outs = []
    for _ in range(2):
        L, X, W, Y = _model()
        raw = list(te.differentiate(L, [X, W], simplify=False))
        V = te.placeholder(X.shape, "V", "float64")
        before = _counts()
        simp = te.simplify.simplify(raw)
        tangent = te.jvp(L, [X], [V])
        outs.append((simp, tangent, L, X, W, V, _delta(before)))
    (s0, j0, *_a, d0), (s1, j1, L, X, W, V, d1) = outs
    assert d0["hit"] == 0 and d1["hit"] == 2
    assert graph_str(s1) == graph_str(s0) and graph_str(j1) == graph_str(j0)
    feed = random_feed([L, V], seed=5)
    np.testing.assert_allclose(te.evaluate(s1[0], feed), numeric_gradient(L, X, feed),
                               rtol=1e-6, atol=1e-8)
    want = float(np.sum(te.evaluate(s1[0], feed) * feed[V]))
    np.testing.assert_allclose(te.evaluate(j1, feed), want, rtol=1e-10)


def test_a_manual_rule_is_not_cached(cache_dir):
    L, X, W, Y = _model()
    before = _counts()
    te.differentiate(L, [X], manual={(Y, X): lambda out, inp, h: te.compute(
        inp.shape, lambda i, j: te.const(0.0, "float64"), name="zero")})
    assert _delta(before)["hit"] == 0
    assert not list((cache_dir / "symbolic").glob("differentiate-*.pkl"))


def test_a_directory_in_the_place_of_an_entry_warns_once_naming_it(cache_dir):
    # a directory where one entry should be gave 2 warnings on every run, one
    # saying the whole cache "cannot be used" (issue 52, kind 8): one warning
    # naming the entry, the result recomputed (right), the other entries served
    cold, _ = _differentiate()
    path = _entry(cache_dir, "differentiate")
    path.unlink()
    path.mkdir()
    (path / "something").write_text("not texpr's")
    _differentiate(0.25)  # another graph: its entry is written beside it
    for rnd in range(2):
        before = _counts()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res, (L, X, W, Y) = _differentiate()
            _differentiate(0.25)
        ours = [str(w.message) for w in caught
                if issubclass(w.category, symcache.SymbolicCacheWarning)]
        assert len(ours) == (1 if rnd == 0 else 0), ours
        if rnd == 0:
            assert str(path) in ours[0] and "is a directory" in ours[0]
            assert "cannot be used" not in ours[0]
        delta = _delta(before)
        assert delta["hit"] >= 1  # the other graph's entry (and its simplify's)
        assert delta["discard"] == 0
        feed = random_feed([L], seed=4)
        np.testing.assert_allclose(te.evaluate(res.result[0], feed),
                                   numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)
        assert graph_str(res.result) == graph_str(cold.result)
    assert (path / "something").read_text() == "not texpr's"


def _chain(n=40):
    """A chain of ``n`` elementwise stages and a sum: its gradient's graph nests
    deeper than pickle's recursion limit (load, tensor, operation, body, load...)."""
    X = te.placeholder((3,), "X", "float64")
    Y = X
    for k in range(n):
        Y = te.compute((3,), lambda i, Y=Y: Y[i] * 0.5 + te.sin(Y[i]), name=f"Y{k}")
    r = te.reduce_axis(3, "r")
    L = te.compute((), lambda: te.sum(Y[r], axis=r), name="L")
    return L, X


def test_a_graph_deeper_than_the_recursion_limit_is_cached(cache_dir):
    """A result whose pickle recursed past the limit was not cached (one
    ``SymbolicCacheWarning ... RecursionError``, and every warm run did the work
    again, GPT-8L's training step among them); now it is stored and loads."""
    L0, X0 = _chain()
    before = _counts()
    with warnings.catch_warnings():
        warnings.simplefilter("error", symcache.SymbolicCacheWarning)
        cold = te.differentiate(L0, [X0])
    assert _delta(before)["store"] == 1
    with pytest.raises(RecursionError):  # what _dumps met before: plain pickling fails
        symcache._Pickler(io.BytesIO(), symcache.canonical([L0]).refs).dump(cold)
    L, X = _chain()
    before = _counts()
    with warnings.catch_warnings():
        warnings.simplefilter("error", symcache.SymbolicCacheWarning)
        warm = te.differentiate(L, [X])
    assert _delta(before) == dict(hit=1, miss=0, store=0, discard=0, uncacheable=0)
    assert graph_str(warm.result) == graph_str(cold.result)
    assert warm.adjoints[L] is warm.head
    phs = [op for op in topo_order(list(warm.result)) if isinstance(op, PlaceholderOp)]
    assert phs and all(op is X.op for op in phs)
    feed = random_feed([L], seed=5)
    got = te.evaluate(warm.result[0], feed)
    np.testing.assert_array_equal(got, te.evaluate(cold.result[0], {X0: feed[X]}))
    np.testing.assert_allclose(got, numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)
