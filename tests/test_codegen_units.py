"""Compiled units (issue 11): a kernel is a driver over one compiled unit per
materialised stage, keyed by the stage's canonical text. A layer repeated with
the same shapes compiles once; two graphs that share a stage share its machine
code; editing one operator recompiles only its stage; errors name the stage of
the unit that failed (error codes are unit-local); worker processes and the
in-process path give the same units and values, and a failing or stuck worker
falls back to compiling in the process.

Every test starts from an empty cache (its own directory, memory cleared), so
the counts are exact."""

import time

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu import compile as cmp

from fork_testutil import FORKS_WITHOUT_JAX


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty disk cache and memory cache; the compile counters before the test."""
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "cache"))
    codegen.clear_memory_cache()
    yield cmp.stats()
    codegen.clear_memory_cache()


def _delta(before):
    now = cmp.stats()
    return {k: now[k] - before[k] for k in now}


def _matmul_t(a, w, name):
    """``a @ w.T`` as a materialised reduction stage."""
    k = te.reduce_axis(a.shape[1], "k_" + name)
    return te.compute((a.shape[0], w.shape[0]),
                      lambda i, j: te.sum(a[i, k] * w[j, k], axis=k), name=name)


def test_repeated_layer_compiles_once(fresh, monkeypatch):
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    X = te.placeholder((3, 7), "X", "float64")
    W1 = te.placeholder((7, 7), "W1", "float64")
    W2 = te.placeholder((7, 7), "W2", "float64")
    W3 = te.placeholder((7, 7), "W3", "float64")
    H1 = _matmul_t(X, W1, "H1")
    H2 = _matmul_t(H1, W2, "H2")  # the same stage structure (shapes, dtypes) as H1
    H3 = _matmul_t(H2, W3, "H3")
    kernel = codegen.build([H3, H1], [X, W1, W2, W3])
    assert kernel.stages == ["H1", "H2", "H3"]
    assert kernel.units_compiled == 1 and kernel.units_reused == 2
    assert len({u.key for u in kernel.units}) == 1
    assert _delta(fresh)["compiled"] == 1
    rng = np.random.default_rng(0)
    x, w1, w2, w3 = (rng.standard_normal(s) for s in [(3, 7), (7, 7), (7, 7), (7, 7)])
    h3, h1 = kernel(x, w1, w2, w3)
    np.testing.assert_allclose(h1, x @ w1.T, rtol=1e-12)
    np.testing.assert_allclose(h3, x @ w1.T @ w2.T @ w3.T, rtol=1e-12)
    # a different shape is a different unit; the equal ones are still shared
    W4 = te.placeholder((5, 7), "W4", "float64")
    H4 = _matmul_t(_matmul_t(X, W1, "G1"), W4, "G4")
    other = codegen.build([H4], [X, W1, W4])
    assert other.units_compiled == 1 and other.units[0].from_memory_cache
    w4 = rng.standard_normal((5, 7))
    np.testing.assert_allclose(other(x, w1, w4)[0], x @ w1.T @ w4.T, rtol=1e-12)


def _graph(scale, names):
    """S = X W^T (a reduction), T = tanh(S) * scale + S[0, :] (elementwise), and
    U = sum over rows of T (a second reduction); outputs T and U."""
    X = te.placeholder((4, 6), names + "X", "float64")
    W = te.placeholder((5, 6), names + "W", "float64")
    S = _matmul_t(X, W, names + "S")
    T = te.compute((4, 5), lambda i, j: te.tanh(S[i, j]) * scale + S[0, j], name=names + "T")
    r = te.reduce_axis(4, names + "r")
    U = te.compute((5,), lambda j: te.sum(T[r, j], axis=r), name=names + "U")
    return (X, W), (T, U)


def _reference(x, w, scale):
    s = x @ w.T
    t = np.tanh(s) * scale + s[0]
    return t, t.sum(axis=0)


def test_shared_stages_and_editing_one_operator(fresh, monkeypatch):
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    (X, W), outs = _graph(2.0, "a")
    first = codegen.build(list(outs), [X, W])
    assert first.units_compiled == 3 and first.units_reused == 0
    # another graph, other names, the same structure: every unit shared
    (X2, W2), outs2 = _graph(2.0, "b")
    second = codegen.build(list(outs2), [X2, W2])
    assert second.from_memory_cache and second.units_compiled == 0
    assert [u.key for u in second.units] == [u.key for u in first.units]
    assert all(u.fn is v.fn for u, v in zip(first.units, second.units))  # one machine code
    # one operator edited (the constant of T): only its unit is compiled again
    (X3, W3), outs3 = _graph(3.0, "c")
    edited = codegen.build(list(outs3), [X3, W3])
    assert edited.units_compiled == 1 and edited.units_reused == 2
    changed = [k for k, (u, v) in enumerate(zip(first.units, edited.units)) if u.key != v.key]
    assert changed == [edited.stages.index("cT")]
    assert _delta(fresh)["compiled"] == 4
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 6)), rng.standard_normal((5, 6))
    for kernel, scale in ((first, 2.0), (second, 2.0), (edited, 3.0)):
        t, u = kernel(x, w)
        t_ref, u_ref = _reference(x, w, scale)
        np.testing.assert_allclose(t, t_ref, rtol=1e-12)
        np.testing.assert_allclose(u, u_ref, rtol=1e-12)
    # the readable source names this graph's stages and buffers
    assert "# ---- stage cT: " in edited.source and "# cX_: input cX" in edited.source


def _gathers():
    """A[p] = X[I[p]] * 2 and B[p] = A[J[p]] + 1: each stage has one checked load
    (error code 1 in its own unit)."""
    X = te.placeholder((5,), "X", "float64")
    I = te.placeholder((4,), "I", "int64")
    J = te.placeholder((3,), "J", "int64")
    A = te.compute((4,), lambda p: X[I[p]] * 2.0, name="A")
    B = te.compute((3,), lambda q: A[J[q]] + 1.0, name="B")
    return (X, I, J), (A, B)


def test_errors_name_the_stage_of_the_failing_unit():
    (X, I, J), (A, B) = _gathers()
    kernel = codegen.build([A, B], [X, I, J])
    assert [u.stage for u in kernel.units] == ["A", "B"]
    # codes are unit-local: both units number their checks from 1
    assert kernel.units[0].errors[0].startswith("stage A: load `X[I[p]]`")
    assert kernel.units[1].errors[0].startswith("stage B: load ")  # (A inlined: I[J[q]])
    x = np.arange(5.0)
    a, b = kernel(x, np.array([4, 0, 1, 2]), np.array([3, 0, 1]))
    np.testing.assert_array_equal(a, [8.0, 0.0, 2.0, 4.0])
    np.testing.assert_array_equal(b, [5.0, 9.0, 1.0])
    with pytest.raises(te.OutOfBoundsError, match=r"stage B: load `\w\[J\[q\]\]`.*value 4\)"):
        kernel(x, np.array([0, 1, 2, 3]), np.array([0, 4, 1]))
    # the first unit fails: the message names A, and the second unit does not run
    out_b = np.full(3, -7.0)
    with pytest.raises(te.OutOfBoundsError, match=r"stage A: load `X\[I\[p\]\]`.*value -1\)"):
        kernel(x, np.array([0, -1, 2, 3]), np.array([9, 9, 9]), out=(None, out_b))
    np.testing.assert_array_equal(out_b, -7.0)


def test_division_by_zero_in_a_later_unit():
    X = te.placeholder((4,), "X", "int64")
    D = te.placeholder((4,), "D", "int64")
    r = te.reduce_axis(4, "r")
    S = te.compute((), lambda: te.sum(X[r], axis=r), name="S")
    Q = te.compute((4,), lambda i: X[i] // D[i] + S[()], name="Q")
    kernel = codegen.build([Q, S], [X, D])
    x = np.array([7, -7, 9, 4])
    q, s = kernel(x, np.array([2, 2, -4, 1]))
    np.testing.assert_array_equal(q, x // np.array([2, 2, -4, 1]) + 13)
    with pytest.raises(te.TexprError, match="stage Q: integer division by zero"):
        kernel(x, np.array([2, 0, 1, 1]))


def _two_unit_graph():
    X = te.placeholder((6, 5), "X", "float32")
    W = te.placeholder((3, 5), "W", "float32")
    Y = _matmul_t(X, W, "Y")
    ri, rj = te.reduce_axis(6, "ri"), te.reduce_axis(3, "rj")
    L = te.compute((), lambda: te.sum(Y[ri, rj] * Y[ri, rj], axis=[ri, rj]), name="L")
    (dW,) = te.differentiate(L, [W])
    return [X, W], [L, dW]


def _feed():
    rng = np.random.default_rng(2)
    return [rng.standard_normal((6, 5)).astype("float32"),
            rng.standard_normal((3, 5)).astype("float32")]


def test_worker_and_in_process_paths_agree(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "2")
    monkeypatch.setattr(cmp, "PARENT_COMPILES", False)  # every unit to the workers
    ins, outs = _two_unit_graph()
    pooled = codegen.build(outs, ins)
    d = _delta(fresh)
    n = len(pooled.units)
    assert n >= 3 and pooled.units_compiled == n
    assert d["in_workers"] == n and d["compiled"] == n and d["worker_failures"] == 0
    assert all(u.in_worker and not u.from_disk_cache for u in pooled.units)
    # in a process of its own (another cache, workers disabled): the same units
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    codegen.clear_memory_cache()
    before = cmp.stats()
    ins2, outs2 = _two_unit_graph()
    local = codegen.build(outs2, ins2)
    assert _delta(before)["in_workers"] == 0 and local.units_compiled == n
    assert [u.key for u in local.units] == [u.key for u in pooled.units]
    feed = _feed()
    got, want = pooled(*feed), local(*feed)
    ref = te.evaluate(outs, dict(zip(ins, feed)))
    for g, w, r in zip(got, want, ref):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    # a second process-wide build of the same graph loads every unit from disk
    codegen.clear_memory_cache()
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "cache"))
    again = codegen.build(outs, ins)
    assert again.from_disk_cache and again.units_compiled == 0


def test_a_worker_pool_is_retired_after_its_units(fresh, tmp_path, monkeypatch):
    # numba keeps every compiled unit in a worker's memory: after
    # WORKER_RECYCLE_UNITS units the next build gets a fresh pool (the old one
    # exits once idle), with the same units and values
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "2")
    monkeypatch.setattr(cmp, "PARENT_COMPILES", False)
    monkeypatch.setattr(cmp, "WORKER_RECYCLE_UNITS", 2)
    ins, outs = _two_unit_graph()
    first = codegen.build(outs, ins)
    pool = cmp._POOL[0]
    assert cmp._POOL[2] == len(first.units) >= 2
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "second"))
    codegen.clear_memory_cache()
    between = cmp.stats()  # (an earlier test's pool may have been retired above)
    second = codegen.build(outs, ins)
    d = _delta(between)
    assert d["pools_retired"] == 1 and cmp._POOL[0] is not pool
    assert d["in_workers"] == len(first.units) and d["worker_failures"] == 0
    assert [u.key for u in second.units] == [u.key for u in first.units]
    feed = _feed()
    for g, w in zip(second(*feed), first(*feed)):
        np.testing.assert_array_equal(g, w)


def test_the_split_keeps_small_builds_here_and_shares_large_ones():
    # Graham's LPT over this process (free at once) and one worker (free after its
    # start): three small units stay here; many units are shared, longest first
    few = {"a": 0.3, "b": 0.2, "c": 0.1}
    assert cmp.split_units(few, 1, 0.0, 1.1) == ([], 0)
    many = {f"u{i}": 0.4 for i in range(12)}
    keys, n = cmp.split_units(many, 1, 0.45, 1.1)
    assert n == 1 and 3 <= len(keys) <= 5  # 12 * 0.4 + 0.45 + 1.1 over two: ~3.2 s each
    assert cmp.split_units({"big": 5.0, "s": 0.1}, 1, 0.0, 1.1) == (["s"], 1)
    # a warm pool (start 0) takes its share at once
    assert len(cmp.split_units(many, 1, 0.0, 0.0)[0]) == 6
    # the text: parfor units cost more than serial ones of the same length
    serial = "import numpy\n@njit(parallel=False)\ndef unit():\n" + "    x = 1\n" * 40
    assert cmp.estimate_seconds(serial.replace("parallel=False", "parallel=True")) \
        > 1.5 * cmp.estimate_seconds(serial) > 0


def test_this_process_and_the_workers_share_a_build(fresh, tmp_path, monkeypatch):
    # the split (the default; TEXPR_COMPILE_HERE=0 turns it off): with the worker's start taken as free, this
    # process and one worker each compile part of the units; values as in one process
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "1")
    monkeypatch.setattr(cmp, "PARENT_COMPILES", True)
    monkeypatch.setattr(cmp, "WORKER_START_SECONDS", 0.0)
    monkeypatch.setattr(cmp, "NUMBA_START_SECONDS", 0.0)
    ins, outs = _two_unit_graph()
    kernel = codegen.build(outs, ins)
    d = _delta(fresh)
    n = len(kernel.units)
    assert n >= 3 and d["compiled"] == n and d["worker_failures"] == 0
    assert 1 <= d["in_workers"] < n
    assert sum(u.in_worker for u in kernel.units) == d["in_workers"]
    feed = _feed()
    ref = te.evaluate(outs, dict(zip(ins, feed)))
    for g, r in zip(kernel(*feed), ref):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def _hang(*args):
    time.sleep(120)


@pytest.mark.parametrize("how", ["fails", "stuck"])
def test_worker_failure_falls_back_to_compiling_here(fresh, monkeypatch, how):
    """A worker that raises (here: a builtin called with the wrong arguments), or
    one that never returns (killed after TEXPR_COMPILE_TIMEOUT): the units are
    compiled in the process, the values are right, no exception escapes."""
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "2")
    monkeypatch.setenv("TEXPR_COMPILE_TIMEOUT", "3")
    monkeypatch.setattr(cmp, "PARENT_COMPILES", False)
    monkeypatch.setattr(cmp, "_WORKER_FN", divmod if how == "fails" else _hang)
    ins, outs = _two_unit_graph()
    t0 = time.monotonic()
    kernel = codegen.build(outs, ins)
    d = _delta(fresh)
    n = len(kernel.units)
    assert d["in_workers"] == 0 and d["compiled"] == n and d["worker_failures"] == n
    assert not any(u.in_worker for u in kernel.units)
    if how == "stuck":
        assert cmp._POOL is None  # the stuck pool was killed
        assert time.monotonic() - t0 < 100  # not waited for the sleeping workers
    feed = _feed()
    ref = te.evaluate(outs, dict(zip(ins, feed)))
    for g, r in zip(kernel(*feed), ref):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def test_compile_error_names_the_stage(fresh, monkeypatch):
    """numba rejecting a unit (here: its text corrupted after lowering) is a
    CompileError naming that unit's stage, also when workers compile."""
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "2")
    from texpr.codegen.loopnest import lower as lower_mod
    real = lower_mod._lower_unit

    def broken(op, *args):
        u = real(op, *args)
        if op.name == "L":
            u.module_source = u.module_source.replace("return 0", "return undefined_name")
        return u

    monkeypatch.setattr(lower_mod, "_lower_unit", broken)
    ins, outs = _two_unit_graph()
    with pytest.raises(codegen.CompileError, match=r"the stage L\[\] = sum"):
        codegen.build(outs, ins)


