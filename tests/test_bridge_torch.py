"""texpr.torch.op: values against PyTorch, gradcheck (first and second order),
torch.compile without graph breaks, errors, and a parametrised subset of te.nn."""

import time

import numpy as np
import pytest
import torch

import texpr as te
import texpr.torch as tt

from bridge_cases import CASES, run_threads


def _dense_tanh(n=4, m=3, k=5):
    X = te.placeholder((n, k), name="X", dtype="float64")
    W = te.placeholder((m, k), name="W", dtype="float64")
    r = te.reduce_axis(k, name="r")
    Y = te.compute((n, m), lambda i, j: te.tanh(te.sum(X[i, r] * W[j, r], axis=r)), name="Y")
    return Y, X, W


_DENSE = None


def dense_op():
    global _DENSE
    if _DENSE is None:
        Y, X, W = _dense_tanh()
        _DENSE = tt.op(Y, [X, W])
    return _DENSE


def _args(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
                 for s in shapes)


def test_forward_matches_torch_and_returns_a_tensor():
    f = dense_op()
    x, w = _args((4, 5), (3, 5))
    y = f(x, w)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64 and y.shape == (4, 3)
    torch.testing.assert_close(y, torch.tanh(x @ w.T), rtol=1e-12, atol=1e-12)


def test_gradcheck_first_and_second_order():
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=1)
    assert torch.autograd.gradcheck(f, (x, w))
    assert torch.autograd.gradgradcheck(f, (x, w))


def test_the_custom_op_itself_passes_gradcheck_twice():
    # torch.compile runs the registered custom op (eager calls take the lighter
    # autograd.Function path): check its autograd formula directly, both orders
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=8)

    def via_custom_op(a, b):
        return tt._kernel([a, b], f.spec.key)[0]

    assert torch.autograd.gradcheck(via_custom_op, (x, w))
    assert torch.autograd.gradgradcheck(via_custom_op, (x, w))
    with torch.no_grad():  # the no-autograd path gives the same values
        torch.testing.assert_close(f(x, w), via_custom_op(x, w), rtol=0, atol=0)


def test_backward_matches_torch_autograd():
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=2)
    head = torch.randn(4, 3, dtype=torch.float64)
    gx, gw = torch.autograd.grad(f(x, w), (x, w), head)
    rx, rw = torch.autograd.grad(torch.tanh(x @ w.T), (x, w), head)
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-12)


def test_non_contiguous_inputs_and_expanded_grad_outputs():
    f = dense_op()
    xt, w = _args((5, 4), (3, 5), seed=3)
    x = xt.T  # a transposed view: not contiguous
    y = f(x, w)
    y.sum().backward()  # grad_output is an expanded (stride-0) tensor
    rx, = torch.autograd.grad(torch.tanh(x @ w.T).sum(), (xt,))
    torch.testing.assert_close(xt.grad, rx, rtol=1e-12, atol=1e-12)


def test_torch_compile_keeps_the_op_in_one_graph():
    f = dense_op()
    x, w = _args((4, 5), (3, 5), seed=4)

    def loss(a, b):
        return (f(a, b) * 2.0).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)  # a graph break raises
    got = compiled(x, w)
    got.backward()
    ref_x, ref_w = [t.detach().clone().requires_grad_() for t in (x, w)]
    ref = (torch.tanh(ref_x @ ref_w.T) * 2.0).sum()
    ref.backward()
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-12, atol=1e-12)


def test_several_outputs_and_an_integer_input():
    # a gather by an int index tensor and a max reduction: two outputs, a tuple back
    X = te.placeholder((6, 4), name="Xg", dtype="float64")
    idx = te.placeholder((5,), name="idx", dtype="int64")
    G = te.compute((5, 4), lambda i, j: X[idx[i], j] * X[idx[i], j], name="G")
    r = te.reduce_axis(4, "r")
    M = te.compute((6,), lambda i: te.max(X[i, r], axis=r), name="M")
    f = tt.op([G, M], [X, idx])
    x, = _args((6, 4), seed=5)
    ix = torch.tensor([0, 3, 3, 5, 1])
    g, m = f(x, ix)
    torch.testing.assert_close(g, x[ix] ** 2)
    torch.testing.assert_close(m, x.max(dim=1).values)
    assert torch.autograd.gradcheck(lambda a: f(a, ix), (x,))
    # the int input gets no gradient
    ixf = ix.clone()
    out = f(x, ixf)
    gx, = torch.autograd.grad(out[0].sum() + out[1].sum(), (x,))
    assert gx.shape == x.shape


