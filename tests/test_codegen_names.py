"""Names never reach generated code: any str is a legal name of a placeholder,
reduction axis, stage or te.nn layer, appears in ``Kernel.source`` only in
escaped one-line comments, and changes nothing the kernel computes (programs
that differ only in names share one compiled kernel). Non-str names are a
TexprError where they enter. ``Kernel.source`` is readable: buffers named after
their tensors, each stage's definition in a comment, no dead assignments."""

import ast
import builtins
import io
import tokenize

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.loopnest import lower as lower_mod
from texpr.codegen.loopnest.source import (buffer_identifiers, comment_text, remove_dead_assignments)

#: the characters that end a line for Python's tokenizer or for str.splitlines
SEPARATORS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
              "\u2029"]
#: code that marks the builtins module if it ever runs
PAYLOAD = "__import__('builtins').__dict__.__setitem__('TEXPR_INJECTED', 1)"

ODD_NAMES = (
    [f"Y{s}{PAYLOAD}" for s in SEPARATORS]
    + ["\x00", f"nul\x00{PAYLOAD}", "\ud800", "a\udfffb", "\t", "\\", "\\\n" + PAYLOAD, "#",
       "'", '"""', "é", "名前", "🙂", " ", "x" * 5000, "\x7f\x1b[31m",
       # keywords, builtins and the generated code's own identifiers
       "def", "return", "in", "lambda", "None", "range", "np", "math", "err", "kernel",
       "prange", "_ck", "min", "i0_0", "c0_0", "acc0_0", "in0", "tmp0", "out0", "X_", "__class__",
       "1abc", "a-b"])


def _program(name_a, name_b, name_k, name_s, name_r, name_t):
    """A (3, 4) and B (4,) placeholders; S = A @ B (a reduction over k, materialised);
    R = relu(S) (te.nn); T = R * 2 + S[0] (the output)."""
    A = te.placeholder((3, 4), name_a, "float64")
    B = te.placeholder((4,), name_b, "float64")
    k = te.reduce_axis(4, name_k)
    S = te.compute((3,), lambda i: te.sum(A[i, k] * B[k], axis=k), name=name_s)
    R = te.nn.relu(S, name=name_r)
    T = te.compute((3,), lambda i: R[i] * 2.0 + S[0], name=name_t)
    return (A, B), T


def _expected(a, b):
    s = a @ b
    return np.maximum(s, 0) * 2.0 + s[0]