def test_many_builds_in_one_process_keep_numba_block_labels_small(monkeypatch, tmp_path):
    # every unit inlines its check helpers; numba's process-wide block-label counter
    # used to grow by a digit per kernel like these until, after some hundreds of
    # builds in one process, LLVM rejected the modules ("name is too long": a fuzz
    # run's CompileErrors). It is reset before each compile (codegen/backends/numba_cpu/compile.py).
    from numba.core import ir_utils

    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")  # compile here, in this process
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))
    X = te.placeholder((8,), "X")
    I = te.placeholder((8,), "I", dtype="int64")
    x, idx = np.arange(8, dtype="float32"), np.array([3, 1, 4, 1, 5, 0, 2, 6])
    digits = []
    for r in range(6):
        Y = te.compute((8,), lambda i: te.max(X[I[i]] * (1.0 + r), X[I[(i + 1) % 8]])
                       + te.max(X[I[(i + 2) % 8]], X[I[(i + 3) % 8]] * 2.0), name=f"Y{r}")
        got = codegen.build([Y], [X, I])(x, idx)[0]
        np.testing.assert_array_equal(got, te.evaluate(Y, {X: x, I: idx}))
        digits.append(len(str(ir_utils._the_max_label._value)))
    assert max(digits) <= 6 and digits[-1] <= digits[0] + 1, digits


