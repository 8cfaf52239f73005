"""texpr.jax.op: values against jax.numpy, jit, vmap, grad, check_grads (second
order), integer inputs and feed errors. float64 runs inside jax.enable_x64 only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import texpr as te
import texpr.jax as tj

from bridge_cases import CASES, run_threads


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _dense_tanh():
    X = te.placeholder((4, 5), name="X", dtype="float64")
    W = te.placeholder((3, 5), name="W", dtype="float64")
    r = te.reduce_axis(5, name="r")
    Y = te.compute((4, 3), lambda i, j: te.tanh(te.sum(X[i, r] * W[j, r], axis=r)), name="Y")
    return tj.op(Y, [X, W])


_OPS = {}


def dense_op():
    if "dense" not in _OPS:
        _OPS["dense"] = _dense_tanh()
    return _OPS["dense"]


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal((4, 5))), jnp.asarray(rng.standard_normal((3, 5)))


def test_forward_jit_and_vmap(x64):
    f = dense_op()
    x, w = _arrays()
    ref = jnp.tanh(x @ w.T)
    np.testing.assert_allclose(f(x, w), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(jax.jit(f)(x, w), ref, rtol=1e-12, atol=1e-12)
    xs = jnp.stack([x, 2 * x])
    got = jax.vmap(f, in_axes=(0, None))(xs, w)
    np.testing.assert_allclose(got[1], jnp.tanh(2 * x @ w.T), rtol=1e-12, atol=1e-12)


def test_check_grads_second_order(x64):
    f = dense_op()
    check_grads(f, _arrays(1), order=2, modes=("rev",))


def test_jit_grad_matches_jax(x64):
    f = dense_op()
    x, w = _arrays(2)
    got = jax.jit(jax.grad(lambda a, b: (f(a, b) ** 2).sum(), argnums=(0, 1)))(x, w)
    ref = jax.grad(lambda a, b: (jnp.tanh(a @ b.T) ** 2).sum(), argnums=(0, 1))(x, w)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_integer_input_and_two_outputs(x64):
    X = te.placeholder((6, 4), name="Xg", dtype="float64")
    idx = te.placeholder((5,), name="idx", dtype="int64")
    G = te.compute((5, 4), lambda i, j: X[idx[i], j] * X[idx[i], j], name="G")
    r = te.reduce_axis(6, "r")
    S = te.compute((4,), lambda j: te.sum(X[r, j] * X[r, j], axis=r), name="S")
    f = tj.op([G, S], [X, idx])
    x = jnp.asarray(np.random.default_rng(3).standard_normal((6, 4)))
    ix = jnp.asarray([0, 3, 3, 5, 1])
    g, s = f(x, ix)
    np.testing.assert_allclose(g, x[ix] ** 2, rtol=1e-12)
    np.testing.assert_allclose(s, (x ** 2).sum(0), rtol=1e-12)
    check_grads(lambda a: f(a, ix), (x,), order=1, modes=("rev",))
    gx = jax.grad(lambda a: f(a, ix)[0].sum() + f(a, ix)[1].sum())(x)
    ref = jax.grad(lambda a: (a[ix] ** 2).sum() + (a ** 2).sum())(x)
    np.testing.assert_allclose(gx, ref, rtol=1e-12)


def test_feed_errors_are_texpr_errors(x64):
    f = dense_op()
    x, w = _arrays()
    with pytest.raises(te.FeedError, match="expects dtype float64"):
        f(x.astype(jnp.float32), w)
    with pytest.raises(te.FeedError, match=r"expects shape \(4, 5\)"):
        jax.jit(f)(x[:3], w)
    with pytest.raises(te.FeedError, match="expected 2"):
        f(x)


def test_float32_without_x64():
    X = te.placeholder((3,), name="X32")
    Y = te.compute((3,), lambda i: X[i] * X[i] + 1.0, name="Y32")
    f = tj.op(Y, [X])
    x = jnp.asarray([1.0, -2.0, 0.5], dtype=jnp.float32)
    np.testing.assert_allclose(f(x), x * x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda a: f(a).sum())(x), 2 * x, rtol=1e-6)


def test_64_bit_placeholders_without_x64_say_how_to_fix_it():
    # JAX makes numpy int64/float64 values 32-bit unless its 64-bit mode is on
    X = te.placeholder((4,), name="X64", dtype="float64")
    I = te.placeholder((2,), name="I64", dtype="int64")
    G = te.compute((2,), lambda i: X[I[i]], name="G64")
    f = tj.op(G, [X, I])
    for x, i in ((np.arange(4.0), np.array([1, 2], np.int32)),
                 (np.arange(4.0, dtype=np.float32), np.array([1, 2]))):
        with pytest.raises(te.FeedError, match="expects dtype (int|float)64.*jax_enable_x64"):
            f(x, i)
    with jax.enable_x64(True):
        np.testing.assert_array_equal(f(np.arange(4.0), np.array([1, 2])), [1.0, 2.0])


@pytest.mark.parametrize("name", sorted(te.nn.__all__))
def test_nn_operator_check_grads(name, x64):
    # the same graphs as the torch tests: their units come from the compile caches
    out, inputs, values = CASES[name]()
    f = tj.op(out, inputs)
    fixed = {j: v for j, (t, v) in enumerate(zip(inputs, values)) if t.dtype == "int64"}
    floats = [jnp.asarray(v) for t, v in zip(inputs, values) if t.dtype != "int64"]

    def g(*xs):
        it = iter(xs)
        return f(*[fixed[j] if j in fixed else next(it) for j in range(len(inputs))])

    check_grads(g, floats, order=1, modes=("rev",))
    ref = te.evaluate(out, dict(zip(inputs, values)))
    got = g(*floats)
    for a, r in zip(got if isinstance(got, tuple) else (got,),
                    ref if isinstance(ref, (list, tuple)) else (ref,)):
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-12)


def _gather_op():
    X = te.placeholder((4,), name="Xo", dtype="float64")
    I = te.placeholder((3,), name="Io", dtype="int64")
    G = te.compute((3,), lambda i: X[I[i]] * 2.0, name="Go")
    return tj.op(G, [X, I])


def test_a_kernel_error_is_raised_as_itself(x64):
    # the kernel runs inside XLA (an FFI custom call): its OutOfBoundsError comes
    # back as itself from an eager call, and under jit as JAX's runtime error naming it
    f = _gather_op()
    x = jnp.asarray([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(f(x, jnp.asarray([3, 0, 1])), [8.0, 2.0, 4.0])
    assert "jax_ffi_handler" in f.spec.cache  # the FFI path (this JAX has jax.ffi)
    assert _handler_kind(f) == "native"  # its checks report from compiled code
    with pytest.raises(te.OutOfBoundsError, match="index value 9"):
        f(x, jnp.asarray([0, 9, 1]))
    with pytest.raises(Exception, match="OutOfBoundsError.*index value -2"):
        jax.jit(f)(x, jnp.asarray([0, 1, -2])).block_until_ready()
    # the op still works after errors
    np.testing.assert_array_equal(jax.jit(f)(x, jnp.asarray([2, 2, 2])), [6.0, 6.0, 6.0])


def test_zero_d_and_empty_operands(x64):
    X = te.placeholder((0, 3), name="Xe", dtype="float64")
    s = te.placeholder((), name="s", dtype="float64")
    r = te.reduce_axis(0, "r")
    S = te.compute((3,), lambda j: te.sum(X[r, j], axis=r) + s[()], name="Se")
    E = te.compute((0, 3), lambda i, j: X[i, j] * s[()], name="Ee")
    f = tj.op([S, E], [X, s])
    x, sv = jnp.zeros((0, 3)), jnp.asarray(2.5)
    for g in (f, jax.jit(f)):
        out_s, out_e = g(x, sv)
        np.testing.assert_array_equal(out_s, [2.5, 2.5, 2.5])
        assert out_e.shape == (0, 3)
    np.testing.assert_allclose(jax.grad(lambda v: f(x, v)[0].sum())(sv), 3.0)


def test_vmap_runs_the_kernel_per_element_on_changing_buffers(x64):
    f = dense_op()
    x, w = _arrays(4)
    xs = jnp.stack([x * k for k in range(1, 6)])
    got = jax.jit(jax.vmap(f, in_axes=(0, None)))(xs, w)
    for k in range(5):
        np.testing.assert_allclose(got[k], jnp.tanh((k + 1) * x @ w.T), rtol=1e-12)


def test_pure_callback_fallback_without_jax_ffi(x64, monkeypatch):
    # JAX versions without jax.ffi get a pure_callback (copies the operands)
    monkeypatch.setattr(tj, "_has_ffi", lambda: False)
    f = _gather_op()
    x = jnp.asarray([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(jax.jit(f)(x, jnp.asarray([3, 0, 1])), [8.0, 2.0, 4.0])
    assert "jax_ffi_handler" not in f.spec.cache
    with pytest.raises(Exception, match="index value 9"):
        f(x, jnp.asarray([0, 9, 1]))


def _handler_kind(f):
    keep = f.spec.cache["jax_ffi_handler"]
    return "native" if isinstance(keep, tuple) else "python"


def test_native_handler_with_temporaries_aliased_and_repeated_outputs(x64):
    # a kernel whose units are all numba units runs from a compiled FFI handler:
    # its temporary (the row sums S) lives in the handler's own allocation; the
    # first listing of Y is written straight into XLA's result buffer, and the
    # input listed as an output and the repeated output are copied
    X = te.placeholder((3, 4), name="Xn", dtype="float64")
    j = te.reduce_axis(4, name="j")
    S = te.compute((3,), lambda i: te.sum(X[i, j], axis=j), name="Sn")
    Y = te.compute((3, 4), lambda i, k: X[i, k] - S[i] / 4.0, name="Yn")
    f = tj.op([Y, X, Y], [X])
    x = jnp.asarray(np.random.default_rng(3).standard_normal((3, 4)))
    want = x - x.mean(axis=1, keepdims=True)
    for g in (f, jax.jit(f)):
        y1, xo, y2 = g(x)
        np.testing.assert_allclose(y1, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(xo, x)
        np.testing.assert_array_equal(y2, y1)
    assert _handler_kind(f) == "native"
    assert "Sn" in f.kernel.stages
    # the backward kernel (the adjoint of a sum over three outputs) too
    gx = jax.grad(lambda v: (f(v)[0] * v).sum() + f(v)[1].sum())(x)
    np.testing.assert_allclose(gx, 2 * want + 1.0, rtol=1e-12, atol=1e-12)


def test_python_handler_when_native_is_off(x64, monkeypatch):
    # tj.NATIVE = False keeps the Python handler (ctypes) for every kernel: the
    # same values, and the kernel's error raised as itself
    monkeypatch.setattr(tj, "NATIVE", False)
    f = _gather_op()
    x = jnp.asarray([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(jax.jit(f)(x, jnp.asarray([3, 0, 1])), [8.0, 2.0, 4.0])
    assert _handler_kind(f) == "python"
    with pytest.raises(te.OutOfBoundsError, match="index value -1"):
        f(x, jnp.asarray([0, -1, 1]))


def test_a_blas_unit_keeps_the_python_handler(x64):
    # a contraction run as a GEMM is not a numba unit: no compiled handler, the
    # Python one runs it (same values)
    import fuzz
    from texpr.codegen.backends.numba_cpu.native_call import ffi_handler

    with fuzz.every_contraction_on_blas():
        f = _dense_tanh()
        x, w = _arrays(7)
        np.testing.assert_allclose(jax.jit(f)(x, w), jnp.tanh(x @ w.T), rtol=1e-12)
    assert any(u.kind == "blas" for u in f.kernel.units)
    assert ffi_handler(f.kernel, 0) is None
    assert _handler_kind(f) == "python"


def test_first_gradients_from_several_threads_build_and_register_once(x64, monkeypatch):
    # the backward function of an op first made from several threads at once: one
    # kernel build each (parallel builds ran CPython's ast.parse in two threads at
    # once: 'SystemError: AST constructor recursion depth mismatch') and one FFI
    # target per name (a second descriptor under one name would let the first be
    # freed while a program still passes its address)
    import threading
    import time
    from texpr import codegen

    real_build, built = codegen.build, []
    real_register, registered = jax.ffi.register_ffi_target, []

    def slow_build(outputs, inputs, *a, **k):
        built.append([t.name for t in outputs])
        time.sleep(0.2)  # widen the window a second thread would enter
        return real_build(outputs, inputs, *a, **k)

    def register(name, *a, **k):
        registered.append(name)
        return real_register(name, *a, **k)

    monkeypatch.setattr(codegen, "build", slow_build)
    monkeypatch.setattr(jax.ffi, "register_ffi_target", register)
    f = _dense_tanh()
    barrier, results = threading.Barrier(4), {}

    def work(seed):
        with jax.enable_x64(True):  # the setting is per thread
            x, w = _arrays(seed)
            barrier.wait()
            grad = jax.grad(lambda a, b: (f(a, b) ** 2).sum(), argnums=(0, 1))
            results[seed] = (x, w, grad(x, w))

    run_threads(work)
    assert sorted(results) == [0, 1, 2, 3]
    assert len(built) == 2, built  # the forward and the backward kernel
    assert len(registered) == len(set(registered)) == 2, registered
    for x, w, got in results.values():
        ref = jax.grad(lambda a, b: (jnp.tanh(a @ b.T) ** 2).sum(), argnums=(0, 1))(x, w)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