def test_contiguous_tensors_cross_without_copies():
    # the compiled driver gets the tensors' own data pointers, and the output
    # tensor's: the kernel reads and writes torch's memory
    f = dense_op()
    x, w = [t.detach() for t in _args((4, 5), (3, 5), seed=6)]
    f(x, w)
    run, specs = f.spec.cache["torch_native"]
    seen = {}

    def spy(pointers):
        seen["pointers"] = list(pointers)
        run(pointers)

    f.spec.cache["torch_native"] = (spy, specs)
    try:
        y = f(x, w)
    finally:
        f.spec.cache["torch_native"] = (run, specs)
    assert seen["pointers"] == [x.data_ptr(), w.data_ptr(), y.data_ptr()]
    np.testing.assert_allclose(y.numpy(), np.tanh(x.numpy() @ w.numpy().T), rtol=1e-12)


def test_numpy_views_without_the_compiled_driver(monkeypatch):
    # texpr.torch.NATIVE = False (and kernels the driver cannot run): the kernel's
    # Python driver on numpy views of the same memory, outputs shared back
    monkeypatch.setattr(tt, "NATIVE", False)
    Y, X, W = _dense_tanh()
    f = tt.op(Y, [X, W])
    x, w = [t.detach() for t in _args((4, 5), (3, 5), seed=6)]
    seen = {}
    run_exact = type(f.kernel).run_exact

    def spy(kernel, arrays):
        outs = run_exact(kernel, arrays)
        seen["in"], seen["out"] = [a.ctypes.data for a in arrays], [a.ctypes.data for a in outs]
        return outs

    monkeypatch.setattr(type(f.kernel), "run_exact", spy)
    y = f(x, w)
    assert f.spec.cache["torch_native"] is None
    assert seen["in"] == [x.data_ptr(), w.data_ptr()]
    assert seen["out"] == [y.data_ptr()]
    np.testing.assert_allclose(y.numpy(), np.tanh(x.numpy() @ w.numpy().T), rtol=1e-12)


@pytest.mark.parametrize("bad, message", [
    (lambda x, w: (x.float(), w), "expects dtype float64"),
    (lambda x, w: (x[:3], w), "expects shape (4, 5)"),
    (lambda x, w: (x.numpy(), w), "must be a torch tensor"),
    (lambda x, w: (x,), "expected 2 tensors"),
])
def test_feed_errors_are_texpr_errors(bad, message):
    f = dense_op()
    x, w = [t.detach() for t in _args((4, 5), (3, 5))]
    with pytest.raises(te.FeedError) as exc:
        f(*bad(x, w))
    assert message in str(exc.value)


def test_bad_construction():
    Y, X, W = _dense_tanh()
    with pytest.raises(te.TexprError, match="placeholders"):
        tt.op(Y, [Y, W])
    with pytest.raises(te.TexprError, match="twice"):
        tt.op(Y, [X, X, W])


# ---- every te.nn operator through the bridge (each compiles a forward and a
# backward kernel; tests/bridge_cases.py) ----------------------------------------------

@pytest.mark.parametrize("name", sorted(te.nn.__all__))
def test_nn_operator_gradcheck(name):
    out, inputs, values = CASES[name]()
    f = tt.op(out, inputs)
    args = tuple(torch.from_numpy(v).requires_grad_(v.dtype.kind == "f") for v in values)
    assert torch.autograd.gradcheck(f, args)
    # the forward value is the reference evaluator's
    ref = te.evaluate(out, dict(zip(inputs, values)))
    got = f(*args)
    for g, r in zip(got if isinstance(got, tuple) else (got,),
                    ref if isinstance(ref, (list, tuple)) else (ref,)):
        np.testing.assert_allclose(g.detach().numpy(), r, rtol=1e-12, atol=1e-12)