def _code_tokens(source):
    """The tokens of ``source`` that are code (no comments, no line breaks)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
            tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
    return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in skip]


@pytest.fixture(scope="module")
def reference_kernel():
    (A, B), T = _program("A", "B", "k", "S", "R", "T")
    return codegen.build([T], [A, B])


@pytest.mark.parametrize("name", ODD_NAMES, ids=lambda n: repr(n)[:30])
def test_any_str_name_is_only_a_comment(name, reference_kernel):
    # the same name everywhere: both placeholders (a collision), the reduction axis,
    # two stages and the te.nn layer
    (A, B), T = _program(name, name, name, name, name, name)
    kernel = codegen.build([T], [A, B])
    assert not hasattr(builtins, "TEXPR_INJECTED")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    np.testing.assert_allclose(kernel(a, b)[0], _expected(a, b), rtol=1e-12)
    # one compiled unit per stage for every naming of this structure
    assert kernel.paths == reference_kernel.paths and None not in kernel.paths
    ref_src = reference_kernel.source
    src = kernel.source
    # the readable text is code exactly like the reference's, up to the buffer names
    # (so no name added a statement), and has as many lines
    assert len(src.splitlines()) == len(ref_src.splitlines())
    ref_tok, tok = _code_tokens(ref_src), _code_tokens(src)
    assert len(tok) == len(ref_tok)
    assert all(x == y or y.endswith("_") for x, y in zip(ref_tok, tok))
    assert src.encode("utf-8")  # lone surrogates are escaped
    # the module on disk (what Python runs) holds no user text
    for path in kernel.paths:
        with open(path, encoding="utf-8") as f:
            module = f.read()
        assert "TEXPR_INJECTED" not in module and "\x00" not in module
    # the name is shown, escaped, in the stage comments
    assert f"# ---- stage {comment_text(name)}: " in src


def test_names_do_not_poison_later_programs(tmp_path, monkeypatch):
    """A NUL byte (or a lone surrogate) in one program's names once made every later
    build of the same structure fail: the module written to disk held the name."""
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))
    for bad in ["bad\x00name", "\ud800"]:
        (A, B), T = _program(bad, "B", "k", bad, "R", bad)
        codegen.clear_memory_cache()
        first = codegen.build([T], [A, B])
        codegen.clear_memory_cache()
        (A2, B2), T2 = _program("A", "B", "k", "S", "R", "T")
        later = codegen.build([T2], [A2, B2])  # reads the module the first build wrote
        assert later.paths == first.paths and later.path.startswith(str(tmp_path))
        a, b = np.ones((3, 4)), np.arange(4.0)
        np.testing.assert_allclose(later(a, b)[0], _expected(a, b))
        np.testing.assert_allclose(first(a, b)[0], _expected(a, b))


def test_gradient_with_odd_names_matches_the_evaluator():
    """Adjoint stages are named after the user's names (``d_<X>__<Y>``): the odd
    characters reach their comments too, escaped, and the values are right."""
    name = f"W\r{PAYLOAD}\u2028"
    X = te.placeholder((3, 4), f"X\n{PAYLOAD}", "float64")
    W = te.placeholder((4, 2), name, "float64")
    k = te.reduce_axis(4, "k\x85")
    Y = te.compute((3, 2), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k), name="Y\x0c")
    r0, r1 = te.reduce_axis(3, "r0\x00"), te.reduce_axis(2, "r1\ud800")
    L = te.compute((), lambda: te.sum(te.tanh(Y[r0, r1]), axis=[r0, r1]), name="L\x1c")
    (dW,) = te.differentiate(L, [W])
    kernel = codegen.build([L, dW], [X, W])
    assert not hasattr(builtins, "TEXPR_INJECTED")
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    l_val, dw = kernel(x, w)
    ref = te.evaluate([L, dW], {X: x, W: w})
    np.testing.assert_allclose(l_val, ref[0], rtol=1e-12)
    np.testing.assert_allclose(dw, ref[1], rtol=1e-12)
    np.testing.assert_allclose(dw, x.T @ (1 - np.tanh(x @ w) ** 2), rtol=1e-12)
    assert "\\r" in kernel.source and "\\u2028" in kernel.source


@pytest.mark.parametrize("call", [
    lambda: te.placeholder((2,), 5),
    lambda: te.placeholder((2,), b"X"),
    lambda: te.compute((2,), lambda i: i * 2, name=3.0),
    lambda: te.compute((2,), lambda i: i * 2, name=["Y"]),
    lambda: te.reduce_axis(3, 7),
    lambda: te.reduce_axis(3, b"k"),
    lambda: te.nn.relu(te.placeholder((2,)), name=1),
    lambda: te.nn.dense(te.placeholder((2, 3)), te.placeholder((4, 3)), name=None),
    lambda: te.nn.softmax(te.placeholder((2, 3)), name=b"s"),
    lambda: te.scatter_add((2,), "float32", (2,), lambda p: p, lambda p: 1.0, name=0.5),
    lambda: te.comm_reducer(lambda a, b: a + b, lambda d: te.const(0, d), name=3),
])
def test_non_str_names_are_texpr_errors(call):
    with pytest.raises(te.TexprError, match="name must be a str"):
        call()


def test_buffer_identifiers_are_unique_identifiers():
    names = ["X", "X", "a-b", "a+b", "", "1x", "def", "in", "名前", "\x00", "X_", "X_1"]
    ids = buffer_identifiers(names)
    assert len(set(ids)) == len(ids)
    assert all(i.isidentifier() and i.isascii() and i.endswith("_") for i in ids)
    assert ids[:4] == ["X_", "X_1_", "ab_", "ab_1_"]


@pytest.mark.parametrize("sep", SEPARATORS + ["\x00", "\ud800", "\x1b", "\t"])
def test_comment_text_is_one_printable_line(sep):
    text = comment_text(f"a{sep}b")
    assert len(f"# {text}".splitlines()) == 1 and text.isprintable()
    assert _code_tokens(f"# {text}\nx = 1\n") == ["x", "=", "1"]
    text.encode("utf-8")


# ---- Kernel.source as documentation -----------------------------------------------------

def _tour():
    """The README's tour: loss = sum(Y * Y), Y = X W^T; the kernel of [loss, dW]."""
    X = te.placeholder((4, 5), name="X")
    W = te.placeholder((3, 5), name="W")
    k = te.reduce_axis(5, name="k")
    Y = te.compute((4, 3), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    ri, rj = te.reduce_axis(4, "ri"), te.reduce_axis(3, "rj")
    loss = te.compute((), lambda: te.sum(Y[ri, rj] * Y[ri, rj], axis=[ri, rj]), name="loss")
    res = te.differentiate(loss, [W])
    (dW,) = res
    s = codegen.create_schedule([loss, dW])
    s[res.adjoints[Y]].compute_inline()
    return codegen.build([loss, dW], [X, W], s), (X, W, Y, loss, dW)


def _assigned_but_unread(source):
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef))
    reads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return [t.id for n in ast.walk(fn) if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name) and t.id not in reads]