def _numba_settings():
    import numba
    from numba.core.cpu import CPUTargetOptions
    cg = cmp._jit_codegen()
    return (numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE,
            CPUTargetOptions.finalize, cg._opt_level, cg._loopvect)


def _param_attributes(llvm, name):
    """The type-and-attribute text of each LLVM parameter of array argument ``name``
    in the definitions of ``llvm`` (``ptr noalias readonly captures(none)`` of
    ``%arg.b0.4``)."""
    import re
    return [m.group(1) for ln in llvm.splitlines() if ln.startswith("define")
            for m in re.finditer(r'([^,(]*)%"?arg\.' + name + r'\.[0-9.]+"?', ln)]


def test_unit_flags_apply_to_the_unit_alone_and_are_restored(fresh, monkeypatch):
    """A unit's parameters are noalias in its LLVM code; numba's settings (the
    vectorisers, its target options' finalize, the first module round) are
    numba's own again after the build, also after a unit numba rejects, and a
    function of the user's compiled afterwards has no noalias parameters."""
    import numba

    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    before = _numba_settings()
    ins, outs = _two_unit_graph()
    kernel = codegen.build(outs, ins)
    assert _numba_settings() == before
    fn = kernel.units[0].fn
    attrs = _param_attributes(fn.inspect_llvm(list(fn.signatures)[0]), "b0")
    assert attrs and all("noalias" in a for a in attrs if "ptr" in a or "*" in a), attrs
    with pytest.raises(cmp.CompileError):
        cmp.compile_source("import numpy as np\nfrom numba import njit\n"
                           "@njit(cache=True)\ndef unit(b0, err):\n    return b0.nonexistent\n",
                           [("float32", 1), ("int64", 1)], "a broken unit", entry="unit")
    assert _numba_settings() == before

    @numba.njit
    def mine(a, b):
        a[0] = b[0]

    mine(np.zeros(2), np.ones(2))
    attrs = _param_attributes(mine.inspect_llvm(list(mine.signatures)[0]), "a")
    assert attrs and not any("noalias" in a for a in attrs), attrs