def test_strided_tensors_reach_the_kernel_dense():
    # the op and the custom op itself (what a torch.compile graph calls, which may
    # pass strided tensors) read a transposed or sliced tensor by its values
    X = te.placeholder((3, 4), name="Xs", dtype="float64")
    Y = te.compute((3, 4), lambda i, j: X[i, j] * 2.0 + j, name="Ys")
    f = tt.op(Y, [X])
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    for x in (base[:, :3].t(), base[:, ::2].t(), base.t()[::2, :]):
        assert not x.is_contiguous()
        want = x * 2 + torch.arange(4, dtype=torch.float64)
        assert torch.equal(f(x), want)
        (y,) = tt._kernel([x], f.spec.key)
        assert torch.equal(y, want)


def test_negative_bit_views_are_read_as_their_values():
    # torch marks a lazily negated view with its negative bit: memory holds -v. The
    # imag of z.conj() is one (public API), contiguous when it has one element; the
    # compiled driver reads memory, so the op must see v, as inputs and as heads
    X = te.placeholder((), name="Xneg", dtype="float64")
    V = te.placeholder((2, 1), name="Vneg", dtype="float64")
    Y = te.compute((2, 1), lambda i, j: X[()] * V[i, j] + V[i, j] * V[i, j], name="Yneg")
    f = tt.op(Y, [X, V])
    x = torch.tensor(1 + 2j, dtype=torch.complex128).conj().imag  # -2.0, neg bit
    v = torch._neg_view(torch.tensor([[3.0], [-1.5]], dtype=torch.float64))  # contiguous
    assert x.is_neg() and x.is_contiguous() and v.is_neg() and v.is_contiguous()
    xr, vr = x.resolve_neg(), v.resolve_neg()
    want = xr * vr + vr * vr
    for args in ((x, vr), (xr, v), (x, v)):  # X * V changes sign with either one
        torch.testing.assert_close(f(*args), want, rtol=0, atol=0)
        with torch.no_grad():  # the custom op (torch.compile's path)
            torch.testing.assert_close(tt._kernel(list(args), f.spec.key)[0], want,
                                       rtol=0, atol=0)
    a, b = xr.clone().requires_grad_(), vr.clone().requires_grad_()
    head = torch._neg_view(torch.tensor([[0.5], [2.0]], dtype=torch.float64))
    ga, gb = torch.autograd.grad(f(a, b), (a, b), head)
    h = head.resolve_neg()
    torch.testing.assert_close(ga, (h * vr).sum(), rtol=1e-15, atol=0)
    torch.testing.assert_close(gb, h * (xr + 2 * vr), rtol=1e-15, atol=0)


def test_non_strided_tensors_are_feed_errors():
    f = dense_op()
    x, w = [t.detach() for t in _args((4, 5), (3, 5))]
    for bad in (x.to_sparse(), x.to_sparse_csr()):
        with pytest.raises(te.FeedError, match="dense .strided. tensor"):
            f(bad, w)


def test_first_calls_from_several_threads_build_each_kernel_once(monkeypatch):
    # an op first called (and differentiated) from several threads at once: each
    # kernel is built once (building in parallel ran CPython's ast.parse in two
    # threads at once: 'SystemError: AST constructor recursion depth mismatch')
    import threading
    from texpr import codegen

    real, built = codegen.build, []

    def slow_build(outputs, inputs, *a, **k):
        built.append([t.name for t in outputs])
        time.sleep(0.2)  # widen the window a second thread would enter
        return real(outputs, inputs, *a, **k)

    monkeypatch.setattr(codegen, "build", slow_build)
    Y, X, W = _dense_tanh()
    f = tt.op(Y, [X, W])
    barrier, results = threading.Barrier(4), {}

    def work(seed):
        x, w = _args((4, 5), (3, 5), seed=seed)
        barrier.wait()
        y = f(x, w)
        results[seed] = (x, w, y, torch.autograd.grad(y.sum(), (x, w)))

    run_threads(work)
    assert sorted(results) == [0, 1, 2, 3]
    assert len(built) == 2, built  # the forward and the backward kernel
    for x, w, y, (gx, gw) in results.values():
        ref = torch.tanh(x @ w.T)
        torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
        rx, rw = torch.autograd.grad(ref.sum(), (x, w))
        torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dynamic", [None, True])