def test_readme_kernel_source_reads_as_documentation():
    kernel, (X, W, Y, loss, dW) = _tour()
    src = kernel.source
    driver = src[src.index("# ---- the driver"):]
    assert "# unit0(" in driver and "def kernel(" not in src
    for t in (Y, loss, dW):
        assert f"# ---- stage {t.name}: {te.tensor_str(t)}" in src
    assert "# X_: input X, shape (4, 5), float32" in src
    toks = set(_code_tokens(src))
    assert not toks & {"in0", "in1", "out0", "out1", "tmp0"}
    assert _assigned_but_unread(src) == []
    assert remove_dead_assignments(src) == src  # nothing left to remove
    x = np.random.default_rng(2).random((4, 5)).astype("float32")
    w = np.random.default_rng(3).random((3, 5)).astype("float32")
    l_val, dw = kernel(x, w)
    ref = te.evaluate([loss, dW], {X: x, W: w})
    np.testing.assert_allclose(l_val, ref[0], rtol=1e-5)
    np.testing.assert_allclose(dw, ref[1], rtol=1e-5)


# ---- dead assignments: the removal changes no value ---------------------------------------

def _run_python(program, arrays):
    """The units of ``program`` run in order as plain Python on copies of
    ``arrays`` (its buffers); ``(arrays, (unit, code))`` of the first error."""
    args = [a.copy() for a in arrays]
    err = np.zeros(2, dtype=np.int64)  # [error code, offending index]
    for k, unit in enumerate(program.units):
        g = {"prange": range}
        code = unit.module_source.replace("from numba import njit, prange", "")
        code = code.replace("@njit(", "@(lambda *a, **k: (lambda f: f))(")
        exec(compile(code, "<unit>", "exec"), g)
        # the runtime's LLVM intrinsics have no Python body: their plain meanings
        g.update(_sel=lambda c, a, b: a if c else b, _radd=lambda a, b: a + b)
        g["unit"](*[args[i] for i in unit.args], err)
        if err[0]:
            return args, (k, int(err[0]))
    return args, 0