def test_the_vectoriser_settings_are_decided_when_numba_compiles_only(fresh, monkeypatch):
    """The unit text's analyses (codegen.backends.numba_cpu.vectorize) run when numba compiles a
    unit, before LLVM's pass managers are made (the SLP vectoriser is on there),
    and not at all for units loaded from the disk cache (they cost 5-10 ms a
    unit of a warm build); the loaded kernel's values are the compiled one's."""
    import numba
    from numba.core.codegen import CPUCodegen

    from texpr.codegen.backends.numba_cpu import vectorize

    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    analysed, seen = [], []
    real_inv = vectorize.invariant_comparison_loop
    monkeypatch.setattr(vectorize, "invariant_comparison_loop",
                        lambda src: analysed.append(src) or real_inv(src))
    real_mpm = CPUCodegen._module_pass_manager

    def recording(self, **kw):
        seen.append(numba.config.SLP_VECTORIZE)
        return real_mpm(self, **kw)
    monkeypatch.setattr(CPUCodegen, "_module_pass_manager", recording)
    ins, outs = _two_unit_graph()
    compiled = codegen.build(outs, ins)
    assert compiled.units_compiled >= 1 and len(analysed) == compiled.units_compiled
    assert 1 in seen  # the units' own LLVM rounds ran with the SLP vectoriser on
    got = compiled(*_feed())
    codegen.clear_memory_cache()
    before = len(analysed)
    loaded = codegen.build(outs, ins)
    assert loaded.from_disk_cache and len(analysed) == before
    for a, b in zip(got, loaded(*_feed())):
        np.testing.assert_array_equal(a, b)