def test_torch_compile_of_a_function_taking_the_op(dynamic):
    # Dynamo makes int attributes dynamic on a recompile (dynamic=None: the second
    # op) or at once (dynamic=True): the spec's key reached the fake kernel as a
    # SymInt ('unhashable type: non-nested SymInt'); it is specialised on now
    X = te.placeholder((4, 5), name="Xc", dtype="float64")
    ops = [(tt.op(te.compute((4, 5), lambda i, j: X[i, j] * 2.0, name="Yc2"), [X]),
            lambda x: 2 * x),
           (tt.op(te.compute((4, 5), lambda i, j: X[i, j] * X[i, j], name="Ycsq"), [X]),
            lambda x: x * x)]

    def loss(op, x):
        return (op(x) * x).sum()

    compiled = torch.compile(loss, backend="aot_eager", dynamic=dynamic)
    for k, (f, ref) in enumerate(ops + ops[:1]):
        x, = _args((4, 5), seed=k)
        got = compiled(f, x)
        g, = torch.autograd.grad(got, x)
        xr = x.detach().clone().requires_grad_()
        want = (ref(xr) * xr).sum()
        gr, = torch.autograd.grad(want, xr)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, gr, rtol=1e-12, atol=1e-12)
    with pytest.raises(te.FeedError, match=r"expects shape \(4, 5\)"):
        compiled(ops[0][0], torch.ones(6, 5, dtype=torch.float64))


@pytest.mark.parametrize("transform", ["grad", "vjp", "jvp", "vmap"])
def test_torch_func_transforms_are_refused_clearly(transform):
    # the op has no rules for torch.func's transforms: they raised deep in torch
    # (setup_context, a wrapper without storage), and jvp through the custom op
    # gave zero tangents silently; now one TexprError says so
    f = dense_op()
    x, w = [t.detach() for t in _args((4, 5), (3, 5), seed=9)]
    run = {"grad": lambda: torch.func.grad(lambda a: f(a, w).sum())(x),
           "vjp": lambda: torch.func.vjp(lambda a: f(a, w), x),
           "jvp": lambda: torch.func.jvp(lambda a: f(a, w), (x,), (torch.ones_like(x),)),
           "vmap": lambda: torch.func.vmap(lambda a: f(a, w))(torch.stack([x, x]))}[transform]
    with pytest.raises(te.TexprError, match="torch.func transforms"):
        run()
    torch.testing.assert_close(f(x, w), torch.tanh(x @ w.T), rtol=1e-12, atol=1e-12)


def test_dropped_ops_and_their_backward_specs_are_released():
    # texpr.bridge.SPECS held every op's spec (and backward spec, kernels) for the
    # life of the process: 100 ops made and dropped kept 200 entries (issue 52,
    # kind 5). It holds them weakly; a recorded graph keeps its spec alive until
    # its backward has run, even when the op itself is gone
    import gc
    import weakref

    from texpr import bridge

    gc.collect()
    before = len(bridge.SPECS)
    x, w = _args((4, 5), (3, 5), seed=11)
    want_y = torch.tanh(x @ w.T)
    want = torch.autograd.grad(want_y.sum(), (x, w))
    refs = []
    for _ in range(30):
        Y, X, W = _dense_tanh()
        f = tt.op(Y, [X, W])
        y = f(x, w)
        torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(y.sum(), (x, w))
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
        refs += [weakref.ref(f.spec), weakref.ref(f.spec.backward())]
        del f, y, Y, X, W
    # an op dropped before its graph's backward: the graph keeps the spec
    Y, X, W = _dense_tanh()
    f = tt.op(Y, [X, W])
    y = f(x, w)
    kept = weakref.ref(f.spec)
    del f, Y, X, W
    gc.collect()
    assert kept() is not None
    got = torch.autograd.grad(y.sum(), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    del y, got
    gc.collect()
    assert kept() is None
    assert [r for r in refs if r() is not None] == []
    assert len(bridge.SPECS) == before