def test_dead_assignment_removal_keeps_every_value(monkeypatch):
    """The kernels of a reduction (scalar mode, unrolled, register-blocked), a
    buffer-mode gradient with short unrolled lanes, a guarded gather with a
    run-time bounds check and a scatter-add, lowered with and without the
    removal, run as plain Python: the same values and error flags."""
    X = te.placeholder((6, 9), "X", "float64")
    W = te.placeholder((5, 9), "W", "float64")
    I = te.placeholder((4,), "I", "int64")
    k = te.reduce_axis(9, "k")
    Y = te.compute((6, 5), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    r = te.reduce_axis(6, "r")
    M = te.compute((5,), lambda j: te.max(Y[r, j], axis=r), name="M")
    G = te.compute((4, 9), lambda p, q: te.if_then_else(I[p] >= 0, X[I[p], q], 0.0), name="G")
    r2, a, b = te.reduce_axis(5, "r2"), te.reduce_axis(4, "a"), te.reduce_axis(9, "b")
    L = te.compute((), lambda: te.sum(M[r2] * M[r2], axis=r2), name="L")
    L2 = te.compute((), lambda: te.sum(G[a, b], axis=[a, b]), name="L2")
    dX, dW = te.differentiate(L, [X, W])
    (dX2,) = te.differentiate(L2, [X])
    outs, ins = [L, dX, dW, L2, dX2, G], [X, W, I]
    schedule = codegen.create_schedule(outs)
    from texpr.codegen.ir.schedule import default_materialized
    from texpr.tensor import ScatterAddOp
    mat, inl = default_materialized(schedule, None)
    for op in schedule.ops:  # as codegen.build does
        if isinstance(op, ScatterAddOp) and op.init is not None and id(op.init.op) in inl:
            inl.discard(id(op.init.op))
            mat.add(id(op.init.op))
    kept = lower_mod.lower(schedule, ins, mat, inl)
    monkeypatch.setattr(lower_mod, "remove_dead_assignments", lambda s, func="kernel": s)
    full = lower_mod.lower(schedule, ins, mat, inl)
    assert sum(len(u.module_source) for u in kept.units) < sum(
        len(u.module_source) for u in full.units)
    rng = np.random.default_rng(4)
    for idx in ([0, 5, 2, 3], [1, 6, 0, 2]):  # the second reads outside X: the flag is set
        feed = [rng.standard_normal(54), rng.standard_normal(45), np.array(idx)]
        arrays = feed + [np.full(b_.size, np.nan if b_.dtype.startswith("float") else -7, b_.dtype)
                          for b_ in full.buffers[3:]]
        got, err = _run_python(kept, arrays)
        want, err_want = _run_python(full, arrays)
        assert err == err_want and (err != 0) == (max(idx) >= 6)
        for g_, w_ in zip(got[3:], want[3:]):
            np.testing.assert_array_equal(g_, w_)


@pytest.mark.parametrize("src, n_removed", [
    # a value overwritten before any read (x = 1), and a repeated value in a loop (y = x)
    ("def kernel(a, err):\n    x = 1\n    x = 2\n    for i in range(3):\n        y = x\n"
     "        y = x\n        a[i] = y\n    return 0\n", 2),
    # a check that sets the error flag is kept even when its value is unused
    ("def kernel(a, err):\n    v = _ck(5, 3, err, 1)\n    return 0\n", 0),
    # a value read in a later iteration stays; one never read goes, leaving `pass`
    ("def kernel(a, err):\n    t = 0\n    for i in range(3):\n        if i > 0:\n"
     "            a[i] = t\n        t = i\n        u = t\n    return 0\n", 1),
    ("def kernel(a, err):\n    for i in range(3):\n        u = i\n    return 0\n", 1),
])
def test_dead_assignment_rules(src, n_removed):
    out = remove_dead_assignments(src)
    ast.parse(out)
    lines = [ln for ln in out.splitlines() if ln.strip() != "pass"]
    assert len(src.splitlines()) - len(lines) == n_removed
    g1, g2 = {"_ck": lambda i, n, e, c: i}, {"_ck": lambda i, n, e, c: i}
    exec(src, g1)
    exec(out, g2)
    a1, a2 = np.zeros(3), np.zeros(3)
    g1["kernel"](a1, None)
    g2["kernel"](a2, None)
    np.testing.assert_array_equal(a1, a2)