def test_a_unit_compiled_here_runs_as_fast_as_loaded(fresh, monkeypatch):
    """The process that compiles a parallel unit runs the same code as one that
    loads it (numba's first module round at -O3, see compile._unit_flags): the
    unit's machine code here and from the disk cache give equal results, and the
    in-process build's values are the evaluator's (the speed itself is measured
    by benchmarks/bench_compile.py, never by a test)."""
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    X = te.placeholder((8, 8, 28, 28), "X")
    Y = te.nn.max_pool2d(X, 2)
    H = te.placeholder(Y.shape, "H")
    (dX,) = te.differentiate(Y, [X], head=H).result
    x = np.random.default_rng(0).standard_normal(X.shape).astype("float32")
    h = np.random.default_rng(1).standard_normal(Y.shape).astype("float32")
    here = codegen.build([Y, dX], [X, H])
    assert here.units_compiled == len(here.units)
    got = here(x, h)
    codegen.clear_memory_cache()
    loaded = codegen.build([Y, dX], [X, H])
    assert loaded.from_disk_cache
    for a, b, r in zip(got, loaded(x, h), te.evaluate([Y, dX], {X: x, H: h})):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=1e-6, atol=1e-6)


def _build_in_a_child(tag):
    # a multiprocessing child's build with an empty cache: its units go to a pool
    # of compile workers (TEXPR_COMPILE_HERE=0), children of this child
    ins, outs = _two_unit_graph()
    kernel = codegen.build(outs, ins)
    assert cmp._POOL is not None
    kernel(*_feed())


@FORKS_WITHOUT_JAX
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_multiprocessing_child_that_started_workers_exits(method, tmp_path, monkeypatch):
    """A process that multiprocessing started (a DDP rank) runs no atexit handlers:
    its exit joined its compile workers, which waited for work for good (the
    README's DDP example hung on a cold cache). Its pool is shut down by a
    multiprocessing finalizer now: the child ends by itself."""
    import multiprocessing as mp

    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TEXPR_COMPILE_HERE", "0")
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "2")
    monkeypatch.setattr(cmp, "PARENT_COMPILES", False)
    if method == "fork":
        codegen.clear_memory_cache()
        monkeypatch.setattr(cmp, "_POOL", None)
    p = mp.get_context(method).Process(target=_build_in_a_child, args=(method,))
    p.start()
    p.join(180)
    alive = p.is_alive()
    if alive:
        import subprocess
        subprocess.run(["pkill", "-9", "-P", str(p.pid)], check=False)
        p.kill()
        p.join(30)
    assert not alive, "the child did not exit: its compile workers kept it waiting"
    assert p.exitcode == 0
